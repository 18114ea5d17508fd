"""Per-GPU memory plan of a colocated RL run: actor, critic, reference and vLLM on the same GPUs, from parameter counts.
The command line is ``python -m zerotir.parallel.memory_plan_cli`` (flags, or the settings of a run config).

Two phases share each GPU. *Rollout*: vLLM is awake and holds its whole budget (``gpu_memory_utilization`` x GPU
memory: weights, activations and CUDA graphs, and the KV cache in what is left), while the training states stay where
DeepSpeed keeps them. *Update*: vLLM sleeps (KV cache dropped; weights copied to CPU at level 1, the LoRA engine's
level, dropped at level 2) and the training states plus activations use the GPU. A plan fits when both phase totals
stay below the GPU memory.

Accounting (P = parameters of a trained model, N = data-parallel GPUs = gpus x nodes, bf16 mixed precision with Adam,
as DeepSpeed does it; numbers are per GPU):
    params     2P (ZeRO-2, replicated) or 2P/N (ZeRO-3); 0 on the GPU with ZeRO-3 parameter offload (on the CPU).
    grads      2P/N bf16 partition, kept allocated; during the update also the 4P/N fp32 gradient partition the
               optimizer reads (on the CPU with optimizer offload).
    optimizer  12P/N: fp32 master weights, Adam m and v (on the CPU with optimizer offload).
    ZeRO-3 gathered working set (update): the layer being computed plus the prefetched one, or the embedding /
               LM head when that is larger, in bf16.
    reference  frozen bf16 weights, no optimizer state: 2P, or 2P/N partitioned under ZeRO-3; only with kl_coef > 0.
Activations (update, rough; bf16; flash attention, so no seq x seq scores; a micro-batch of T tokens: b sequences
of s tokens, or with ``max_tokens_per_micro_batch`` the budget, T = max(budget, s): a longer sequence is alone):
    per layer and token 2 * (8h + 2kv + 4i) bytes are kept for the backward pass (norm inputs and outputs, q, k, v,
    attention output, residual; the MLP's gate, up, activation and product). With gradient checkpointing only each
    layer's input (2h bytes per token) is kept, plus one layer's full set while it is recomputed.
    logits: T * V * ``logit_bytes`` (default 18: bf16 logits 2, their fp32 copy for the log-probs 4, and the
    fp32 log-softmax, probabilities and product 12 of the entropy, as ``zerotir.rl.update`` computes them); with
    ``logprob_chunk_tokens`` C the LM head runs C tokens at a time (``zerotir.rl.chunked_logprobs``), so the row is
    min(C, T) * V * ``logit_bytes``.
    Actor and critic activations add: one backward runs through ``policy_loss + vf_coef * value_loss``.
Fixed assumptions (flags): ``overhead_gib`` for the CUDA context, NCCL buffers and allocator slack; vLLM's activation
peak plus CUDA graphs ``vllm_overhead_gib`` (vLLM measures the real figure when it starts); ``vllm_sleep_gib`` left on
the GPU while vLLM sleeps; ``sync_bucket_mb`` for the bucket size of the weight sync.
Weight sync (rollout): one gathered bucket in bf16. A bucket holds whole layers and never splits one
(``zerotir.parallel.weight_sync.plan_buckets``), so the peak is ``max(sync_bucket_mb, the largest layer)``; for Qwen2.5 that
is the embedding / LM head (vocab x hidden: about 1.0 GiB for 7B, 1.45 GiB for 32B), not the 256 MiB bucket.
The longest sequence a layout fits (``longest_seq_len``): the largest ``seq_len`` at which both phases fit and one
engine's KV cache holds at least one sequence of that length; the longest response is that less ``prompt_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from zerotir.parallel.architecture import Architecture

GIB = 1 << 30
MIB = 1 << 20


def sleep_level(lora_rank: int | None) -> Literal[1, 2]:
    """vLLM's sleep level of an engine in sleep mode (``VLLMEngine.rest``): 1 (weights copied to CPU memory and
    restored on wake) when it serves a LoRA adapter, whose pushes never resend the base; 2 (weights freed) for full
    weights, which every push rewrites."""
    return 1 if lora_rank is not None else 2


@dataclass(frozen=True)
class PlanSettings:
    """How a run is laid out over its GPUs (see the module docstring for what each number feeds).

    Args:
        gpus: GPUs per node.
        nodes: nodes.
        zero: DeepSpeed ZeRO stage, 2 or 3; 0: no DeepSpeed (a LoRA run only: everything replicated per GPU).
        offload_optimizer: fp32 master weights, Adam states and fp32 gradients live in CPU memory.
        offload_params: bf16 parameter partitions live in CPU memory (ZeRO-3 only).
        critic: train a critic (PPO).
        reference: keep a frozen reference model (kl_coef > 0).
        micro_batch_size: sequences per forward / backward.
        max_tokens_per_micro_batch: token budget of a micro-batch instead of micro_batch_size (model.rl's); None =
            micro_batch_size sequences.
        logprob_chunk_tokens: tokens per LM-head chunk of the log-probs (model.rl's); None = the full logits.
        seq_len: tokens per sequence (prompt + response).
        prompt_tokens: the prompt part of seq_len (the longest-response line subtracts it).
        gradient_checkpointing: recompute activations in the backward pass.
        lora_rank: LoRA RL (``model.base.lora.rank``; ``lora_rows``): the bf16 base frozen, adapters of this rank on
            the 7 projections of every layer trained in float32; the reference is the base (no copy). None: full
            fine-tuning.
        vllm_tp: vLLM tensor-parallel size (GPUs per engine).
        gpu_memory_utilization: share of each GPU's memory vLLM may use while awake.
        gpu_mem_gib: memory of one GPU.
        samples_per_step: prompts x samples per prompt of one RL step (for the per-engine load line); 0 = unknown.
        logit_bytes: activation bytes per logit (see the module docstring).
        overhead_gib: CUDA context, NCCL buffers, allocator slack per GPU.
        vllm_overhead_gib: vLLM activation peak and CUDA graphs per GPU.
        vllm_sleep_gib: what a sleeping vLLM engine still holds per GPU.
        vllm_sleep_level: 1 (weights copied to CPU memory and restored on wake) or 2 (weights dropped: full
            fine-tuning, where the weight sync overwrites them after every update anyway); None: the engine's own
            choice, ``sleep_level``. Level 2 under LoRA is refused: the push carries the adapter only.
        sync_bucket_mb: one gathered bucket of the weight sync.
    """

    gpus: int = 8
    nodes: int = 1
    zero: Literal[0, 2, 3] = 3
    offload_optimizer: bool = False
    offload_params: bool = False
    critic: bool = False
    reference: bool = False
    micro_batch_size: int = 1
    max_tokens_per_micro_batch: int | None = None
    logprob_chunk_tokens: int | None = None
    seq_len: int = 9216
    prompt_tokens: int = 1024
    gradient_checkpointing: bool = True
    lora_rank: int | None = None
    vllm_tp: int = 1
    gpu_memory_utilization: float = 0.5
    gpu_mem_gib: float = 80.0
    samples_per_step: int = 0
    logit_bytes: int = 18
    overhead_gib: float = 2.0
    vllm_overhead_gib: float = 2.0
    vllm_sleep_gib: float = 1.0
    vllm_sleep_level: Literal[1, 2] | None = None
    sync_bucket_mb: float = 256.0

    def __post_init__(self) -> None:
        for name, value in (("gpus", self.gpus), ("nodes", self.nodes), ("micro_batch_size", self.micro_batch_size),
                            ("seq_len", self.seq_len), ("vllm_tp", self.vllm_tp), ("logit_bytes", self.logit_bytes),
                            ("max_tokens_per_micro_batch", _or_one(self.max_tokens_per_micro_batch)),
                            ("logprob_chunk_tokens", _or_one(self.logprob_chunk_tokens))):
            if value < 1:
                raise ValueError(f"{name}={value}: must be >= 1")
        if self.prompt_tokens < 0:
            raise ValueError(f"prompt_tokens={self.prompt_tokens}: must be >= 0")
        if self.zero not in (0, 2, 3):
            raise ValueError(f"zero={self.zero}: the plan covers ZeRO stages 2 and 3, and 0 (no DeepSpeed) for LoRA")
        if self.zero == 0 and self.lora_rank is None:
            raise ValueError("zero=0 (no DeepSpeed) is planned for LoRA runs only (lora_rank set): full fine-tuning "
                             "needs DeepSpeed's fp32 master weights for bf16 (zero=2 or 3)")
        if self.lora_rank is not None and self.lora_rank < 1:
            raise ValueError(f"lora_rank={self.lora_rank}: must be >= 1 (or None: full fine-tuning)")
        if self.lora_rank is not None and self.vllm_sleep_level == 2:
            raise ValueError(f"vllm_sleep_level=2 with lora_rank={self.lora_rank}: level 2 frees vLLM's weights and a "
                             "LoRA push sends the adapter only, so the engine would decode with the adapter on freed "
                             "memory; the engine sleeps at level 1 under LoRA (base copied to CPU memory). Set "
                             "vllm_sleep_level 1, or leave it unset")
        if self.offload_params and self.zero != 3:
            raise ValueError("offload_params=True needs zero=3 (ZeRO-2 keeps full parameters on every GPU)")
        if not 0 < self.gpu_memory_utilization < 1:
            raise ValueError(f"gpu_memory_utilization={self.gpu_memory_utilization}: must be in (0, 1)")
        if self.gpus % self.vllm_tp:
            raise ValueError(f"vllm_tp={self.vllm_tp} must divide gpus={self.gpus} (an engine stays inside a node)")

    @property
    def sleep_level(self) -> Literal[1, 2]:
        """The level vLLM sleeps at during the update: ``vllm_sleep_level``, or the engine's (``sleep_level``)."""
        return self.vllm_sleep_level or sleep_level(self.lora_rank)

    @property
    def world_size(self) -> int:
        return self.gpus * self.nodes

    @property
    def micro_batch_tokens(self) -> int:
        """Tokens of one micro-batch: the budget (or one longer sequence alone), else micro_batch_size sequences."""
        if self.max_tokens_per_micro_batch is not None:
            return max(self.max_tokens_per_micro_batch, self.seq_len)
        return self.micro_batch_size * self.seq_len

    @property
    def logit_tokens(self) -> int:
        """Tokens whose logits exist at once: one LM-head chunk, or the whole micro-batch."""
        tokens = self.micro_batch_tokens
        return tokens if self.logprob_chunk_tokens is None else min(self.logprob_chunk_tokens, tokens)


def _or_one(value: int | None) -> int:
    """An optional count for the ``>= 1`` check: None (the setting is off) passes."""
    return 1 if value is None else value


@dataclass(frozen=True)
class Row:
    """One component: bytes per GPU while vLLM rolls out and during the update, and CPU bytes per node."""

    component: str
    rollout: float
    update: float
    cpu_per_node: float = 0.0
    note: str = ""


def trained_model_rows(label: str, params: int, s: PlanSettings, enabled: bool = True) -> list[Row]:
    """Params, grads and optimizer states of a trained model (actor or critic) under ZeRO with ``s``."""
    if not enabled:
        return [Row(f"{label}: params + grads + optimizer", 0, 0, 0, "not used")]
    n, g = s.world_size, s.gpus
    p_gpu = 0.0 if s.offload_params else (2 * params if s.zero != 3 else 2 * params / n)
    p_cpu = 2 * params / n * g if s.offload_params else 0.0
    fp32_grad = 4 * params / n
    optim = 12 * params / n
    grads_update = 2 * params / n + (0.0 if s.offload_optimizer else fp32_grad)
    optim_gpu = 0.0 if s.offload_optimizer else optim
    optim_cpu = (optim + fp32_grad) * g if s.offload_optimizer else 0.0
    where = "CPU" if s.offload_optimizer else "GPU"
    return [
        Row(f"{label}: params (bf16)", p_gpu, p_gpu, p_cpu, f"ZeRO-{s.zero}" + (", offloaded" if p_cpu else "")),
        Row(f"{label}: grads (bf16 + fp32 partition)", 2 * params / n, grads_update, 0.0,
            f"fp32 grads on {where} during the step"),
        Row(f"{label}: optimizer (fp32 master, Adam m, v)", optim_gpu, optim_gpu, optim_cpu,
            "offloaded" if s.offload_optimizer else "partitioned"),
    ]


def lora_params(arch: Architecture, rank: int) -> int:
    """Adapter parameters of rank ``rank`` on q, k, v, o, gate, up and down of every layer: rank x (in + out)."""
    h, q, kv, i = arch.hidden_size, arch.q_dim, arch.kv_dim, arch.intermediate_size
    return rank * arch.num_layers * (7 * h + 2 * q + 2 * kv + 3 * i)


def lora_rows(label: str, params: int, arch: Architecture, s: PlanSettings, enabled: bool = True) -> list[Row]:
    """A LoRA model (``s.lora_rank``): its frozen bf16 base (``params``; partitioned under ZeRO-3, offloadable) and
    its adapters, trained in float32 (weights 4, grads 4, Adam m and v 8 bytes each; replicated: they are small).
    The critic's is a value head's backbone with adapters of its own (``model.base.lora.critic: adapters``)."""
    if not enabled:
        return [Row(f"{label}: frozen base + adapters", 0, 0, 0, "not used")]
    base = 2 * params / (s.world_size if s.zero == 3 else 1)
    on_gpu = 0.0 if s.offload_params else base
    adapters = 16 * lora_params(arch, s.lora_rank)
    return [Row(f"{label}: frozen base (bf16)", on_gpu, on_gpu, base * s.gpus if s.offload_params else 0.0,
                f"ZeRO-{s.zero}" if s.zero else "no DeepSpeed"),
            Row(f"{label}: adapters (fp32 + grads + Adam)", adapters, adapters, 0.0,
                f"rank {s.lora_rank}: {lora_params(arch, s.lora_rank) / 1e6:.1f}M parameters")]


def activation_bytes(arch: Architecture, s: PlanSettings) -> float:
    """Layer activations kept for one micro-batch's backward pass through one model (see the module docstring)."""
    tokens = s.micro_batch_tokens
    h = arch.hidden_size
    full_layer = 2 * (8 * h + 2 * arch.kv_dim + 4 * arch.intermediate_size) * tokens
    if s.gradient_checkpointing:
        return arch.num_layers * 2 * h * tokens + full_layer
    return arch.num_layers * full_layer


def logits_bytes(arch: Architecture, s: PlanSettings) -> float:
    """The actor's logits and what the log-probs and entropy make of them: ``logit_tokens x V x logit_bytes``."""
    return s.logit_tokens * arch.vocab_size * s.logit_bytes


def vllm_rows(arch: Architecture, s: PlanSettings) -> list[Row]:
    """vLLM's weights, working memory and KV cache (rollout) and what it keeps while asleep (update)."""
    budget = s.gpu_memory_utilization * s.gpu_mem_gib * GIB
    weights = 2 * arch.num_params / s.vllm_tp
    work = s.vllm_overhead_gib * GIB
    kv = budget - weights - work
    engines_per_node = s.gpus // s.vllm_tp
    # Level 1 keeps a CPU copy of the weights (LoRA: the push sends the adapter only); level 2 drops them (the full
    # weight sync rewrites them after each update).
    cpu = 2 * arch.num_params * engines_per_node if s.sleep_level == 1 else 0.0
    return [
        Row("vLLM: weights (bf16)", weights, 0.0, cpu,
            f"TP {s.vllm_tp}; " + ("on CPU while asleep" if cpu else "dropped while asleep, re-synced")),
        Row("vLLM: activations + CUDA graphs", work, 0.0, 0.0, "assumed"),
        Row("vLLM: KV cache", kv, 0.0, 0.0, "rest of the vLLM budget" if kv > 0 else "NEGATIVE: budget too small"),
        Row(f"vLLM: asleep (level {s.sleep_level})", 0.0, s.vllm_sleep_gib * GIB, 0.0, "assumed"),
    ]


def zero3_working_set(arch: Architecture, s: PlanSettings) -> float:
    """bf16 parameters ZeRO-3 gathers at once: two layers (current + prefetch), or the embedding / LM head."""
    if s.zero != 3:
        return 0.0
    return 2 * max(2 * arch.layer_params, arch.embedding_params)


def sync_bucket_bytes(arch: Architecture, s: PlanSettings) -> float:
    """Peak bf16 bytes one weight-sync bucket gathers: the bucket size, or the largest layer when that is larger (a
    bucket never splits a layer: the embedding and the LM head are layers of their own)."""
    return max(s.sync_bucket_mb * MIB, 2 * max(arch.layer_params, arch.embedding_params))


def plan_rows(arch: Architecture, s: PlanSettings) -> list[Row]:
    """Every component of the plan, in table order (totals are added by ``totals``)."""
    gathered = zero3_working_set(arch, s)
    ref = 2 * arch.num_params / (s.world_size if s.zero == 3 else 1)
    loaded = s.reference and s.lora_rank is None  # under LoRA the reference is the actor's base, adapters off
    ref_gpu = 0.0 if (s.offload_params or not loaded) else ref
    ref_cpu = ref * s.gpus if (s.offload_params and loaded) else 0.0
    ref_note = "frozen, no optimizer state" if loaded else f"not loaded (kl_coef = 0); would be {ref / GIB:.1f}"
    if s.lora_rank is not None:
        ref_note = "the actor's base with its adapters off: no copy"
        rows = lora_rows("actor", arch.num_params, arch, s) + lora_rows("critic", arch.critic_params, arch, s, s.critic)
    else:
        rows = trained_model_rows("actor", arch.num_params, s)
        rows += trained_model_rows("critic", arch.critic_params, s, enabled=s.critic)
    rows += [
        Row("ZeRO-3 gathered params", 0.0, gathered, 0.0,
            "2 layers or the LM head" if s.zero == 3 else f"ZeRO-{s.zero}: none" if s.zero else "none"),
        Row("reference (bf16)", ref_gpu, ref_gpu, ref_cpu, ref_note),
        Row("activations: actor", 0.0, activation_bytes(arch, s), 0.0, _tokens_note(s)),
        Row("logits: actor (log-probs, entropy)", 0.0, logits_bytes(arch, s), 0.0,
            f"{s.logit_tokens} tokens x {arch.vocab_size} x {s.logit_bytes} bytes"
            + (" (LM head in chunks)" if s.logprob_chunk_tokens is not None else "")),
        Row("activations: critic", 0.0, activation_bytes(arch, s) if s.critic else 0.0, 0.0,
            "" if s.critic else "not used"),
        *vllm_rows(arch, s),
        Row("weight-sync bucket", sync_bucket_bytes(arch, s), 0.0, 0.0,
            "largest of bucket, layer, embedding / LM head"),
        Row("CUDA context, NCCL, slack", s.overhead_gib * GIB, s.overhead_gib * GIB, 0.0, "assumed"),
    ]
    return rows


def _tokens_note(s: PlanSettings) -> str:
    """What one micro-batch holds: ``b x s`` tokens, or the token budget."""
    if s.max_tokens_per_micro_batch is None:
        held = f"{s.micro_batch_size} x {s.seq_len} tokens"
    else:
        held = f"{s.micro_batch_tokens} tokens (budget {s.max_tokens_per_micro_batch})"
    return held + (", checkpointed" if s.gradient_checkpointing else "")


def fits(arch: Architecture, s: PlanSettings) -> bool:
    """Both phases within the GPU's memory, and one engine's KV cache holds a sequence of ``seq_len`` tokens."""
    rows = plan_rows(arch, s)
    total = totals(rows)
    kv = next(r.rollout for r in rows if r.component == "vLLM: KV cache")
    gpu = s.gpu_mem_gib * GIB
    return total.rollout <= gpu and total.update <= gpu and kv // arch.kv_cache_bytes_per_token(s.vllm_tp) >= s.seq_len


def longest_seq_len(arch: Architecture, s: PlanSettings, limit: int = 1 << 22) -> int:
    """The largest ``seq_len`` (prompt included, at most ``limit``) at which ``s`` fits, by bisection (memory grows
    with the length); 0 when not even one token fits."""
    low, high = 0, limit  # low: the longest length known to fit (0: none yet)
    while low < high:
        mid = (low + high + 1) // 2
        if fits(arch, replace(s, seq_len=mid)):
            low = mid
        else:
            high = mid - 1
    return low


def totals(rows: list[Row]) -> Row:
    return Row("total", sum(r.rollout for r in rows), sum(r.update for r in rows),
               sum(r.cpu_per_node for r in rows))


def _fmt(value: float, unit: str) -> str:
    if unit == "B":
        return f"{value:.0f}"
    return f"{value / (GIB if unit == 'GiB' else MIB):.1f}"


def render_markdown(arch: Architecture, s: PlanSettings, unit: Literal["GiB", "MiB", "B"] = "GiB") -> str:
    """The plan as a Markdown table with a summary of the KV-cache capacity and whether each phase fits."""
    rows = plan_rows(arch, s)
    total = totals(rows)
    lines = [
        f"**{arch.name}** ({arch.num_params / 1e9:.2f}B params"
        + (f", critic {arch.critic_params / 1e9:.2f}B" if s.critic else "")
        + f"), {s.nodes} node(s) x {s.gpus} GPUs of {s.gpu_mem_gib:g} GiB, "
        + (f"ZeRO-{s.zero}" if s.zero else "no DeepSpeed") + (f", LoRA rank {s.lora_rank}" if s.lora_rank else "")
        + (", optimizer offload" if s.offload_optimizer else "") + (", param offload" if s.offload_params else "")
        + f", vLLM TP {s.vllm_tp} at gpu_memory_utilization {s.gpu_memory_utilization:g}",
        "",
        f"| component | rollout ({unit}/GPU) | update ({unit}/GPU) | CPU ({unit}/node) | note |",
        "|---|---:|---:|---:|---|",
    ]
    for r in [*rows, total]:
        name = f"**{r.component}**" if r is total else r.component
        lines.append(f"| {name} | {_fmt(r.rollout, unit)} | {_fmt(r.update, unit)} | {_fmt(r.cpu_per_node, unit)} | "
                     f"{r.note} |")
    lines += ["", *summary_lines(arch, s, rows, total, unit)]
    return "\n".join(lines)


def summary_lines(arch: Architecture, s: PlanSettings, rows: list[Row], total: Row, unit: str = "GiB") -> list[str]:
    """KV capacity in tokens and full-length sequences per engine, the per-engine load, and the fit verdicts."""
    gpu = s.gpu_mem_gib * GIB
    kv = next(r.rollout for r in rows if r.component == "vLLM: KV cache")
    per_token = arch.kv_cache_bytes_per_token(s.vllm_tp)
    capacity = max(kv, 0) // per_token
    out = [f"- KV cache: {per_token / 1024:.0f} KiB per token per GPU -> {capacity:,.0f} tokens per engine = "
           f"{capacity // s.seq_len:,.0f} sequences of {s.seq_len} tokens at once"]
    if s.samples_per_step:
        engines = s.world_size // s.vllm_tp
        out.append(f"- each of the {engines} engines generates {s.samples_per_step / engines:g} samples per step")
    for phase, used in (("rollout", total.rollout), ("update", total.update)):
        verdict = "fits" if used <= gpu and kv > 0 else "DOES NOT FIT"
        out.append(f"- {phase}: {_fmt(used, unit)} of {_fmt(gpu, unit)} {unit} per GPU -> {verdict}")
    longest = longest_seq_len(arch, s)
    out.append(f"- longest sequence that fits: {longest:,} tokens = a response of "
               f"{max(longest - s.prompt_tokens, 0):,} after a {s.prompt_tokens}-token prompt")
    if s.zero == 3 and s.logprob_chunk_tokens is not None:  # the head gathered once per pass, not per chunk
        head = arch.embedding_params * 2
        out.append(f"- ZeRO-3 with the LM head in chunks: the head ({_fmt(head, unit)} {unit}) is gathered once in "
                   f"the forward and once in backward, as without chunks, and held while all "
                   f"{-(-s.seq_len // s.logprob_chunk_tokens)} chunks of {s.logprob_chunk_tokens} tokens of a "
                   f"{s.seq_len}-token sequence go through it (zerotir.rl.chunked_logprobs)")
    return out
