"""The memory plan's command line (``zerotir.parallel.memory_plan`` computes the plan; this module reads its settings
from flags or from a run config and prints it):

    python -m zerotir.parallel.memory_plan_cli --model qwen2.5-7b --gpus 8 --zero 3 --critic true
    python -m zerotir.parallel.memory_plan_cli --model path/to/config.json --gpus 8 --nodes 4 --offload_optimizer true
    python -m zerotir.parallel.memory_plan_cli --run_config configs/qwen2.5-7b_ppo.yaml   # a run's settings

A run config gives the model, the layout (``trainer.devices`` / ``num_nodes`` / ``strategy``: a DeepSpeed stage and
its offloads), the RL settings that size the update (``model.rl``: the critic, the reference, ``micro_batch_size``,
``max_tokens_per_micro_batch``, ``logprob_chunk_tokens``), the sequence length (``data.max_prompt_tokens`` +
``model.sampling.max_response_tokens``) and the vLLM engine's settings; flags override any of them.
"""

from __future__ import annotations

import json
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any, Literal

from zerotir.parallel.architecture import resolve
from zerotir.parallel.memory_plan import PlanSettings, render_markdown

_STRATEGY_NAMES = {  # Lightning's registered DeepSpeed strategy names -> (stage, offload optimizer, offload params)
    "deepspeed_stage_2": (2, False, False),
    "deepspeed_stage_2_offload": (2, True, False),
    "deepspeed_stage_3": (3, False, False),
    "deepspeed_stage_3_offload": (3, True, True),
}


def _strategy_settings(strategy: Any, where: str) -> dict[str, Any]:
    """ZeRO stage and offloads from ``trainer.strategy``: a registered name or a ``DeepSpeedStrategy`` class_path;
    none at all is zero 0 (no DeepSpeed, which the plan takes for LoRA runs only)."""
    if strategy is None:
        return {"zero": 0, "offload_optimizer": False, "offload_params": False}
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

    Reads ``model.*`` (the ``base`` group's path and gradient_checkpointing, the ``rl`` group (micro_batch_size or
    the token budget, logprob_chunk_tokens, the critic and the reference) and the ``sampling`` group, and the
    ``rollout`` group's tensor_parallel_size / gpu_memory_utilization / weight_sync_bucket_mb), ``data.*``
    (max_prompt_tokens, prompts_per_step) and ``trainer.*`` (devices, num_nodes, strategy). Missing fields take the
    groups' defaults.
    """
    import yaml

    from zerotir.config import LoraConfig, RLConfig, SamplingConfig, VLLMRollout

    where = str(path)
    config = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    model, data, trainer = (config.get(k) or {} for k in ("model", "data", "trainer"))
    base = model.get("base") or {}
    if "path" not in base:
        raise ValueError(f"{where}: model.base.path is missing")
    devices = trainer.get("devices", 1)
    if not isinstance(devices, int):
        raise ValueError(f"{where}: trainer.devices={devices!r}; the plan needs a number of GPUs per node")
    rl = RLConfig(**(model.get("rl") or {}))
    sampling = SamplingConfig(**(model.get("sampling") or {}))
    rollout = model.get("rollout") or {}
    vllm = str(rollout.get("class_path", "")).endswith("VLLMRollout")
    engine = VLLMRollout(**(rollout.get("init_args") or {})) if vllm else None
    prompt_tokens = int(data.get("max_prompt_tokens") or 1024)
    settings = {
        "gpus": devices,
        "nodes": int(trainer.get("num_nodes", 1)),
        **_strategy_settings(trainer.get("strategy"), where),
        "critic": rl.uses_critic,
        "reference": rl.kl_coef > 0,
        "micro_batch_size": rl.micro_batch_size,
        "max_tokens_per_micro_batch": rl.max_tokens_per_micro_batch,
        "logprob_chunk_tokens": rl.logprob_chunk_tokens,
        "seq_len": prompt_tokens + sampling.max_response_tokens,
        "prompt_tokens": prompt_tokens,
        "gradient_checkpointing": bool(base.get("gradient_checkpointing", False)),
        "lora_rank": LoraConfig(**base["lora"]).rank if base.get("lora") else None,
        "vllm_tp": engine.tensor_parallel_size if engine else 1,
        "gpu_memory_utilization": engine.gpu_memory_utilization if engine else VLLMRollout.gpu_memory_utilization,
        "samples_per_step": int(data.get("prompts_per_step", 128)) * sampling.n,
        "sync_bucket_mb": float(engine.weight_sync_bucket_mb if engine else VLLMRollout.weight_sync_bucket_mb),
    }
    return str(base["path"]), settings


def build_parser() -> Any:
    """The command line: ``--model`` / ``--run_config`` / ``--unit`` and every ``PlanSettings`` field."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(prog="python -m zerotir.parallel.memory_plan_cli",
                            description="Per-GPU memory plan of a colocated RL run (see zerotir/parallel/memory_plan.py).")
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
