"""A batch on the fleet's engines, cut into shares, and the prompt groups that have ended but are not trained yet.

Every share is one call to an engine's stream (``zerotir.fleet.stream``), and every call's trajectories come back
as the prompt groups of its rows (``collect_ended``), which a step takes from ``EndedGroups``. Streaming
(``model.hosts.max_in_flight`` > 0) every prompt group is a share of its own (one call each, spread over the engines
in turn), so the trainer learns of each group the moment it ends, and a step takes the first groups in stream order
among those that have ended instead of waiting for its batch's slowest one. Batch shares (0): one contiguous share
of a batch's prompts per engine, and a step takes its groups in stream order only, so it trains its own batch.
Either way a share's trajectories sample with the seeds of their rows in the batch: a share's seed follows its first
row's place in the stream (``position``), so a group generated again, after an engine died or in a resumed run,
samples as it first did.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from zerotir.rl.staleness import trainer_version
from zerotir.rollout.engine import SamplingParams
from zerotir.types import PromptRow, Trajectories


@dataclass
class Share:
    """One call's part of a batch: where its rows start in the batch's rows, the engine, the call's arguments and
    its Ray reference (replaced when the call is made again)."""

    lo: int
    engine: int
    args: tuple[list[list[int]], list[str], SamplingParams]
    ref: Any = None


@dataclass
class Submitted:
    """One batch on the engines: its rows and its shares not yet collected."""

    index: int  # the batch's index in the training stream; -1 for an evaluation batch
    rows: list[PromptRow]
    shares: list[Share] = field(default_factory=list)


def cut_shares(rows: list[PromptRow], params: SamplingParams, engines: int, parts: int) -> list[Share]:
    """``rows`` cut into ``parts`` contiguous shares (their calls not made yet), share k on engine k mod
    ``engines``: ``engines`` parts give one share per engine, ``len(rows)`` one per prompt group. Trajectory k of a
    call samples with ``params.seed + k``, so a share whose first row is at stream ``position`` p (an evaluation
    row, without one: at ``lo``) gets ``params.seed + p * n``: the seeds of the whole batch rolled out at once."""
    bounds = [round(len(rows) * k / parts) for k in range(parts + 1)]
    shares = []
    for k, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        if hi > lo:
            offset = rows[lo].get("position", lo)
            seeded = params if params.seed is None else replace(params, seed=params.seed + offset * params.n)
            part = rows[lo:hi]
            shares.append(Share(lo, k % engines, ([r["prompt_ids"] for r in part], [r["answer"] for r in part],
                                                  seeded)))
    return shares


@dataclass
class Ended:
    """A prompt group that has ended: its row, its ``n`` trajectories (group id 0; rewards not yet given) and the
    oldest weight version among its sampled tokens."""

    row: PromptRow
    trajectories: Trajectories
    oldest: int

    @property
    def key(self) -> tuple[int, int]:
        """Its place in the training stream: (batch index, position)."""
        return self.row["batch_index"], self.row["position"]

    @classmethod
    def of(cls, row: PromptRow, trajectories: Trajectories) -> Ended:
        if trajectories.versions is None:
            raise ValueError(f"prompt group {row['batch_index']}/{row['position']}: its tokens carry no weight "
                             "versions; the engine that generated it had no push")
        sampled = trajectories.versions[trajectories.action_mask.bool()]
        oldest = int(sampled.min()) if sampled.numel() else 1 << 62  # nothing sampled: never stale
        if oldest < 0:
            raise ValueError(f"prompt group {row['batch_index']}/{row['position']}: a sampled token has no weight "
                             "version (-1); the engine that generated it had no push")
        return cls(row, trajectories, oldest)


class EndedGroups:
    """The prompt groups that have ended and that no step took yet; a step takes the first of them in stream
    order (the oldest prompts first, so the fewest go stale), and drops those over the staleness bound."""

    def __init__(self) -> None:
        self._groups: dict[tuple[int, int], Ended] = {}

    def __len__(self) -> int:
        return len(self._groups)

    def add(self, group: Ended) -> None:
        """A group that ended.

        Raises:
            ValueError: a group of that stream row is waiting already (it would train twice).
        """
        if group.key in self._groups:
            raise ValueError(f"prompt group {group.key} ended twice: one stream row is generated once at a time")
        self._groups[group.key] = group

    def stale(self, step: int, max_staleness: int) -> list[Ended]:
        """Remove and return the groups RL step ``step`` cannot train: a token older than ``max_staleness`` updates
        (a version below ``trainer_version(step) - max_staleness``)."""
        floor = trainer_version(step) - max_staleness
        old = [g for g in self._groups.values() if g.oldest < floor]
        for group in old:
            del self._groups[group.key]
        return old

    def ready(self, count: int, before: tuple[int, int] | None = None) -> bool:
        """Whether ``count`` groups have ended (``before`` given: ``count`` that come before that stream row, the
        first still rolling out, so a step takes the first rows in stream order only)."""
        if before is None:
            return len(self._groups) >= count
        return sum(key < before for key in self._groups) >= count

    def take(self, count: int) -> list[Ended]:
        """Remove and return the first ``count`` groups in stream order.

        Raises:
            ValueError: fewer than ``count`` are waiting.
        """
        if count > len(self._groups):
            raise ValueError(f"EndedGroups.take({count}): only {len(self._groups)} groups have ended")
        keys = sorted(self._groups)[:count]
        return [self._groups.pop(key) for key in keys]

    def clear(self) -> None:
        self._groups.clear()


def collect_ended(submitted: dict[int, Submitted], timeout_s: float, doing: str,
                  transport: Any) -> tuple[list[tuple[PromptRow, Trajectories, dict[str, float]]], Exception | None]:
    """The calls of ``submitted`` that have ended, waiting up to ``timeout_s`` for the first: each prompt group's
    row, trajectories (group id 0) and its call's timings, and the ``EngineDied`` of a dead engine among them (None:
    none died; its shares stay, to be made again once it is restarted). The shares collected leave ``submitted``,
    and a batch with none left leaves it too.

    ``transport``: the hosts' (``zerotir.fleet.transport.Transport``), which waits on the calls.

    Raises:
        TimeoutError, RuntimeError: as the transport's ``get`` (a call that raised).
    """
    from zerotir.fleet.cluster import EngineDied

    pending = [(batch, share) for batch in submitted.values() for share in batch.shares]
    out, died = [], None
    for k in transport.ready([share.ref for _, share in pending], timeout_s):
        batch, share = pending[k]
        try:
            traj, timings = transport.get([share.ref], timeout_s, doing, [share.engine])[0]
        except EngineDied as exc:
            died = exc
            continue
        batch.shares = [other for other in batch.shares if other is not share]
        for j in range(len(share.args[0])):  # the call's prompt groups, one by one
            group = traj.select(traj.group_ids == j)
            group.group_ids = group.group_ids - j
            out.append((batch.rows[share.lo + j], group, timings))
    for index in [index for index, batch in submitted.items() if not batch.shares]:
        del submitted[index]
    return out, died


def merge(parts: list[tuple[Trajectories, dict[str, float]]], offsets: list[int],
          pad: int) -> tuple[Trajectories, dict[str, float]]:
    """The calls' trajectories as one batch, in order, each part's group ids shifted by its offset (its first row
    in the batch), and the timings of the slowest call: they ran side by side."""
    timings = {"generation": 0.0, "sandbox": 0.0}
    for (traj, took), offset in zip(parts, offsets):
        traj.group_ids = traj.group_ids + offset
        for key in timings:
            timings[key] = max(timings[key], took.get(key, 0.0))
    return Trajectories.cat([traj for traj, _ in parts], pad), timings

