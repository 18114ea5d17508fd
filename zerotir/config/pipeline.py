"""Asynchronous rollouts: ``model.pipeline``, and its check against the engine of ``model.rollout``."""

from __future__ import annotations

from dataclasses import dataclass

from zerotir.config.backends import HFRollout, RolloutBackend, VLLMRollout
from zerotir.config.checks import check_min


@dataclass(frozen=True)
class PipelineConfig:
    """Asynchronous rollouts (``model.pipeline``): an engine host with its own engine and its own copy of the weights
    generates the next batches while the trainer updates on this one; without ``model.fleet.engines`` one host in a
    thread of the trainer's process (``zerotir.fleet.thread_host``), with it the fleet's Ray actors.

    Bounded staleness (AReaL's capacity rule): the batch of RL step k may start generating once the host's weights
    have seen ``k - 1 - max_staleness`` updates, so every token the trainer sees at step k (weights k - 1) is at most
    ``max_staleness`` versions old. Off-policy correction: ``model.rl.off_policy_correction``."""

    max_staleness: int | None = None
    """S. None (the default): no engine host, each step generates its batch in line with the trainer's engine. 0: a
    host that waits for every update: the synchronous schedule, the same rollouts and parameters for the same seed.
    S >= 1: the host runs up to S batches ahead of the trainer."""
    threads: int | None = None
    """Threads of the engine host in the trainer's process: a transformers engine's decode threads where
    model.rollout.init_args.num_threads is unset (a vLLM engine keeps its serving_threads); the trainer keeps torch's
    own count. None: the engine's default (one thread for a model under its size threshold)."""
    producer_device: str | None = None
    """Where the thread host's engine runs: the transformers copy of the weights, or the vLLM engine ("cuda:1": a
    GPU of its own, the trainer keeping its device); None: the trainer's device."""
    producer_timeout: float = 600.0
    """Bound on every wait for the thread host (its start, a weight copy, a batch's rollouts, counted from when the
    trainer starts to wait for it): past it the run stops with an error naming what it waited for."""

    def __post_init__(self) -> None:
        check_min("pipeline", self, ("max_staleness",), 0, " (null: in line; 0: synchronous through an engine host)")
        check_min("pipeline", self, ("threads",), 1)
        if not self.producer_timeout > 0:
            raise ValueError(f"model.pipeline.producer_timeout={self.producer_timeout}: must be > 0 seconds")
        given = [f"{k}={v!r}" for k, v in (("threads", self.threads), ("producer_device", self.producer_device)) if v]
        if given and not self.enabled:
            raise ValueError(f"model.pipeline.{', '.join(given)}: engine host settings, and max_staleness: null starts "
                             "no engine host; set model.pipeline.max_staleness (0: synchronous through one) or drop "
                             "them")

    @property
    def enabled(self) -> bool:
        """An engine host generates the batches (max_staleness is set)."""
        return self.max_staleness is not None

    def check_backend(self, backend: RolloutBackend) -> None:
        """The cross-group check with ``model.rollout``: what a thread host cannot run with fails here, naming both."""
        if not self.enabled:
            return
        if isinstance(backend, VLLMRollout) and backend.enable_sleep_mode:
            raise ValueError(f"model.pipeline.max_staleness={self.max_staleness} with model.rollout.init_args."
                             "enable_sleep_mode=true: a colocated engine that sleeps while the trainer updates cannot "
                             "generate meanwhile. Set max_staleness: null (synchronous) or enable_sleep_mode: false "
                             "with the engine on GPUs of its own")
        if backend.tensor_parallel_size > 1:
            raise ValueError(f"model.pipeline.max_staleness={self.max_staleness} with model.rollout.init_args."
                             f"tensor_parallel_size={backend.tensor_parallel_size}: the engine host drives one engine "
                             "of one process; set max_staleness: null or tensor_parallel_size: 1")
        if isinstance(backend, HFRollout) and backend.num_threads is not None and self.threads is not None:
            raise ValueError(f"model.rollout.init_args.num_threads={backend.num_threads} with model.pipeline.threads="
                             f"{self.threads}: both set the engine host's decode threads; keep one of them")
