"""Asynchronous rollouts: ``model.pipeline``, and its check against the engine of ``model.rollout``."""

from __future__ import annotations

from dataclasses import dataclass

from zerotir.config.backends import HFRollout, RolloutBackend, VLLMRollout
from zerotir.config.checks import check_min


@dataclass(frozen=True)
class PipelineConfig:
    """Asynchronous rollouts (``model.pipeline``, ``zerotir.rollout.producer``): a producer with its own engine and
    its own copy of the weights generates the next batches while the trainer updates on this one.

    Bounded staleness (AReaL's capacity rule): the batch of RL step k may start generating once the producer's
    weights have seen ``k - 1 - max_staleness`` updates, so every token the trainer sees at step k (weights k - 1) is
    at most ``max_staleness`` versions old. Off-policy correction: ``model.rl.off_policy_correction``."""

    max_staleness: int | None = None
    """S. None (the default): no producer, each step generates its batch in line with the trainer's engine. 0: a
    producer that waits for every update: the synchronous schedule, the same rollouts and parameters for the same
    seed. S >= 1: the producer runs up to S batches ahead of the trainer."""
    threads: int | None = None
    """Torch intra-op threads while the producer runs, process-wide (torch has one setting for all threads): the
    producer and the trainer each compute on this many. None: half the machine's cores (at least 1): 1 + 1 on 2 cores,
    the measured default (docs/results.md, "Asynchronous pipeline")."""
    producer_device: str | None = None
    """Where the producer's engine runs: the transformers copy of the weights, or the vLLM engine ("cuda:1": a GPU
    of its own, the trainer keeping its device); None: the trainer's device."""
    producer_timeout: float = 600.0
    """Seconds without progress (an engine step, a finished batch, a weight push) after which a producer that the
    trainer waits for is declared hung: the run stops with an error naming the step."""

    def __post_init__(self) -> None:
        check_min("pipeline", self, ("max_staleness",), 0, " (null: no producer; 0: synchronous through one)")
        check_min("pipeline", self, ("threads",), 1)
        if not self.producer_timeout > 0:
            raise ValueError(f"model.pipeline.producer_timeout={self.producer_timeout}: must be > 0 seconds")
        given = [f"{k}={v!r}" for k, v in (("threads", self.threads), ("producer_device", self.producer_device)) if v]
        if given and not self.enabled:
            raise ValueError(f"model.pipeline.{', '.join(given)}: producer settings, and max_staleness: null starts "
                             "no producer; set model.pipeline.max_staleness (0: synchronous through one) or drop them")

    @property
    def enabled(self) -> bool:
        """A producer generates the batches (max_staleness is set)."""
        return self.max_staleness is not None

    def check_backend(self, backend: RolloutBackend) -> None:
        """The cross-group check with ``model.rollout``: what a producer cannot run with fails here, naming both."""
        if not self.enabled:
            return
        if isinstance(backend, VLLMRollout) and backend.enable_sleep_mode:
            raise ValueError(f"model.pipeline.max_staleness={self.max_staleness} with model.rollout.init_args."
                             "enable_sleep_mode=true: a colocated engine that sleeps while the trainer updates cannot "
                             "generate meanwhile. Set max_staleness: null (synchronous) or enable_sleep_mode: false "
                             "with the engine on GPUs of its own")
        if backend.tensor_parallel_size > 1:
            raise ValueError(f"model.pipeline.max_staleness={self.max_staleness} with model.rollout.init_args."
                             f"tensor_parallel_size={backend.tensor_parallel_size}: the producer drives one engine of "
                             "one process; set max_staleness: null or tensor_parallel_size: 1")
        if isinstance(backend, HFRollout) and backend.num_threads is not None:
            raise ValueError(f"model.rollout.init_args.num_threads={backend.num_threads} with model.pipeline.max_"
                             f"staleness={self.max_staleness}: the producer and the trainer share torch's process-wide "
                             f"threads (model.pipeline.threads), so num_threads would be ignored; set model.pipeline."
                             f"threads: {backend.num_threads} and drop num_threads")
