"""The fleet's schedule: which batches of the training stream go to the engines when, and which rollouts a step
trains on.

    trainer:  take(k) -> update k -> push(version k) -> take(k + 1) -> ...
    engines:  batch i starts once the pushes have reached version latest_step(i) - 1 - S (the capacity rule,
              ``zerotir.rl.staleness.StreamCursor``); its shares go to the engines' streams

Every call's trajectories come back as prompt groups (``shares.EndedGroups``), and a step takes the first ones in
stream order: streaming (``model.hosts.max_in_flight`` > 0), among those that have ended, whatever their batch, one
over the staleness bound dropped and generated again with the newest weights (``regenerated``); batch shares (0),
only once every row before them has ended, so a step trains its own batch. Every batch samples with its rows' seeds
(``source.batch_seed``), so a share made again samples as it first did.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from zerotir.config import HostsConfig, SamplingConfig
from zerotir.fleet.hosts import FleetHosts
from zerotir.fleet.shares import Ended, EndedGroups, Submitted, collect_ended, cut_shares, merge
from zerotir.rl.staleness import StreamCursor
from zerotir.rollout.engine import SamplingParams
from zerotir.rollout.scoring import EarlyScores
from zerotir.rollout.source import TrainStream, batch_seed, sampling_params
from zerotir.types import PromptRow, Trajectories

# The longest single wait for the engines, seconds: a wait in a worker thread (``EarlyScores.wait``) then never holds
# up an interrupted trainer for longer, and the deadline is checked between two.
WAIT_SLICE_S = 1.0
Recover = Callable[[Exception, list[Submitted]], None]  # after an engine died: restart, push, submit again


class FleetSchedule:
    """The training batches on the engines and the groups that have ended (see the module doc).

    Args:
        fleet: the ``model.hosts`` group (``max_in_flight`` > 0: a share per prompt group, taken as they end; the
            bound on every wait).
        max_staleness: S of ``model.hosts``.
        sampling: the ``model.sampling`` group (training rollouts).
        seed: the run's seed (batch b samples with ``batch_seed``).
        hosts: the engines the batches go to.
    """

    def __init__(self, fleet: HostsConfig, max_staleness: int, sampling: SamplingConfig, seed: int,
                 hosts: FleetHosts):
        self.fleet, self.max_staleness, self.sampling, self.seed = fleet, max_staleness, sampling, seed
        self.hosts = hosts
        self.submitted: dict[int, Submitted] = {}  # training batches on the engines, by stream index
        self.cursor: StreamCursor | None = None  # set by the first training batch
        self.regenerated = 0  # prompt groups dropped over the staleness bound and generated again
        self.spread = 0  # the stream batches the last step's groups came from
        self._stream: TrainStream | None = None
        self._next_submit = 0  # the next batch of the stream to submit
        self._ended = EndedGroups()  # groups that have ended, not yet taken by a step

    def begin(self, step: int, stream: TrainStream | None, steps_take: str) -> None:
        """The first training batch, for ``step``: the cursor starts at the stream's first batch not consumed (as
        steps taking it as ``steps_take`` read it, ``TrainStream.train_batches``)."""
        if stream is None:
            raise ValueError("model.hosts.engines: the fleet reads the batches of the next steps from zerotir's "
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

    def ended_batch(self, step: int, index: int, size: int, version: int | None, pad: int, recover: Recover,
                    early: EarlyScores | None = None) -> tuple[list[PromptRow], Trajectories, dict[str, float]]:
        """The first ``size`` prompt groups in stream order among those that have ended (batch shares: before the
        first row still rolling out), not scored. One over the bound for ``step`` is generated again with the
        newest weights; a dead engine recovered. ``early``: each group handed over as it comes back, and scored
        while the engines are waited for (``EarlyScores.ended``, ``EarlyScores.wait``)."""
        deadline, took = time.monotonic() + self.fleet.timeout_s, {}
        doing = f"rolling out the batch of step {step} (stream batch {index})"
        while True:
            self.top_up(version)
            while len(self._ended) + len(self._waiting()) < size:
                self._submit_next()  # a resumed run's first batches lack the rows trained before its checkpoint
            for group in self._ended.stale(step, self.max_staleness):
                self.regenerated += 1
                self._submit_rows(group.row["batch_index"], [group.row])
            if self._ended.ready(size, None if self.fleet.max_in_flight else min(self._waiting(), default=None)):
                break
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the engines did not finish {doing} within {self.fleet.timeout_s:g} s "
                                   f"({self.hosts.transport.timeout_setting}): {len(self._ended)} of its {size} "
                                   "prompt groups had ended")
            wait = (self.submitted, min(left, WAIT_SLICE_S), doing, self.hosts.transport)
            ended, died = early.wait(collect_ended, *wait) if early is not None else collect_ended(*wait)
            for row, traj, timings in ended:
                self._ended.add(Ended.of(row, traj))
                if early is not None:
                    early.ended(row, traj)
                took = {key: max(took.get(key, 0.0), value) for key, value in timings.items()}
            if died is not None:
                recover(died, [])
        groups = self._ended.take(size)
        traj, timings = merge([(g.trajectories, took) for g in groups], list(range(size)), pad)
        self.spread = len({group.row["batch_index"] for group in groups})
        return [group.row for group in groups], traj, timings

    def submit(self, index: int, rows: list[PromptRow], params: SamplingParams, parts: int | None = None) -> Submitted:
        """``rows`` cut into ``parts`` shares (``shares.cut_shares``; None: one per engine), each rolled out by one
        call to its engine."""
        shares = cut_shares(rows, params, len(self.hosts), parts or len(self.hosts))
        self.hosts.submit(shares)
        return Submitted(index, rows, shares)

    def _waiting(self) -> list[tuple[int, int]]:
        """The stream rows of the training batches still rolling out."""
        return [(row["batch_index"], row["position"]) for batch in self.submitted.values() for share in batch.shares
                for row in batch.rows[share.lo:share.lo + len(share.args[0])]]

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
        already (a group generated again). Streaming, each row is a share of its own."""
        params = sampling_params(self.sampling, batch_seed(self.seed, index, 0, self.sampling.n))
        submitted = self.submit(index, rows, params, len(rows) if self.fleet.max_in_flight else None)
        held = self.submitted.setdefault(index, Submitted(index, []))
        for share in submitted.shares:
            share.lo += len(held.rows)
        held.rows, held.shares = held.rows + submitted.rows, held.shares + submitted.shares
