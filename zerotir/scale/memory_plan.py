"""Per-GPU memory plan of a colocated RL run: actor, critic, reference and vLLM on the same GPUs, from parameter counts.

    python -m zerotir.scale.memory_plan --model qwen2.5-7b --gpus 8 --zero 3 --critic true
    python -m zerotir.scale.memory_plan --model path/to/config.json --gpus 8 --nodes 4 --zero 3 --offload_optimizer true
    python -m zerotir.scale.memory_plan --run_config configs/qwen2.5-7b_ppo.yaml     # settings read from a run's config

Two phases share each GPU. *Rollout*: vLLM is awake and holds its whole budget (``gpu_memory_utilization`` x GPU
memory: weights, activations and CUDA graphs, and the KV cache in what is left), while the training states stay where
DeepSpeed keeps them. *Update*: vLLM sleeps (KV cache dropped; weights copied to CPU at level 1, dropped at level 2)
and the training states plus activations use the GPU. A plan fits when both phase totals stay below the GPU memory.

Accounting (P = parameters of a trained model, N = data-parallel GPUs = gpus x nodes, bf16 mixed precision with Adam,
as DeepSpeed does it; numbers are per GPU):
    params     2P (ZeRO-2, replicated) or 2P/N (ZeRO-3); 0 on the GPU with ZeRO-3 parameter offload (on the CPU).
    grads      2P/N bf16 partition, kept allocated; during the update also the 4P/N fp32 gradient partition the
               optimizer reads (on the CPU with optimizer offload).
    optimizer  12P/N: fp32 master weights, Adam m and v (on the CPU with optimizer offload).
    ZeRO-3 gathered working set (update): the layer being computed plus the prefetched one, or the embedding /
               LM head when that is larger, in bf16.
    reference  frozen bf16 weights, no optimizer state: 2P, or 2P/N partitioned under ZeRO-3; only with kl_coef > 0.
Activations (update, rough; bf16; flash attention, so no seq x seq scores; micro-batch b sequences of s tokens):
    per layer and token 2 * (8h + 2kv + 4i) bytes are kept for the backward pass (norm inputs and outputs, q, k, v,
    attention output, residual; the MLP's gate, up, activation and product). With gradient checkpointing only each
    layer's input (2h bytes per token) is kept, plus one layer's full set while it is recomputed.
    logits: b * s * V * ``logit_bytes`` (default 18: bf16 logits 2, their fp32 copy for the log-probs 4, and the
    fp32 log-softmax, probabilities and product 12 of the entropy, as ``zerotir.rl.update`` computes them).
    Actor and critic activations add: one backward runs through ``policy_loss + vf_coef * value_loss``.
Fixed assumptions (flags): ``overhead_gib`` for the CUDA context, NCCL buffers and allocator slack; vLLM's activation
peak plus CUDA graphs ``vllm_overhead_gib`` (vLLM measures the real figure when it starts); ``vllm_sleep_gib`` left on
the GPU while vLLM sleeps; ``sync_bucket_mb`` for the bucket size of the weight sync.
Weight sync (rollout): one gathered bucket in bf16. A bucket holds whole layers and never splits one
(``zerotir.scale.weight_sync.plan_buckets``), so the peak is ``max(sync_bucket_mb, the largest layer)``; for Qwen2.5 that
is the embedding / LM head (vocab x hidden: about 1.0 GiB for 7B, 1.45 GiB for 32B), not the 256 MiB bucket.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

from zerotir.scale.architecture import Architecture, resolve

GIB = 1 << 30
MIB = 1 << 20


@dataclass(frozen=True)
class PlanSettings:
    """How a run is laid out over its GPUs (see the module docstring for what each number feeds).

    Args:
        gpus: GPUs per node.
        nodes: nodes.
        zero: DeepSpeed ZeRO stage, 2 or 3.
        offload_optimizer: fp32 master weights, Adam states and fp32 gradients live in CPU memory.
        offload_params: bf16 parameter partitions live in CPU memory (ZeRO-3 only).
        critic: train a critic (PPO).
        reference: keep a frozen reference model (kl_coef > 0).
        micro_batch_size: sequences per forward / backward.
        seq_len: tokens per sequence (prompt + response).
        gradient_checkpointing: recompute activations in the backward pass.
        vllm_tp: vLLM tensor-parallel size (GPUs per engine).
        gpu_memory_utilization: share of each GPU's memory vLLM may use while awake.
        gpu_mem_gib: memory of one GPU.
        samples_per_step: prompts x samples per prompt of one RL step (for the per-engine load line); 0 = unknown.
        logit_bytes: activation bytes per logit (see the module docstring).
        overhead_gib: CUDA context, NCCL buffers, allocator slack per GPU.
        vllm_overhead_gib: vLLM activation peak and CUDA graphs per GPU.
        vllm_sleep_gib: what a sleeping vLLM engine still holds per GPU.
        vllm_sleep_level: 1 (weights copied to CPU memory) or 2 (weights dropped; right for RL, where the weight sync
            overwrites them after every update anyway).
        sync_bucket_mb: one gathered bucket of the weight sync.
    """

    gpus: int = 8
    nodes: int = 1
    zero: Literal[2, 3] = 3
    offload_optimizer: bool = False
    offload_params: bool = False
    critic: bool = False
    reference: bool = False
    micro_batch_size: int = 1
    seq_len: int = 9216
    gradient_checkpointing: bool = True
    vllm_tp: int = 1
    gpu_memory_utilization: float = 0.5
    gpu_mem_gib: float = 80.0
    samples_per_step: int = 0
    logit_bytes: int = 18
    overhead_gib: float = 2.0
    vllm_overhead_gib: float = 2.0
    vllm_sleep_gib: float = 1.0
    vllm_sleep_level: Literal[1, 2] = 2
    sync_bucket_mb: float = 256.0

    def __post_init__(self) -> None:
        for name in ("gpus", "nodes", "micro_batch_size", "seq_len", "vllm_tp", "logit_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
        if self.zero not in (2, 3):
            raise ValueError(f"zero={self.zero}: the plan covers ZeRO stages 2 and 3")
        if self.offload_params and self.zero != 3:
            raise ValueError("offload_params=True needs zero=3 (ZeRO-2 keeps full parameters on every GPU)")
        if not 0 < self.gpu_memory_utilization < 1:
            raise ValueError(f"gpu_memory_utilization={self.gpu_memory_utilization}: must be in (0, 1)")
        if self.gpus % self.vllm_tp:
            raise ValueError(f"vllm_tp={self.vllm_tp} must divide gpus={self.gpus} (an engine stays inside a node)")

    @property
    def world_size(self) -> int:
        return self.gpus * self.nodes


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
    p_gpu = 0.0 if s.offload_params else (2 * params if s.zero == 2 else 2 * params / n)
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


def activation_bytes(arch: Architecture, s: PlanSettings, with_logits: bool) -> float:
    """Activations kept for one micro-batch's backward pass through one model (see the module docstring)."""
    tokens = s.micro_batch_size * s.seq_len
    h = arch.hidden_size
    full_layer = 2 * (8 * h + 2 * arch.kv_dim + 4 * arch.intermediate_size) * tokens
    if s.gradient_checkpointing:
        kept = arch.num_layers * 2 * h * tokens + full_layer
    else:
        kept = arch.num_layers * full_layer
    logits = tokens * arch.vocab_size * s.logit_bytes if with_logits else 0
    return kept + logits


def vllm_rows(arch: Architecture, s: PlanSettings) -> list[Row]:
    """vLLM's weights, working memory and KV cache (rollout) and what it keeps while asleep (update)."""
    budget = s.gpu_memory_utilization * s.gpu_mem_gib * GIB
    weights = 2 * arch.num_params / s.vllm_tp
    work = s.vllm_overhead_gib * GIB
    kv = budget - weights - work
    engines_per_node = s.gpus // s.vllm_tp
    # Level 1 keeps a CPU copy of the weights; level 2 drops them (the weight sync refills them after each update).
    cpu = 2 * arch.num_params * engines_per_node if s.vllm_sleep_level == 1 else 0.0
    return [
        Row("vLLM: weights (bf16)", weights, 0.0, cpu,
            f"TP {s.vllm_tp}; " + ("on CPU while asleep" if cpu else "dropped while asleep, re-synced")),
        Row("vLLM: activations + CUDA graphs", work, 0.0, 0.0, "assumed"),
        Row("vLLM: KV cache", kv, 0.0, 0.0, "rest of the vLLM budget" if kv > 0 else "NEGATIVE: budget too small"),
        Row(f"vLLM: asleep (level {s.vllm_sleep_level})", 0.0, s.vllm_sleep_gib * GIB, 0.0, "assumed"),
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
    ref_gpu = 0.0 if (s.offload_params or not s.reference) else ref
    ref_cpu = ref * s.gpus if (s.offload_params and s.reference) else 0.0
    ref_note = "frozen, no optimizer state" if s.reference else f"not loaded (kl_coef = 0); would be {ref / GIB:.1f}"
    rows = trained_model_rows("actor", arch.num_params, s)
    rows += trained_model_rows("critic", arch.critic_params, s, enabled=s.critic)
    rows += [
        Row("ZeRO-3 gathered params", 0.0, gathered, 0.0,
            "2 layers or the LM head" if s.zero == 3 else "ZeRO-2: none"),
        Row("reference (bf16)", ref_gpu, ref_gpu, ref_cpu, ref_note),
        Row("activations: actor", 0.0, activation_bytes(arch, s, with_logits=True), 0.0,
            f"{s.micro_batch_size} x {s.seq_len} tokens" + (", checkpointed" if s.gradient_checkpointing else "")),
        Row("activations: critic", 0.0, activation_bytes(arch, s, with_logits=False) if s.critic else 0.0, 0.0,
            "" if s.critic else "not used"),
        *vllm_rows(arch, s),
        Row("weight-sync bucket", sync_bucket_bytes(arch, s), 0.0, 0.0,
            "largest of bucket, layer, embedding / LM head"),
        Row("CUDA context, NCCL, slack", s.overhead_gib * GIB, s.overhead_gib * GIB, 0.0, "assumed"),
    ]
    return rows


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
        + f"), {s.nodes} node(s) x {s.gpus} GPUs of {s.gpu_mem_gib:g} GiB, ZeRO-{s.zero}"
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
    return out


# ----- settings from a run config and the command line -----

_STRATEGY_NAMES = {  # Lightning's registered DeepSpeed strategy names -> (stage, offload optimizer, offload params)
    "deepspeed_stage_2": (2, False, False),
    "deepspeed_stage_2_offload": (2, True, False),
    "deepspeed_stage_3": (3, False, False),
    "deepspeed_stage_3_offload": (3, True, True),
}


def _strategy_settings(strategy: Any, where: str) -> dict[str, Any]:
    """ZeRO stage and offloads from ``trainer.strategy``: a registered name or a ``DeepSpeedStrategy`` class_path."""
    if isinstance(strategy, str) and strategy in _STRATEGY_NAMES:
        stage, opt, par = _STRATEGY_NAMES[strategy]
        return {"zero": stage, "offload_optimizer": opt, "offload_params": par}
    init = strategy.get("init_args", {}) if isinstance(strategy, dict) else None
    if init is None or "DeepSpeed" not in str(strategy.get("class_path", "")):
        raise ValueError(f"{where}: trainer.strategy={strategy!r} is not DeepSpeed; the memory plan covers ZeRO-2 / 3 "
                         f"({', '.join(_STRATEGY_NAMES)} or a DeepSpeedStrategy class_path)")
    ds = init.get("config")
    if isinstance(ds, str):
        ds = json.loads(_config_file(ds, where).read_text(encoding="utf-8"))
    if isinstance(ds, dict):
        zero = ds.get("zero_optimization", {})
        return {"zero": int(zero.get("stage", 0)),
                "offload_optimizer": zero.get("offload_optimizer", {}).get("device", "none") != "none",
                "offload_params": zero.get("offload_param", {}).get("device", "none") != "none"}
    return {"zero": int(init.get("stage", 2)), "offload_optimizer": bool(init.get("offload_optimizer", False)),
            "offload_params": bool(init.get("offload_parameters", False))}


def _config_file(name: str, where: str) -> Path:
    """A DeepSpeed JSON named in a run config: relative to the working directory, else to the repository root."""
    path = Path(name)
    for candidate in (path, Path(where).resolve().parents[1] / path):
        if candidate.is_file():
            return candidate
    raise ValueError(f"{where}: the DeepSpeed config {name!r} does not exist (paths are relative to the repository "
                     "root; run from there)")


def settings_from_run_config(path: str | Path) -> tuple[str, dict[str, Any]]:
    """The model and ``PlanSettings`` fields a zerotir run config implies (``python -m zerotir fit --config``).

    Reads ``model.*`` (model_path, gradient_checkpointing, the ``rl`` and ``sampling`` groups, and the ``rollout``
    group's tensor_parallel_size / gpu_memory_utilization / weight_sync_bucket_mb), ``data.*`` (max_prompt_tokens,
    prompts_per_step) and ``trainer.*`` (devices, num_nodes, strategy). Missing fields take the groups' defaults.
    """
    import yaml

    from zerotir.config import RLConfig, SamplingConfig, VLLMRollout

    where = str(path)
    config = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    model, data, trainer = (config.get(k) or {} for k in ("model", "data", "trainer"))
    if "model_path" not in model:
        raise ValueError(f"{where}: model.model_path is missing")
    devices = trainer.get("devices", 1)
    if not isinstance(devices, int):
        raise ValueError(f"{where}: trainer.devices={devices!r}; the plan needs a number of GPUs per node")
    rl = RLConfig(**(model.get("rl") or {}))
    sampling = SamplingConfig(**(model.get("sampling") or {}))
    rollout = model.get("rollout") or {}
    vllm = str(rollout.get("class_path", "")).endswith("VLLMRollout")
    engine = VLLMRollout(**(rollout.get("init_args") or {})) if vllm else None
    settings = {
        "gpus": devices,
        "nodes": int(trainer.get("num_nodes", 1)),
        **_strategy_settings(trainer.get("strategy"), where),
        "critic": rl.algorithm == "ppo",
        "reference": rl.kl_coef > 0,
        "micro_batch_size": rl.micro_batch_size,
        "seq_len": int(data.get("max_prompt_tokens") or 1024) + sampling.max_response_tokens,
        "gradient_checkpointing": bool(model.get("gradient_checkpointing", False)),
        "vllm_tp": engine.tensor_parallel_size if engine else 1,
        "gpu_memory_utilization": engine.gpu_memory_utilization if engine else VLLMRollout.gpu_memory_utilization,
        "samples_per_step": int(data.get("prompts_per_step", 128)) * sampling.n,
        "sync_bucket_mb": float(engine.weight_sync_bucket_mb if engine else VLLMRollout.weight_sync_bucket_mb),
    }
    return str(model["model_path"]), settings


def build_parser() -> Any:
    """The command line: ``--model`` / ``--run_config`` / ``--unit`` and every ``PlanSettings`` field."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(prog="python -m zerotir.scale.memory_plan",
                            description="Per-GPU memory plan of a colocated RL run (see zerotir/scale/memory_plan.py).")
    parser.add_argument("--model", type=str | None, default=None,
                        help="qwen2.5-0.5b / qwen2.5-7b / qwen2.5-32b (or hub ids), a config.json or a model folder")
    parser.add_argument("--run_config", type=str | None, default=None,
                        help="a zerotir run config; its model and settings are the defaults of the other flags")
    parser.add_argument("--unit", type=Literal["GiB", "MiB", "B"], default="GiB")
    parser.add_class_arguments(PlanSettings, nested_key="plan")
    return parser


def main(argv: list[str] | None = None) -> str:
    """Parse ``argv``, print the plan as Markdown and return it.

    Settings flags are given as ``--plan.gpus 8 --plan.zero 3``; the short forms ``--gpus``, ``--nodes``, ``--zero``
    are accepted too. With ``--run_config`` the config's values are the defaults and flags override them.
    """
    argv = [_long_form(a) for a in (sys.argv[1:] if argv is None else argv)]
    parser = build_parser()
    first = parser.parse_args(argv)
    if first.run_config is not None:
        config_model, values = settings_from_run_config(first.run_config)
        parser.set_defaults({"model": config_model, **{f"plan.{k}": v for k, v in values.items()}})
    args = parser.parse_args(argv)
    if args.model is None:
        parser.error("give --model (a known name, hub id, config.json or model folder) or --run_config")
    settings = PlanSettings(**vars(args.plan)) if not isinstance(args.plan, PlanSettings) else args.plan
    text = render_markdown(resolve(args.model), settings, args.unit)
    print(text)
    return text


def _long_form(arg: str) -> str:
    """``--gpus`` -> ``--plan.gpus`` (and ``--gpus=8``) for every ``PlanSettings`` field."""
    name, eq, value = arg.partition("=")
    if name.startswith("--") and name[2:] in _PLAN_FIELDS:
        return f"--plan.{name[2:]}{eq}{value}"
    return arg


_PLAN_FIELDS = {f.name for f in fields(PlanSettings)}

if __name__ == "__main__":
    main()
