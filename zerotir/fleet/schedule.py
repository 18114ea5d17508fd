"""The fleet's schedule: which batches of the training stream go to the engines when, and which rollouts a step
trains on.

    trainer:  take(k) -> update k -> push(version k) -> take(k + 1) -> ...
    engines:  batch i starts once the pushes have reached version latest_step(i) - 1 - S (the capacity rule,
              ``zerotir.rl.staleness.StreamCursor``); batch shares one at a time, or streamed group by group

Batch shares: a step takes its own batch, whole. Streaming: a step takes the first prompt groups in stream order
among those that have ended, whatever their batch (``shares.EndedGroups``); one over the staleness bound is dropped
and generated again with the newest weights (``regenerated``). Every batch samples with its rows' seeds
(``source.batch_seed``), so a share made again samples as it first did.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from zerotir.config import FleetConfig, SamplingConfig
from zerotir.fleet.hosts import FleetHosts
from zerotir.fleet.shares import Ended, EndedGroups, Submitted, collect_ended, cut_shares, merge
from zerotir.rl.staleness import StreamCursor
from zerotir.rollout.engine import SamplingParams
from zerotir.rollout.source import TrainStream, batch_seed, sampling_params
from zerotir.types import PromptRow, Trajectories

Recover = Callable[[Exception, list[Submitted]], None]  # after an engine died: restart, push, submit again


class FleetSchedule:
    """The training batches on the engines and the groups that have ended (see the module doc).

    Args:
        fleet: the ``model.fleet`` group (``max_in_flight`` > 0: streaming; the bound on every wait).
        max_staleness: S of ``model.pipeline``.
        sampling: the ``model.sampling`` group (training rollouts).
        seed: the run's seed (batch b samples with ``batch_seed``).
        hosts: the engines the batches go to.
    """

    def __init__(self, fleet: FleetConfig, max_staleness: int, sampling: SamplingConfig, seed: int,
                 hosts: FleetHosts):
        self.fleet, self.max_staleness, self.sampling, self.seed = fleet, max_staleness, sampling, seed
        self.hosts = hosts
        self.streaming = fleet.max_in_flight > 0
        self.submitted: dict[int, Submitted] = {}  # training batches on the engines, by stream index
        self.cursor: StreamCursor | None = None  # set by the first training batch
        self.regenerated = 0  # streaming: prompt groups dropped over the staleness bound and generated again
        self.spread = 0  # streaming: the stream batches the last step's groups came from
        self._stream: TrainStream | None = None
        self._next_submit = 0  # the next batch of the stream to submit
        self._ended = EndedGroups()  # streaming: groups that have ended, not yet taken by a step

    def begin(self, step: int, stream: TrainStream | None, steps_take: str) -> None:
        """The first training batch, for ``step``: the cursor starts at the stream's first batch not consumed (as
        steps taking it as ``steps_take`` read it, ``TrainStream.train_batches``)."""
        if stream is None:
            raise ValueError("model.fleet.engines: the fleet reads the batches of the next steps from zerotir's "
                             "PromptDataModule (train_batch); use it as the run's datamodule")
        index = next(stream.train_batches(steps_take))[0]["batch_index"]
        self._stream, self.cursor, self._next_submit = stream, StreamCursor(step, index), index

    def take(self, step: int) -> int:
        """The index of the stream batch ``step`` takes now (a refill: ``step`` again, the next one)."""
        return self.cursor.take(step)[0]

    def top_up(self, version: int | None) -> None:
        """Submit every next batch of the stream the capacity rule lets start with the engines' weights."""
        while self.cursor.may_start(self._next_submit, version, self.max_staleness):
            self._submit_next()

    def own_batch(self, step: int, index: int, pad: int,
                  recover: Recover) -> tuple[list[PromptRow], Trajectories, dict[str, float]]:
        """Batch shares: batch ``index`` itself, collected (not scored)."""
        submitted = self.submitted.pop(index)
        traj, timings = self.hosts.collect(submitted, f"the batch of step {step} (stream batch {index})", pad,
                                           recover)
        return submitted.rows, traj, timings

    def ended_batch(self, step: int, size: int, version: int | None, pad: int,
                    recover: Recover) -> tuple[list[PromptRow], Trajectories, dict[str, float]]:
        """Streaming: the first ``size`` prompt groups in stream order among those that have ended, not scored. One
        over the bound for ``step`` is generated again with the newest weights; a dead engine recovered."""
        deadline, took = time.monotonic() + self.fleet.timeout_s, {}
        while True:
            self.top_up(version)
            while len(self._ended) + sum(len(b.shares) for b in self.submitted.values()) < size:
                self._submit_next()  # a resumed run's first batches lack the rows trained before its checkpoint
            for group in self._ended.stale(step, self.max_staleness):
                self.regenerated += 1
                self._submit_rows(group.row["batch_index"], [group.row])
            if len(self._ended) >= size:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"step {step}: {len(self._ended)} of its {size} prompt groups had ended within "
                                   f"{self.fleet.timeout_s:g} s (model.fleet.timeout_s)")
            ended, died = collect_ended(self.submitted, left, f"rolling out the groups of step {step}",
                                        self.hosts.transport)
            for row, traj, timings in ended:
                self._ended.add(Ended.of(row, traj))
                took = {key: max(took.get(key, 0.0), value) for key, value in timings.items()}
            if died is not None:
                recover(died, [])
        groups = self._ended.take(size)
        traj, timings = merge([(g.trajectories, took) for g in groups], list(range(size)), pad)
        self.spread = len({group.row["batch_index"] for group in groups})
        return [group.row for group in groups], traj, timings

    def submit(self, index: int, rows: list[PromptRow], params: SamplingParams, per_group: bool = False) -> Submitted:
        """``rows`` cut into shares (``shares.cut_shares``), each rolled out by one call to its engine."""
        shares = cut_shares(rows, params, len(self.hosts), per_group)
        self.hosts.submit(shares)
        return Submitted(index, rows, shares)

    def clear(self) -> None:
        """Forget the batches on the engines (closed: they were never trained)."""
        self.submitted.clear()
        self._ended.clear()

    def _submit_next(self) -> None:
        """Submit the rows of the stream's next batch that no step trained (``TrainStream.train_batch``)."""
        self._submit_rows(self._next_submit, self._stream.train_batch(self._next_submit))
        self._next_submit += 1

    def _submit_rows(self, index: int, rows: list[PromptRow]) -> None:
        """Submit ``rows`` of training batch ``index``, held until collected beside the shares of that batch held
        already (streaming: a group generated again)."""
        params = sampling_params(self.sampling, batch_seed(self.seed, index, 0, self.sampling.n))
        submitted = self.submit(index, rows, params, self.streaming)
        held = self.submitted.setdefault(index, Submitted(index, []))
        for share in submitted.shares:
            share.lo += len(held.rows)
        held.rows, held.shares = held.rows + submitted.rows, held.shares + submitted.shares
