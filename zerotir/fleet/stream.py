"""The rollouts of one engine host, streamed (``model.hosts.max_in_flight``): prompt groups are admitted as room
frees up, each group leaves the moment its last sample ends, and weight pushes land between two
engine steps while the trajectories in flight go on. Every request brings its own sampling settings, so a greedy
evaluation group decodes beside the training groups in flight.

    trainer -> submit(jobs)          groups wait in the inbox
    thread:    admit while the trajectories in flight stay within max_in_flight (each frees its room the moment it
               ends, and the next waiting group starts then); every group is a tool loop of its
               own (``agent_loop.rollout`` over ``EngineShare``: its own keys on the one engine), all stepping the
               one engine together; a group that ends goes to the outbox
    trainer -> take(jobs)            the groups of a batch, as soon as each has ended
    trainer -> push(receive, ...)    between two engine steps (``VersionedEngine``), while the groups in flight wait

So an engine never waits for the slowest trajectory of a batch: while it runs, the groups of the next batches that
the capacity rule already let in take the free room. Each segment of a trajectory is stamped with the version of
the weights when it was submitted (``VersionedEngine``), the oldest that may have produced its tokens, so the
staleness bound the trainer checks stays a guarantee. A group in flight that a push leaves over that bound (a
segment older than the push's version minus ``max_staleness``: it could train at no later step) is aborted in the
engine at the next step and queued again first, so it is generated anew with fresh weights (``zerotir.fleet.hub``).
A group samples with the seeds it would have in a batch (the trainer gives each group its batch's seed offset by its
row), so with vLLM, which seeds every request, its trajectories do not depend on what else runs beside it.

A batch share is a stream too: with ``max_in_flight`` 0 every job is a whole share (all its prompts one tool loop,
as the in-line rollout runs them) admitted alone, once the one before it has ended, so a share samples as it would
in line while pushes still land between engine steps.

Everything runs in one thread with one event loop (the tool loops, the host's tools, the engine's steps); the
trainer's calls come from other threads (a Ray actor with concurrent calls) and meet it through one condition.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace
from typing import Any

from zerotir.config import ToolConfig
from zerotir.rollout.agent_loop import Schedule, rollout
from zerotir.fleet.hub import EngineHub
from zerotir.rollout.engine import RolloutEngine, SamplingParams
from zerotir.fleet.versioned import RolloutsStopped, VersionedEngine, synchronize_devices
from zerotir.tools.registry import Toolbox
from zerotir.types import Trajectories

log = logging.getLogger(__name__)


@dataclass
class Job:
    """Prompts to roll out as one tool loop: one prompt group (streaming) or a whole share, seeded as in its
    batch."""

    key: Hashable
    prompts: list[list[int]]
    truths: list[str]
    params: SamplingParams  # n samples per prompt; the seed of the job's first row in its batch

    @property
    def size(self) -> int:
        return len(self.prompts) * self.params.n


@dataclass
class _Done:
    trajectories: Trajectories | None
    error: BaseException | None = None
    timings: dict[str, float] | None = None  # the tool loop's (``agent_loop.rollout``)


@dataclass
class StreamStats:
    """What the stream did so far: wall seconds since it started, seconds with at least one trajectory in flight,
    trajectory-seconds in flight (their integral over time), the seconds with at least one job waiting in the inbox
    (work there was, admitted or not: room full, a push pausing admission, or the thread not yet at its next turn)
    and the trajectory-seconds in flight during those, groups done, and the groups aborted at a push over the
    staleness bound (``zerotir.fleet.hub``) with the tokens their finished segments had sampled (wasted)."""

    wall: float = 0.0
    busy: float = 0.0
    trajectory_seconds: float = 0.0
    waiting: float = 0.0
    trajectory_seconds_waiting: float = 0.0
    groups: int = 0
    aborted_groups: int = 0
    aborted_tokens: int = 0


class GroupStream:
    """The streaming loop of one engine process (see the module doc): its own thread, started at once.

    Args:
        engine: the process's engine (``RolloutEngine``), with the folder's weights (version None) until a push.
        tokenizer: the model's tokenizer.
        tool: the ``model.tool`` group.
        schedule: how each group's tool loop drives the engine.
        tools: the host's started toolbox (``zerotir.tools.Toolbox``), shared by every group's tool loop.
        max_in_flight: trajectories in flight at most (a job larger than that runs alone); 0: every job alone.
        device: the engine's device, synchronized around each push's copy (``versioned.synchronize_devices``).
        max_staleness: S of ``model.hosts``: at a push of version V, a group in flight with a segment older than
            V - S is aborted and queued again first (``zerotir.fleet.hub``); None: none is.
        clock: the seconds the stats count (``stats``); a test gives its own to know exactly what elapsed.
    """

    def __init__(self, engine: RolloutEngine, tokenizer: Any, tool: ToolConfig, schedule: Schedule,
                 tools: Toolbox, max_in_flight: int, device: str = "cpu", max_staleness: int | None = None,
                 clock: Callable[[], float] = time.monotonic):
        if max_in_flight < 0:
            raise ValueError(f"GroupStream(max_in_flight={max_in_flight}): >= 1 to stream groups, or 0 for one job "
                             "at a time (model.hosts.max_in_flight)")
        self.tokenizer, self.tool, self.schedule, self.max_in_flight = tokenizer, tool, schedule, max_in_flight
        self.tools, self.max_staleness = tools, max_staleness
        self._cond = threading.Condition()
        self._inbox: list[Job] = []
        self._outbox: dict[Hashable, _Done] = {}
        self._in_flight = 0  # trajectories admitted that have not ended
        self._tasks: set[asyncio.Task] = set()  # the tool loops running (the stream's thread alone touches it)
        self._queued = self._finished = 0  # jobs submitted, and those that have ended (done, failed or stopped)
        self._paused = False  # a push waits for the jobs before it (max_in_flight 0): none admitted meanwhile
        self._stop = False
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the thread's, once it runs (``_wake_thread``)
        self._wake: asyncio.Event | None = None
        self._clock = clock
        self._stats, self._since = StreamStats(), clock()
        self.engine = VersionedEngine(engine, None, lambda: None, lambda: self._stop,
                                      functools.partial(synchronize_devices, (device,)))
        self._thread = threading.Thread(target=self._run, name="zerotir-fleet-stream", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------------------------- the callers' side
    def submit(self, jobs: list[Job]) -> None:
        """Queue ``jobs``; they start as room frees up, in order."""
        with self._cond:
            self._check("queueing prompt groups")
            self._account()  # the time before counts with the inbox as it was
            self._inbox.extend(jobs)
            self._queued += len(jobs)
            self._cond.notify_all()
            self._wake_thread()

    def take(self, keys: list[Hashable], timeout_s: float) -> list[Trajectories]:
        """The trajectories of the groups ``keys`` (in that order), waiting at most ``timeout_s`` for the last
        (``take_timed`` without the timings)."""
        return [traj for traj, _ in self.take_timed(keys, timeout_s)]

    def take_timed(self, keys: list[Hashable], timeout_s: float) -> list[tuple[Trajectories, dict[str, float]]]:
        """The trajectories of the jobs ``keys`` (in that order) and their tool loops' timings (seconds), waiting at
        most ``timeout_s`` for the last.

        Raises:
            RuntimeError: a group's tool loop failed (its error), or the stream failed or was closed.
            TimeoutError: a group had not ended within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not all(k in self._outbox for k in keys):
                self._check("waiting for prompt groups")
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [k for k in keys if k not in self._outbox]
                    raise TimeoutError(f"prompt groups {missing[:4]}{'...' if len(missing) > 4 else ''} had not "
                                       f"ended within {timeout_s:g} s ({self._in_flight} trajectories in flight, "
                                       f"{len(self._inbox)} groups waiting; model.hosts.timeout_s)")
                self._cond.wait(timeout=min(left, 1.0))
            done = [self._outbox.pop(k) for k in keys]
        for key, got in zip(keys, done):
            if got.error is not None:
                raise RuntimeError(f"prompt group {key}: {type(got.error).__name__}: {got.error}") from got.error
        return [(got.trajectories, got.timings) for got in done]

    def push(self, load: Callable[[Any], int | None], timeout_s: float) -> int | None:
        """``load(engine)`` between two engine steps (a weight push; it returns the push's version, None when the
        sender stopped, which leaves the version as it was); the groups in flight go on with the new weights. With
        ``max_in_flight`` 0 (whole shares, one at a time) it lands after the jobs submitted before it, as a call
        made after theirs, and none starts meanwhile. Returns what ``load`` returned."""
        if not self.max_in_flight:
            self._pause_after_queued(timeout_s)
        loaded: list[int | None] = []
        try:
            self.engine.push(lambda engine: loaded.append(load(engine)) or loaded[0], None, timeout_s)
        finally:
            with self._cond:
                self._paused = False
                self._cond.notify_all()
                self._wake_thread()
        return loaded[0]

    def _pause_after_queued(self, timeout_s: float) -> None:
        """Wait until the jobs submitted so far have ended, then admit none until the push is done."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            target = self._queued
            while self._finished < target:
                self._check("waiting to push weights after the rollouts before it")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"weight push: the rollouts submitted before it had not ended within "
                                       f"{timeout_s:g} s (model.hosts.timeout_s)")
                self._cond.wait(timeout=min(left, 1.0))
            self._paused = True

    def stats(self) -> StreamStats:
        """Wall, busy, waiting and trajectory-seconds since the stream started, and groups done."""
        with self._cond:
            self._account()
            return replace(self._stats)

    def close(self) -> None:
        """Stop the thread (the groups in flight end at their next engine step) and wait for it."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
            self._wake_thread()
        self._thread.join(timeout=60)

    def _wake_thread(self) -> None:
        """Have the stream's thread look at the inbox at its next turn (with the condition held): between two
        engine steps, not at its next poll."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    def _check(self, doing: str) -> None:
        if self._error is not None:
            raise RuntimeError(f"the engine's rollout stream failed (while {doing}): {type(self._error).__name__}: "
                               f"{self._error}") from self._error
        if self._stop or not self._thread.is_alive():
            raise RuntimeError(f"the engine's rollout stream is closed (while {doing})") from RolloutsStopped()

    def _fits(self, job: Job) -> bool:
        """Whether ``job`` may start now (with the condition held): no push pauses admission, and nothing runs or
        it fits within ``max_in_flight``."""
        if self._paused:
            return False
        return not self._in_flight or self._in_flight + job.size <= self.max_in_flight

    def _account(self) -> None:
        """Add the time since the last call to the stats (with the condition held), counted with the trajectories in
        flight and the inbox as they were over that time: every change to either calls this first."""
        now = self._clock()
        elapsed, self._since = now - self._since, now
        self._stats.wall += elapsed
        if self._in_flight:
            self._stats.busy += elapsed
            self._stats.trajectory_seconds += elapsed * self._in_flight
        if self._inbox:
            self._stats.waiting += elapsed
            self._stats.trajectory_seconds_waiting += elapsed * self._in_flight

    # ------------------------------------------------------------------------------------------ the thread
    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as err:  # noqa: BLE001 - handed to the callers, who raise it
            if not self._stop:
                log.error("the engine's rollout stream failed: %r", err)
                with self._cond:
                    self._error = err
                    self._cond.notify_all()

    async def _main(self) -> None:
        """Admit what fits, then wait for a group to end or for a caller's wake (a submit, a push's end, close)."""
        hub = EngineHub(self.engine, self.max_staleness)
        wake = asyncio.Event()
        with self._cond:
            self._loop, self._wake = asyncio.get_running_loop(), wake
        try:
            while True:
                wake.clear()  # before looking: a wake from here on is seen by the wait below
                with self._cond:
                    if self._stop:
                        break
                self._admit(hub)
                waiter = asyncio.ensure_future(wake.wait())
                done, _ = await asyncio.wait({*self._tasks, waiter}, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                done.discard(waiter)
                self._tasks -= done  # not the pending set: a trajectory's end may have admitted groups meanwhile
                for task in done:  # a group's own errors are in its outcome; this raises only the stream's
                    if not task.cancelled():  # cancelled: aborted at a push as it ended, queued again already
                        task.result()
        finally:
            with self._cond:
                self._loop = None
            for task in self._tasks:
                task.cancel()

    def _admit(self, hub: EngineHub) -> None:
        """Start every waiting job that fits now, in order, each a tool loop of its own on the event loop."""
        with self._cond:
            while not self._stop and self._inbox and self._fits(self._inbox[0]):
                self._account()
                job = self._inbox.pop(0)
                self._in_flight += job.size
                self._tasks.add(asyncio.ensure_future(self._group(job, hub)))

    async def _group(self, job: Job, hub: EngineHub) -> None:
        """One group's tool loop on its share of the engine; its outcome to the outbox, or, aborted at a push,
        the group back at the head of the inbox (its tokens counted as wasted). Streaming, each trajectory frees
        its room the moment it ends, and the next waiting job that fits starts at once; a whole share
        (``max_in_flight`` 0) holds its room until it ends, so it runs alone."""
        share = hub.share()
        share.task = asyncio.current_task()
        freed = 0

        def on_end(key: int, row: object) -> None:
            nonlocal freed
            freed += 1
            with self._cond:
                self._account()
                self._in_flight -= 1
            self._admit(hub)

        try:
            traj, timings = await rollout(share, self.tokenizer, None, job.prompts, job.params, self.tool,
                                          job.truths, self.schedule, self.tools, on_end if self.max_in_flight else None)
            done = None if share.aborted else _Done(traj.to("cpu"), timings=timings)
        except BaseException as exc:  # noqa: BLE001 - sorted by _failed
            done = self._failed(exc, share.aborted)
        finally:
            hub.drop(share)
            with self._cond:
                self._account()
                self._in_flight -= job.size - freed
                self._finished += not share.aborted
                self._cond.notify_all()
        if done is None:
            self._requeue(job, share.tokens)
            return
        with self._cond:
            self._outbox[job.key] = done
            self._stats.groups += 1
            self._cond.notify_all()

    def _failed(self, exc: BaseException, aborted: bool) -> _Done | None:
        """What a tool loop's exception means: None for a group aborted at a push (queued again), else its
        failure, raised by ``take``; raised again when the stream stops (``RolloutsStopped``) or cancels it."""
        if aborted and not self._stop:
            return None
        if not isinstance(exc, Exception) or isinstance(exc, RolloutsStopped):
            raise exc
        if self._stop:
            raise RolloutsStopped from exc
        return _Done(None, exc)

    def _requeue(self, job: Job, tokens: int) -> None:
        """An aborted group back at the head of the inbox, generated again with the newest weights."""
        with self._cond:
            self._account()
            self._inbox.insert(0, job)
            self._stats.aborted_groups += 1
            self._stats.aborted_tokens += tokens
            self._cond.notify_all()
        log.info("prompt group %s aborted at a push (a segment over model.hosts.max_staleness=%s), %d sampled tokens "
                 "wasted; queued again", job.key, self.max_staleness, tokens)
