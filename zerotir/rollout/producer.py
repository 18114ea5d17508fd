"""The rollout producer of the asynchronous pipeline: a thread with its own engine and its own copy of the weights that
generates the batches of the next RL steps while the trainer updates on this one (``model.pipeline``).

    trainer:  take(k) -> update k -> push(weights, version k) -> take(k + 1) -> ...
    producer: batch k+1 starts once its weights have version >= k - S (``zerotir.rl.staleness.may_start``), runs the
              tool loop (``agent_loop.rollout``: each trajectory on its own, scored as it ends), then batch k+2 ...

The producer generates the batches of the stream in order; which step trains on each is the trainer's: with refill
(``model.refill``) a step takes more than one, calling ``take(k)`` again for each refill batch. The capacity rule
gates a batch for the latest step that can train on it, as if every later step took one batch: the j-th batch after
the last one taken is trained at step k + j - 1 at the latest (k: the next step, or the current one while it
refills, which ``take`` says before it waits), so the rule holds whatever the steps take.

Weight pushes land between two engine steps: the engine runs behind one lock, which a push takes for as long as it
copies (``push`` returns those seconds, logged as ``time/weight_sync``), so generation stops only for the push itself.
On a GPU an engine step can return with its kernels still queued (vLLM's async scheduling, on a stream of the
producer's thread) while the push copies on the trainer's stream: the push waits for every device before the copy
and again after it (``synchronize_devices``), so no forward reads half-copied weights and the next one sees all of
them. The engine drops its cached keys / values with the push, those of running requests too: a vLLM request running
across a push is preempted and recomputes its ids under the new weights.
Each segment the engine returns is stamped with the version of the weights when it was submitted
(``Sample.version`` -> ``Trajectories.versions``); a push during a segment makes that the oldest version that may have
produced its tokens (a running request's later tokens come from the new weights), so the capacity rule stays a
guarantee. The behaviour log-probs are the engine's, whatever its
weights were, which is what the off-policy correction needs.

Validation while the producer runs goes through it too (``evaluate``: after the batch in flight, with the latest
weights), so one engine serves both. Failures are loud: an error in the producer ends the trainer's next wait with
that error and the step; a producer that makes no progress for ``producer_timeout`` seconds while the trainer waits
ends the run with a ``TimeoutError``. Nothing here imports Lightning.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from zerotir.config import ToolConfig
from zerotir.rl.staleness import StreamCursor, may_start
from zerotir.rollout.agent_loop import Reward, Schedule, rollout_sync
from zerotir.rollout.engine import Sample, SamplingParams
from zerotir.types import PromptRow, Trajectories

log = logging.getLogger(__name__)


class ProducerStopped(Exception):
    """Raised inside the producer's rollout when the pipeline closes (ends the thread quietly)."""


@dataclass
class Produced:
    """One generated training batch, waiting for its RL step."""

    step: int  # the RL step that trains on it (set by ``take``; before, the latest step the capacity rule allowed)
    batch_index: int  # its index in the training stream (the data cursor)
    rows: list[PromptRow]  # the prompt rows
    rollout: Trajectories  # scored, with per-token versions
    timings: dict[str, float] = field(default_factory=dict)  # generation, sandbox, reward, wait_for_trainer


def synchronize_devices(devices: Iterable[Any] = ()) -> None:
    """Wait until the CUDA devices among ``devices`` (the trainer's and the engine's) have run all their queued work,
    on every stream; nothing to wait for on CPU. Only those: synchronizing a device opens a CUDA context on it, which
    on every visible GPU would take memory from other processes' GPUs (issue 46, A9)."""
    for device in {torch.device(d) for d in devices}:
        if device.type == "cuda":
            torch.cuda.synchronize(device)


class VersionedEngine:
    """The producer's engine behind one lock: every call and every weight push is serialised, and each finished
    sample is stamped with the weight version of its submission. Implements the ``RolloutEngine`` protocol.
    ``synchronize`` waits for the devices' queued work around each push's copy (``synchronize_devices`` of the
    devices in use)."""

    def __init__(self, engine: Any, version: int | None, beat: Callable[[], None], stopped: Callable[[], bool],
                 synchronize: Callable[[], None]):
        self.engine, self.version = engine, version
        self._synchronize = synchronize
        self.lock = threading.Lock()
        self.context_length = engine.context_length
        self._beat, self._stopped = beat, stopped
        self._submitted: dict[Hashable, int] = {}

    def submit(self, key: Hashable, ids: list[int], params: SamplingParams) -> None:
        with self.lock:
            self.engine.submit(key, ids, params)
            self._submitted[key] = self.version

    def step(self) -> list[tuple[Hashable, Sample]]:
        if self._stopped():
            raise ProducerStopped
        with self.lock:
            out = self.engine.step()
        self._beat()
        return [(key, replace(sample, version=self._submitted[key])) for key, sample in out]

    def release(self, key: Hashable) -> None:
        with self.lock:
            self.engine.release(key)
            self._submitted.pop(key, None)

    @property
    def num_running(self) -> int:
        return self.engine.num_running

    def push(self, load: Callable[[Any], Any], version: int | None, producer_timeout: float) -> float:
        """Run ``load(engine)`` (the weight copy) between two steps and set the version (None: the one ``load``
        returns, the fleet's pushes carry theirs; it stays when that is None too); returns its seconds."""
        if not self.lock.acquire(timeout=producer_timeout):
            raise TimeoutError(f"weight push of version {version}: the producer's engine stayed busy for "
                               f"{producer_timeout:.0f} s (model.pipeline.producer_timeout); the producer is hung")
        try:
            start = time.perf_counter()
            self._synchronize()  # the engine's last forward may still be queued on its own stream
            loaded = load(self.engine)
            self._synchronize()  # the copy may still be queued on the pushing thread's stream
            self.version = version if version is not None else loaded if loaded is not None else self.version
            return time.perf_counter() - start
        finally:
            self.lock.release()

    # The rest of the protocol: the producer's pushes replace these, which the tool loop never calls.
    def update_weights(self, named_tensors: Any) -> None:
        raise RuntimeError("VersionedEngine: push weights with RolloutProducer.push (it stamps the version)")

    def load_weights_from(self, actor: Any) -> None:
        raise RuntimeError("VersionedEngine: push weights with RolloutProducer.push (it stamps the version)")

    def reset_cache(self) -> None:
        with self.lock:
            self.engine.reset_cache()

    def rest(self) -> None:
        raise RuntimeError("the producer's engine never rests: it generates while the trainer updates")


@dataclass(frozen=True)
class _Train:
    """The next job is a training batch, gated for ``step`` (the latest step that can train on it)."""

    step: int


@dataclass
class _Eval:
    prompts: list[list[int]]
    truths: list[str]
    params: SamplingParams
    done: Future = field(default_factory=Future)


class RolloutProducer:
    """Generates the training batches of RL steps ``first_step``, ``first_step + 1``, ... in a thread of its own
    under the capacity rule, and evaluation batches on request (see the module doc). ``start`` it, ``take`` each
    step's batch, ``push`` the weights after each update, ``close`` at the end.

    Args:
        engine: the producer's own engine (``RolloutEngine``), holding the weights of ``version``.
        tokenizer: the model's tokenizer.
        tool: the ``model.tool`` group.
        schedule: how the tool loop drives the engine.
        reward: scores each trajectory as it ends (``zerotir.reward.score_batch``).
        sandbox: builds the producer's sandbox client, in its thread (a client belongs to one event loop); None
            without tools.
        batches: the prompt rows of a training batch index (``PromptDataModule.train_batch``).
        params: the sampling parameters of a training batch index (each batch has its own seed).
        max_staleness: S of ``model.pipeline``.
        producer_timeout: ``model.pipeline.producer_timeout``, seconds.
        first_step: the first RL step to generate for (``rl_steps_done + 1`` on a resume).
        first_batch: its batch index (the first unconsumed batch).
        version: the version of ``engine``'s weights (updates done).
        devices: the devices in use (the trainer's, the engine's), synchronized around each push's copy.
    """

    def __init__(self, engine: Any, tokenizer: Any, tool: ToolConfig, schedule: Schedule, reward: Reward | None,
                 sandbox: Callable[[], Any] | None, batches: Callable[[int], list[PromptRow]],
                 params: Callable[[int], SamplingParams], max_staleness: int, producer_timeout: float, first_step: int,
                 first_batch: int, version: int, devices: tuple[Any, ...] = ()):
        self.tokenizer, self.tool, self.schedule, self.reward = tokenizer, tool, schedule, reward
        self.batches, self.params, self.max_staleness = batches, params, max_staleness
        self.producer_timeout = producer_timeout
        self._make_sandbox = sandbox
        self._cond = threading.Condition()
        self._ready: dict[int, Produced] = {}  # by batch index
        self._evals: collections.deque[_Eval] = collections.deque()
        self._error: tuple[str, BaseException] | None = None
        self._stop = False
        self.cursor = StreamCursor(first_step, first_batch)  # read and moved with the condition held
        self._state = "starting"
        self._beat_at = time.monotonic()
        self.engine = VersionedEngine(engine, version, self._beat, lambda: self._stop,
                                      functools.partial(synchronize_devices, devices))
        self._thread = threading.Thread(target=self._run, name="zerotir-rollout-producer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    # ------------------------------------------------------------------------------------ the trainer's side
    def take(self, step: int) -> Produced:
        """The next batch of the stream for RL step ``step`` (waiting for it): the step after the last one taken, or
        that one again for a refill batch; ``timings["wait_for_rollout"]`` is that wait."""
        start = time.perf_counter()
        with self._cond:
            index, refill = self.cursor.take(step)
            if refill:  # this batch trains at this step, not the next: the capacity rule may let one more start
                self._cond.notify_all()
            while index not in self._ready:
                self._check(f"{'a refill batch' if refill else 'the batch'} of step {step}")
                self._cond.wait(timeout=0.5)
            produced = self._ready.pop(index)
            self.cursor.handed(step)
        produced.step = step
        produced.timings["wait_for_rollout"] = time.perf_counter() - start
        return produced

    def push(self, load: Callable[[Any], Any], version: int) -> float:
        """Copy new weights into the producer's engine with ``load(engine)`` between two of its steps and set their
        version (the updates they have seen); returns the seconds generation was paused for it."""
        with self._cond:
            self._check(f"the weight push of version {version}")
        seconds = self.engine.push(load, version, self.producer_timeout)
        self._beat()
        with self._cond:
            self._cond.notify_all()  # the capacity gate may open
        return seconds

    def evaluate(self, prompts: list[list[int]], truths: list[str],
                 params: SamplingParams) -> tuple[Trajectories, dict[str, float]]:
        """Roll out an evaluation batch on the producer's engine, after the batch in flight, with the latest weights."""
        job = _Eval(prompts, truths, params)
        with self._cond:
            self._check("an evaluation batch")
            self._evals.append(job)
            self._cond.notify_all()
        while True:
            try:
                return job.done.result(timeout=0.5)
            except FutureTimeoutError:
                with self._cond:
                    self._check("an evaluation batch")

    def close(self) -> None:
        """Stop the thread (a rollout in flight ends at its next engine step) and wait for it."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=60)
            if self._thread.is_alive():
                log.warning("the rollout producer did not stop within 60 s (%s); leaving its thread", self._state)

    def _check(self, waiting_for: str) -> None:
        """Raise if the producer failed, died or hangs (called with the condition held)."""
        if self._error is not None:
            where, err = self._error
            raise RuntimeError(f"the rollout producer failed while {where} (the trainer waits for {waiting_for}): "
                               f"{type(err).__name__}: {err}") from err
        if self._stop:
            raise RuntimeError(f"the rollout producer was closed while the trainer waits for {waiting_for}")
        if not self._thread.is_alive():
            raise RuntimeError(f"the rollout producer thread ended while {self._state} (the trainer waits for "
                               f"{waiting_for})")
        idle = time.monotonic() - self._beat_at
        if idle > self.producer_timeout:
            raise TimeoutError(f"the rollout producer made no progress for {idle:.0f} s while {self._state} (the "
                               f"trainer waits for {waiting_for}; model.pipeline.producer_timeout="
                               f"{self.producer_timeout})")

    # ------------------------------------------------------------------------------------ the producer's thread
    def _beat(self) -> None:
        self._beat_at = time.monotonic()

    def _run(self) -> None:
        index = self.cursor.first_batch
        try:
            sandbox = self._make_sandbox() if self._make_sandbox is not None else None
            while True:
                job, waited = self._next_job(index)
                if job is None:
                    return
                self._beat()
                if isinstance(job, _Eval):
                    self._evaluate(job, sandbox)
                    continue
                self._state = (f"generating the batch of step {job.step} at the latest (stream batch {index}, "
                               f"weights version {self.engine.version})")
                produced = self._generate(job.step, index, sandbox)
                produced.timings["wait_for_trainer"] = waited
                with self._cond:
                    self._ready[index] = produced
                    self._cond.notify_all()
                index += 1
        except BaseException as err:  # noqa: BLE001 - handed to the trainer, which raises it with the step
            if self._stop:  # closed: the rollout in flight ended at its next step (ProducerStopped, maybe wrapped)
                return
            log.error("the rollout producer failed while %s: %r", self._state, err)
            with self._cond:
                self._error = (self._state, err)
                self._cond.notify_all()
        finally:
            with self._cond:
                for job in self._evals:
                    job.done.set_exception(RuntimeError("the rollout producer stopped before this evaluation batch"))
                self._evals.clear()

    def _next_job(self, index: int) -> tuple[_Eval | _Train | None, float]:
        """The next job: an evaluation batch if one waits, else batch ``index`` once the capacity rule lets it start
        for the latest step that can train on it; (None, 0) once closed. Also returns the seconds waited at the
        gate."""
        waited = 0.0
        with self._cond:
            while True:
                if self._stop:
                    return None, 0.0
                if self._evals:
                    return self._evals.popleft(), 0.0
                step = self.cursor.latest_step(index)
                if may_start(step, self.engine.version, self.max_staleness):
                    return _Train(step), waited
                self._state = (f"waiting for weights version {step - 1 - self.max_staleness} to start batch {index} "
                               f"for step {step} (it has {self.engine.version})")
                start = time.perf_counter()
                self._cond.wait()
                waited += time.perf_counter() - start

    def _generate(self, step: int, batch_index: int, sandbox: Any) -> Produced:
        rows = self.batches(batch_index)
        traj, timings = rollout_sync(self.engine, self.tokenizer, sandbox, [r["prompt_ids"] for r in rows],
                                     self.params(batch_index), self.tool, [r["answer"] for r in rows], self.schedule,
                                     self.reward)
        return Produced(step, batch_index, rows, traj, timings)

    def _evaluate(self, job: _Eval, sandbox: Any) -> None:
        self._state = f"generating an evaluation batch (weights version {self.engine.version})"
        try:
            out = rollout_sync(self.engine, self.tokenizer, sandbox, job.prompts, job.params, self.tool, job.truths,
                               self.schedule, self.reward)
        except BaseException as err:
            job.done.set_exception(err)
            raise
        job.done.set_result(out)
