"""The training ranks' side of the fleet: rank 0 drives it for every rank of a multi-process trainer.

With several training processes (Lightning DDP, DeepSpeed ZeRO-1/2/3, on one node or several) one fleet serves them
all, and only rank 0 talks to it: rank 0 starts the cluster and the engine processes, submits each step's *global*
batch, scores it and pushes the weights. The other ranks follow rank 0 over the trainer's own process group:

    rank 0:        ("push", v) -> its gathers + the broadcast to the engines ... ("done") -> scatter the parts
    other ranks:   follow(): join each push's gathers (sending nothing)     ... until "done" -> receive their part

A push is announced before it starts because under ZeRO-3 every rank holds a shard of each parameter: gathering a
bucket is a collective of all ranks (``zerotir.parallel.weight_sync``), so every rank must run the same gathers in the
same order while only rank 0's receiver (the ``WeightSender``) sends. Pushes happen where rank 0 decides (the first
batch, an evaluation before any training batch, a restarted engine's recovery), which is why the other ranks wait
on messages rather than on a fixed schedule. Without ZeRO-3 the followers' gathers read their own parameters in place
and cost nothing.

A failure on rank 0 inside a fleet call (an engine past its restarts, a timeout) is announced as ("failed",
message) before rank 0 raises it, so every rank stops with it instead of waiting in its next collective. Each rank's
part of a batch is its ``shard_prompts`` share of the global batch: the rows an in-line rank reads for itself, their
trajectories with group ids counted from the share's first row, as an in-line rank would have them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist

from zerotir.rollout.source import RolloutBatch
from zerotir.rollout.tp_group import own_trajectories
from zerotir.parallel.distributed import gather_objects, rank_and_world_size
from zerotir.parallel.weight_sync import Bucket

_PUSH, _DONE, _FAILED = "push", "done", "failed"


class TrainerRanks:
    """This process's place among the training ranks, read from the default process group when built (after the
    trainer set it up). A single process is its own leader and every call is local."""

    def __init__(self) -> None:
        self.rank, self.world = rank_and_world_size()

    @property
    def lead(self) -> bool:
        """Whether this rank drives the fleet (rank 0)."""
        return self.rank == 0

    @property
    def several(self) -> bool:
        return self.world > 1

    def announce_push(self, version: int) -> None:
        """On rank 0, before a push: the other ranks join its gathers (``follow``)."""
        if self.several:
            _broadcast((_PUSH, version))

    @contextlib.contextmanager
    def leading(self) -> Iterator[None]:
        """Rank 0 around one fleet call: the other ranks follow it until "done", or stop with its failure."""
        try:
            yield
        except BaseException as exc:
            if self.several:
                with contextlib.suppress(Exception):  # the group itself may be what failed
                    _broadcast((_FAILED, f"{type(exc).__name__}: {exc}"))
            raise
        if self.several:
            _broadcast((_DONE, None))

    def follow(self, on_push: Callable[[int], None]) -> None:
        """On ranks >= 1: run ``on_push(version)`` for every push rank 0 announces, until it is done.

        Raises:
            RuntimeError: rank 0's fleet call failed (its error in the message).
        """
        while True:
            kind, value = _broadcast(None)
            if kind == _PUSH:
                on_push(value)
            elif kind == _DONE:
                return
            elif kind == _FAILED:
                raise RuntimeError(f"rank {self.rank}: the rollout fleet failed on rank 0: {value}")
            else:
                raise RuntimeError(f"rank {self.rank}: unexpected fleet message {kind!r} from rank 0")

    def scatter(self, parts: list[Any] | None) -> Any:
        """Rank 0's ``parts[r]`` on every rank r (``parts`` is None on the others); ``parts[0]`` alone."""
        if not self.several:
            return parts[0]
        out: list[Any] = [None]
        dist.scatter_object_list(out, parts if self.lead else None, src=0)
        return out[0]

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""
        return gather_objects(obj)


class Discard:
    """A following rank's receiver of a push's buckets (``sync_weights``): it joins the gathers and keeps nothing."""

    def update_weights(self, named_tensors: Bucket) -> None:
        pass


def _broadcast(message: tuple[str, Any] | None) -> tuple[str, Any]:
    box = [message]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def split_batch(batch: RolloutBatch, counts: list[int], n: int) -> list[RolloutBatch]:
    """A global batch's part for each rank: rank r's ``counts[r]`` rows, consecutive in rank order, and their
    trajectories (prompt i's ``n`` samples are rows ``i * n .. i * n + n - 1`` of ``batch.trajectories``), group ids
    counted from the part's first row.

    Raises:
        ValueError: the counts do not add up to the batch's rows, or the trajectories are not ``n`` per row.
    """
    traj = batch.trajectories
    if sum(counts) != len(batch.rows) or len(traj) != len(batch.rows) * n:
        raise ValueError(f"split_batch: {len(batch.rows)} rows with {len(traj)} trajectories cannot be split into "
                         f"{counts} rows of {n} samples")
    parts, lo = [], 0
    for count in counts:
        part = own_trajectories(traj, slice(lo, lo + count), len(batch.rows), n)
        part.group_ids = part.group_ids - lo
        parts.append(RolloutBatch(batch.rows[lo: lo + count], part, dict(batch.timings), list(batch.sandbox),
                                  batch.taken))
        lo += count
    return parts
