"""The ranks of one tensor-parallel vLLM engine share one request stream, decided by the group's first rank.

With ``tensor_parallel_size`` = tp > 1 each engine spans tp ranks (vLLM's ``external_launcher``: every rank holds a
shard and runs its own ``vllm.LLM``), and vLLM requires all of them to submit the *same* requests in the same order.
The tool loop cannot guarantee that on its own: which rows join a round, and what the sandbox returned, depend on each
rank's own timing and sandbox. So one rank decides: the group's leader (its lowest rank) runs the tool loop with its
sandbox and, with each ``engine.step``, broadcasts the submits and releases made since the previous step; the other ranks
only replay them and the step on their engine shards (their outputs are the same and are dropped) until the leader
broadcasts the finished trajectories, which every rank of the group then returns. Validation, whose batches come from a
``DistributedSampler`` (different rows on every rank), first merges the group's rows (``share_rows``) so that the
group rolls out one batch and each rank keeps its own part.

Groups are consecutive ranks ``[g * tp, (g + 1) * tp)``, as ``zerotir.parallel.distributed.shard_prompts`` and vLLM's
tensor-parallel groups over the torch world lay them out. Without a process group, or with tp = 1, nothing is shared.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch.distributed as dist

from zerotir.parallel.distributed import rank_and_world_size, training_share
from zerotir.types import Trajectories

T = TypeVar("T")
_STEP, _DONE, _FAILED = "step", "done", "failed"


class TensorParallelGroup:
    """This rank's tensor-parallel group. A collective to build: every rank creates one, at the same point.

    Args:
        tensor_parallel_size: ranks per engine; must divide the world size.
    """

    def __init__(self, tensor_parallel_size: int):
        rank, world = rank_and_world_size()
        if tensor_parallel_size < 1 or world % tensor_parallel_size:
            raise ValueError(f"tensor_parallel_size={tensor_parallel_size} must divide the number of ranks {world} "
                             "(model.rollout.init_args.tensor_parallel_size vs trainer.devices x trainer.num_nodes)")
        self.size = tensor_parallel_size
        self.rank = rank
        self.leader = rank - rank % tensor_parallel_size
        self.group: Any = None
        if tensor_parallel_size > 1 and world > 1:
            for start in range(0, world, tensor_parallel_size):  # every rank creates every group, in order
                group = dist.new_group(list(range(start, start + tensor_parallel_size)))
                if start == self.leader:
                    self.group = group

    @property
    def shared(self) -> bool:
        """Whether this rank's engine is shared with other ranks."""
        return self.group is not None

    @property
    def is_leader(self) -> bool:
        return self.rank == self.leader

    def training_share(self, group_ids: Any) -> Any:
        """Which of the group's (identical) trajectories this rank trains on (``scale.distributed.training_share``)."""
        return training_share(group_ids, self.rank, self.size)

    def _broadcast(self, message: Any) -> Any:
        box = [message]
        dist.broadcast_object_list(box, src=self.leader, group=self.group)
        return box[0]

    def share_rows(self, rows: Sequence[T]) -> tuple[list[T], slice]:
        """The group's rows (every rank's ``rows``, in rank order) and the slice of them that are this rank's."""
        if not self.shared:
            return list(rows), slice(0, len(rows))
        parts: list[Any] = [None] * self.size
        dist.all_gather_object(parts, list(rows), group=self.group)
        start = sum(len(p) for p in parts[: self.rank - self.leader])
        return [row for part in parts for row in part], slice(start, start + len(rows))

    def rollout(self, engine: Any, run: Callable[[Any], T]) -> T:
        """``run(engine)`` (the tool loop) on the leader, its engine calls replayed on the other ranks; every rank of
        the group returns the leader's result. An error on the leader is raised on every rank of the group.

        Args:
            engine: this rank's engine (a shard of the group's).
            run: the rollout, called on the leader only with an engine that broadcasts its calls with each step.
        """
        if not self.shared:
            return run(engine)
        if self.is_leader:
            leader = _LeaderEngine(engine, self)
            try:
                result = run(leader)
            except Exception as exc:
                self._broadcast((_FAILED, f"{type(exc).__name__}: {exc}"))
                raise
            self._broadcast((_DONE, result, leader.take_calls()))
            return result
        while True:
            kind, *payload = self._broadcast(None)
            if kind == _STEP:
                _replay(engine, payload[0])
                engine.step()  # the same step as the leader's; its output is the same
            elif kind == _DONE:
                _replay(engine, payload[1])  # the releases after the last step
                return payload[0]
            else:
                raise RuntimeError(f"the rollout failed on rank {self.leader}, the leader of this rank's "
                                   f"tensor-parallel group: {payload[0]}")


def own_trajectories(traj: Trajectories, own: slice, group_rows: int, n: int) -> Trajectories:
    """This rank's trajectories of a rollout over a group's merged rows (``share_rows``): prompt i's ``n`` samples
    are rows ``i * n .. i * n + n - 1``. ``traj`` itself when the rows were this rank's alone."""
    if own == slice(0, group_rows):
        return traj
    return traj.select(list(range(own.start * n, own.stop * n)))


class _LeaderEngine:
    """The leader's engine inside the tool loop: submits and releases go to its engine at once and to the group with
    the next step (one broadcast per step)."""

    def __init__(self, engine: Any, group: TensorParallelGroup):
        self.engine = engine
        self.tp = group
        self.context_length = engine.context_length
        self.calls: list[tuple] = []

    def submit(self, key: Any, ids: list[int], params: Any) -> None:
        self.engine.submit(key, ids, params)
        self.calls.append(("submit", key, ids, params))

    def release(self, key: Any) -> None:
        self.engine.release(key)
        self.calls.append(("release", key))

    @property
    def num_running(self) -> int:
        return self.engine.num_running

    def step(self) -> Any:
        self.tp._broadcast((_STEP, self.take_calls()))
        return self.engine.step()

    def take_calls(self) -> list[tuple]:
        calls, self.calls = self.calls, []
        return calls


def _replay(engine: Any, calls: list[tuple]) -> None:
    """Make the leader's submits and releases on this rank's engine shard."""
    for name, *args in calls:
        if name == "submit":
            engine.submit(*args)
        else:
            engine.release(*args)
