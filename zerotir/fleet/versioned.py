"""An engine whose weights change while it generates: every call and every weight push behind one lock, so a push
lands between two engine steps, and each finished sample stamped with the weight version of its submission.

On a GPU an engine step can return with its kernels still queued (vLLM's async scheduling, on a stream of the
host's thread) while the push copies on another thread's stream: the push waits for the devices in use before the
copy and again after it (``synchronize_devices``), so no forward reads half-copied weights and the next one sees all
of them. The engine drops its cached keys / values with the push, those of running requests too: a vLLM request
running across a push is preempted and recomputes its ids under the new weights. A segment a push lands in keeps the
version it was submitted with, the oldest that may have produced its tokens, so the staleness bound stays a
guarantee (``zerotir.rl.staleness``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import replace
from typing import Any

import torch

from zerotir.rollout.engine import EngineWeights, RolloutEngine, Sample, SamplingParams


class RolloutsStopped(Exception):
    """Raised inside a rollout at its next engine step once its host closes (ends the rollout quietly)."""


def synchronize_devices(devices: Iterable[Any] = ()) -> None:
    """Wait until the CUDA devices among ``devices`` (the trainer's and the engine's) have run all their queued work,
    on every stream; nothing to wait for on CPU. Only those: synchronizing a device opens a CUDA context on it, which
    on every visible GPU would take memory from other processes' GPUs."""
    for device in {torch.device(d) for d in devices}:
        if device.type == "cuda":
            torch.cuda.synchronize(device)


class VersionedEngine:
    """An engine behind one lock (see the module doc): a ``GenerationEngine`` for the tool loop, whose weights
    change only through ``push`` (it stamps the version), never through the engine's weights half.

    Args:
        engine: the engine (``RolloutEngine``); ``push`` hands it to the weight copy.
        version: the version of its weights now (None: the folder's).
        beat: called after every engine step (progress).
        stopped: whether the rollouts should stop (the next step raises ``RolloutsStopped``).
        synchronize: waits for the devices' queued work around each push's copy (``synchronize_devices``).
    """

    def __init__(self, engine: RolloutEngine, version: int | None, beat: Callable[[], None], stopped: Callable[[], bool],
                 synchronize: Callable[[], None]):
        self.engine, self.version = engine, version
        self._synchronize = synchronize
        self.lock = threading.Lock()
        self.context_length = engine.context_length
        self._beat, self._stopped = beat, stopped
        self._submitted: dict[Hashable, int] = {}

    def submit(self, key: Hashable, ids: list[int], params: SamplingParams) -> int | None:
        """Submit request ``key``; returns the version it is stamped with (that of the weights now)."""
        with self.lock:
            self.engine.submit(key, ids, params)
            self._submitted[key] = self.version
            return self.version

    def step(self) -> list[tuple[Hashable, Sample]]:
        if self._stopped():
            raise RolloutsStopped
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

    def push(self, load: Callable[[EngineWeights], Any], version: int | None, timeout_s: float) -> float:
        """Run ``load(engine)`` (the weight copy) between two steps and set the version (None: the one ``load``
        returns, the fleet's pushes carry theirs; it stays when that is None too); returns its seconds."""
        if not self.lock.acquire(timeout=timeout_s):
            raise TimeoutError(f"weight push of version {version}: the engine stayed busy for {timeout_s:.0f} s "
                               "(model.hosts.timeout_s); the engine is hung")
        try:
            start = time.perf_counter()
            self._synchronize()  # the engine's last forward may still be queued on its own stream
            loaded = load(self.engine)
            self._synchronize()  # the copy may still be queued on the pushing thread's stream
            self.version = version if version is not None else loaded if loaded is not None else self.version
            return time.perf_counter() - start
        finally:
            self.lock.release()
