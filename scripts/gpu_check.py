"""The GPU check of the scale path, driven by ``scripts/gpu_check.sh``: a few ``fit`` steps of a random
Qwen2.5-0.5B-shaped model under DeepSpeed ZeRO-2 and ZeRO-3 on one GPU, with step time, peak GPU memory and the time
of a bucketed (ZeRO-3 gathering) weight sync.

    python scripts/gpu_check.py env                                  # every import the run needs, versions, CUDA
    python scripts/gpu_check.py build --out runs/gpu_check/model     # random model + byte tokenizer, no download
    python scripts/gpu_check.py grads --model runs/gpu_check/model --report runs/gpu_check/grads.json
    python scripts/gpu_check.py config --zero 3 --model runs/gpu_check/model --out runs/gpu_check/zero3.yaml
    python scripts/gpu_check.py config --zero 3 --variant lora --model runs/gpu_check/model --out runs/gpu_check/lora.yaml
    python scripts/gpu_check.py run --config runs/gpu_check/zero3.yaml --report runs/gpu_check/zero3.json
    python scripts/gpu_check.py summary runs/gpu_check/zero2.json runs/gpu_check/zero3.json

``--cpu`` (build / config) makes a tiny model and a CPU config with Lightning's default strategy: it exercises this
script (model building, config, the recorder, the sync measurement, the report) on a machine without a GPU. DeepSpeed
itself only runs on CUDA under Lightning, so the CPU run says nothing about ZeRO.

Rollouts use the transformers engine (vLLM is not assumed on the GPU machine). That engine shares the actor module, so
the run's own ``time/weight_sync`` is only a cache reset; the recorder therefore also times
``zerotir.parallel.weight_sync.sync_weights`` of the actor into a sink engine that copies every tensor on the device, the
work a colocated vLLM engine's update does, with the real bucketed ZeRO-3 gather. A checksum of the synced embedding must
change from step to step (the update reached the weights) and every step's gradient norm must be finite and > 0
(PPO: the random critic's values make the advantages nonzero even though every reward is 0).

Those checks accept any finite nonzero gradient, so they would not see ZeRO-3 train on the last micro-batch only:
``grads`` (``scripts/gpu_check_grads.py``) compares ZeRO-3's gradients on one fixed batch with ZeRO-2's and plain
torch's. The checks that need vLLM are ``scripts/gpu_check_vllm.py``'s.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from lightning.pytorch.callbacks import Callback  # noqa: E402

from zerotir.parallel.architecture import KNOWN, from_hf_config  # noqa: E402

STEPS = 3
GIB = 1 << 30


# ----- model and config -----

def qwen_05b_config(tokenizer: Any, tiny: bool) -> Any:
    """The Qwen2.5-0.5B shape (vocab 151936, tied embeddings; ids above the byte tokenizer's 259 are never decoded to
    text, they decode to nothing) or, with ``tiny``, a 2-layer, 64-wide one over the byte vocabulary."""
    from transformers import Qwen2Config

    shape = KNOWN["qwen2.5-0.5b"]
    sizes = dict(vocab_size=shape.vocab_size, hidden_size=shape.hidden_size, intermediate_size=shape.intermediate_size,
                 num_hidden_layers=shape.num_layers, num_attention_heads=shape.num_heads,
                 num_key_value_heads=shape.num_kv_heads)
    if tiny:
        sizes = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2)
    return Qwen2Config(**sizes, tie_word_embeddings=True, max_position_embeddings=4096, rope_theta=1_000_000.0,
                       bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id)


def build(out: Path, tiny: bool) -> None:
    """Random-init the model (on the GPU when there is one: fast) in bf16 and save it with the byte tokenizer."""
    from transformers import Qwen2ForCausalLM

    from zerotir.toy.tokenizer import build_byte_tokenizer

    tokenizer = build_byte_tokenizer()
    config = qwen_05b_config(tokenizer, tiny)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16 if not tiny else torch.float32)
    numel = sum(p.numel() for p in model.parameters())
    planned = from_hf_config(config).num_params
    if numel != planned:
        raise RuntimeError(f"memory-plan parameter count {planned} != model numel {numel}")
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    print(f"built {'tiny' if tiny else 'Qwen2.5-0.5B-shaped'} random model: {numel:,} parameters -> {out}")


def make_config(model: Path, zero: int, root: Path, cpu: bool, variant: str = "ppo") -> dict[str, Any]:
    """The run config, 3 steps. ``ppo``: actor + critic + reference under one DeepSpeed engine, 8 prompts x 4 samples;
    under ZeRO-2 the rollouts come from the engine host in a thread (``model.hosts.max_staleness`` 1: its own
    transformers copy of the actor on the GPU, in the run's dtype; ZeRO-3 refuses it), under ZeRO-3 in line. ``lora``: REINFORCE++ with rank-8 adapters on the actor (``model.base.lora``),
    the reference the base with adapters off, in line."""
    trainer: dict[str, Any] = {
        "accelerator": "cpu" if cpu else "gpu", "devices": 1, "max_steps": STEPS, "log_every_n_steps": 1,
        "default_root_dir": str(root), "limit_val_batches": 0, "precision": "32-true" if cpu else "bf16-mixed",
        "callbacks": [{"class_path": "callbacks.ScalingMetrics"}],
    }
    if not cpu:
        trainer["strategy"] = {"class_path": "lightning.pytorch.strategies.DeepSpeedStrategy",
                               "init_args": {"config": str(REPO / "configs" / "deepspeed" / f"zero{zero}.json")}}
    config = {
        "seed_everything": 0,
        "trainer": trainer,
        "checkpoint": {"save_top_k": 0, "save_last": False},  # a 0.5B PPO checkpoint would cost more than the steps
        "model": {
            "base": {"path": str(model), "dtype": "float32" if cpu else "bfloat16", "gradient_checkpointing": True},
            "rl": {"algorithm": "ppo", "kl_coef": 0.01, "kl_estimator": "k1", "micro_batch_size": 8},
            "optim": {"lr": 1.0e-4, "critic_lr": 1.0e-4, "max_grad_norm": 1.0},
            "sampling": {"n": 2 if cpu else 4, "temperature": 1.0, "max_response_tokens": 32 if cpu else 256},
            "tool": {"max_tool_calls": 2, "sandbox": {"workers": 2}},
            "rollout": {"class_path": "zerotir.config.HFRollout"},
            "seed": 0,
        },
        "data": {"train_files": ["gsm8k_train"], "template": "orz_tool", "prompts_per_step": 2 if cpu else 8,
                 "max_prompt_tokens": 1024, "seed": 0},
    }
    if variant == "ppo" and zero == 2:
        config["model"]["hosts"] = {"max_staleness": 1}
        config["model"]["rl"]["off_policy_correction"] = "tis"
    elif variant == "lora":
        config["model"]["base"]["lora"] = {"rank": 8, "alpha": 16.0}
        config["model"]["rl"] = {"algorithm": "reinforce_pp", "kl_coef": 0.01, "kl_estimator": "k1",
                                 "micro_batch_size": 8}
        config["model"]["optim"] = {"lr": 1.0e-4, "max_grad_norm": 1.0}
        config["model"]["sampling"]["max_response_tokens"] = 32 if cpu else 128
    elif variant != "ppo":
        raise ValueError(f"variant={variant!r}: ppo or lora")
    return config


# ----- measuring a run -----

class SinkEngine:
    """Receives synced weights as a colocated engine would: copies each tensor on its device, then drops it. Keeps a
    checksum of the first tensor whose name holds ``watch`` (the embedding; under LoRA, whose base is frozen, the
    first adapter B matrix) so a changed model can be told from an unchanged one."""

    def __init__(self, watch: str = "model.embed_tokens.weight") -> None:
        self.watch = watch
        self.checksum: float | None = None

    def update_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in named_tensors:
            copy = tensor.detach().clone()
            if self.checksum is None and self.watch in name:
                self.checksum = float(copy.float().sum())


class StepRecorder(Callback):
    """Per RL step: wall time, the run's phase timings, peak GPU memory, grad norm, and a timed bucketed sync."""

    def __init__(self, bucket_mb: int = 256, watch: str = "model.embed_tokens.weight") -> None:
        self.bucket_bytes = bucket_mb << 20
        self.watch = watch
        self.steps: list[dict[str, Any]] = []
        self._start = 0.0

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        from zerotir.parallel.weight_sync import sync_weights

        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.synchronize()
        row = {"step": len(self.steps) + 1, "wall_s": time.perf_counter() - self._start,
               "timings": dict(outputs["step"].timings), "grad_norm": outputs["step"].stats.get("grad_norm"),
               "peak_allocated_gib": torch.cuda.max_memory_allocated() / GIB if cuda else None,
               "peak_reserved_gib": torch.cuda.max_memory_reserved() / GIB if cuda else None}
        sink = SinkEngine(self.watch)
        sync = sync_weights(trainer.model, sink, self.bucket_bytes, prefix="actor.")
        if cuda:
            torch.cuda.synchronize()
        row.update(sync_s=sync["seconds"], sync_gib=sync["bytes"] / GIB, sync_buckets=sync["buckets"],
                   embed_checksum=sink.checksum)
        self.steps.append(row)
        print(f"[gpu_check] step {row['step']}: {row['wall_s']:.1f} s, peak {_num(row['peak_allocated_gib'])} GiB, "
              f"sync {row['sync_s']:.2f} s for {row['sync_gib']:.2f} GiB in {row['sync_buckets']} buckets", flush=True)


def check_steps(steps: list[dict[str, Any]]) -> list[str]:
    """What went wrong, if anything: step count, gradient norms, weights that did not change."""
    problems = []
    if len(steps) != STEPS:
        problems.append(f"{len(steps)} steps recorded, expected {STEPS}")
    for row in steps:
        norm = row["grad_norm"]
        if norm is None or not math.isfinite(norm) or norm <= 0:
            problems.append(f"step {row['step']}: gradient norm {norm} (expected finite and > 0)")
    sums = [row["embed_checksum"] for row in steps]
    if None in sums:
        problems.append("the weight sync sent no tensor it watches (the embedding, or a LoRA B matrix)")
    elif any(a == b for a, b in zip(sums, sums[1:])):
        problems.append(f"the synced embedding did not change between steps (checksums {sums})")
    return problems


def run(config: Path, report: Path) -> int:
    from zerotir.cli.app import ZeroTIRCLI

    lora = (yaml.safe_load(config.read_text())["model"]["base"].get("lora") is not None)
    recorder = StepRecorder(watch=".lora_B." if lora else "model.embed_tokens.weight")
    start = time.perf_counter()
    ZeroTIRCLI(args=["fit", "--config", str(config)], trainer_defaults={"callbacks": [recorder]})
    problems = check_steps(recorder.steps)
    result = {"config": str(config), "total_s": time.perf_counter() - start, "steps": recorder.steps,
              "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "problems": problems}
    report.write_text(json.dumps(result, indent=2))
    for problem in problems:
        print(f"[gpu_check] PROBLEM: {problem}", flush=True)
    return 1 if problems else 0


# ----- environment and summary -----

# Every module a run imports, with the pip name that provides it: `env` imports them all before any GPU time is spent.
REQUIRED = [("torch", "torch"), ("lightning", "lightning"), ("transformers", "transformers"),
            ("torchmetrics", "torchmetrics"), ("jsonargparse", "jsonargparse"), ("docstring_parser", "docstring-parser"),
            ("typeshed_client", "typeshed-client"), ("fastapi", "fastapi"), ("pydantic", "pydantic"),
            ("uvicorn", "uvicorn"), ("httpx", "httpx"), ("pebble", "pebble"), ("math_verify", "math-verify"),
            ("tensorboard", "tensorboard"), ("accelerate", "accelerate"), ("deepspeed", "deepspeed"), ("yaml", "pyyaml"),
            ("sympy", "sympy"), ("rich", "rich"), ("scipy", "scipy"), ("pandas", "pandas"), ("pyarrow", "pyarrow"),
            ("matplotlib", "matplotlib"), ("peft", "peft"),
            # the project's own import chain: the CLI, the module, the sandbox service and the callbacks
            ("zerotir.cli.app", "zerotir"), ("zerotir.module", "zerotir"), ("sandbox.server", "zerotir"),
            ("callbacks", "zerotir")]
DEEPSPEED_TESTED = ((0, 19, 8), (0, 20))  # pyproject.toml pins deepspeed>=0.19.8,<0.20


def check_imports() -> tuple[list[str], list[str]]:
    """Import every module of ``REQUIRED``; ``(version lines, problems)``, every failure reported at once."""
    import importlib

    lines, problems = [], []
    for module, dist in REQUIRED:
        try:
            mod = importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 (a wheel built for another torch fails in many ways)
            problems.append(f"import {module} ({dist}) failed: {type(exc).__name__}: {exc}")
            continue
        if "." not in module and hasattr(mod, "__version__"):
            lines.append(f"{module} {mod.__version__}")
    if not any(p.startswith("import deepspeed ") for p in problems):
        import deepspeed

        version = tuple(int(x) for x in deepspeed.__version__.split("+")[0].split(".")[:3])
        low, high = DEEPSPEED_TESTED
        if not low <= version < high:
            problems.append(f"deepspeed {deepspeed.__version__} is outside the tested range >=0.19.8,<0.20 (its ZeRO-3 "
                            "micro-step handling is what zerotir.parallel.deepspeed_setup.begin_micro_batch relies on)")
    return lines, problems


def env(need_gpu: bool) -> int:
    if not need_gpu:
        import os

        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # no CUDA: DeepSpeed's CPU accelerator, quietly
    lines, problems = check_imports()
    lines.insert(0, f"python {sys.version.split()[0]}, torch CUDA {torch.version.cuda}")
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        lines.append(f"GPU {props.name}, {props.total_memory / GIB:.1f} GiB")
    elif need_gpu:
        problems.append("no CUDA device")
    print("\n".join(lines), flush=True)
    for problem in problems:
        print(f"[gpu_check] PROBLEM: {problem}", file=sys.stderr, flush=True)
    if problems:
        print("Fix: run `bash scripts/fetch_gpu_wheels.sh` where pip works and carry .whl/ to this machine "
              "(gpu_check.sh installs from it); see docs/scale.md", file=sys.stderr)
        return 1
    return 0


def summary(reports: list[Path]) -> str:
    """A Markdown table over the runs: per step wall time, update and sync times, peak memory."""
    lines = ["| run | step | step s | update s | generation s | sync s (GiB, buckets) | peak alloc GiB | "
             "peak reserved GiB | grad norm |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for path in reports:
        if not path.is_file():
            lines.append(f"| {path.stem} | - | FAILED: no report | | | | | | |")
            continue
        data = json.loads(path.read_text())
        for row in data["steps"]:
            t = row["timings"]
            lines.append(f"| {path.stem} | {row['step']} | {row['wall_s']:.1f} | {t.get('update', 0):.1f} | "
                         f"{t.get('generation', 0):.1f} | {row['sync_s']:.2f} ({row['sync_gib']:.2f}, "
                         f"{row['sync_buckets']}) | {_num(row['peak_allocated_gib'])} | "
                         f"{_num(row['peak_reserved_gib'])} | {_num(row['grad_norm'], '.3g')} |")
        if data["problems"]:
            lines.append(f"| {path.stem} | | PROBLEMS: {'; '.join(data['problems'])} | | | | | | |")
    grads_report = reports[0].parent / "grads.json"
    if grads_report.is_file():
        g = json.loads(grads_report.read_text())
        lines += ["", f"Gradients on one batch (relative L2 error, tolerance {g['tolerance']}): ZeRO-2 vs full batch "
                      f"{g['zero2_vs_full_batch']:.2e}, ZeRO-3 vs ZeRO-2 {g['zero3_vs_zero2']:.2e}, ZeRO-3 with "
                      f"log-probs {g['chunk_tokens']} tokens at a time vs full logits "
                      f"{g['zero3_chunked_vs_full_logits']:.2e} (log-probs within "
                      f"{g['zero3_chunked_logprob_max_abs']:.1e})"
                      + (f" - PROBLEMS: {'; '.join(g['problems'])}" if g["problems"] else "")]
    out = reports[0].parent
    lines += _vllm_lines(out / "vllm.json") + _fleet_lines(out / "fleet.json") + _nccl_lines(out / "nccl.json")
    text = "\n".join(lines)
    print(text)
    return text


def _vllm_lines(path: Path) -> list[str]:
    """The vLLM checks' outcome (``scripts/gpu_check_vllm.py``), one line each: none of them ran without vllm."""
    if not path.is_file():
        return ["", "vLLM checks: no report (the stage did not finish)"]
    data = json.loads(path.read_text())
    ran = [row for row in data["checks"] if not row["status"].startswith("skipped")]
    plainly = [] if ran else [f"**vLLM is NOT checked on this device**: {NO_VLLM if not data['vllm'] else ALL_SKIPPED}"]
    return ["", *plainly, f"vLLM checks (vllm importable: {data['vllm']}, {data['gpus']} GPUs):"] + [
        f"- {row['name']} ({row['bug']}): {row['status']}" for row in data["checks"]]


NO_VLLM = ("no vLLM wheel here (a device run carries at most 64 MiB, and vLLM's wheel is far larger), so the vLLM "
           "engine, its weight sync and the fleet's vLLM engines stay unverified")
ALL_SKIPPED = "every vLLM check was skipped (the reasons below)"


def _fleet_lines(path: Path) -> list[str]:
    """The fleet stage's outcome (``scripts/gpu_check_fleet.py``: the weight push with CUDA tensors over gloo)."""
    if not path.is_file():
        return ["", "Fleet push with CUDA tensors (gloo): no report (the stage did not run or finish: stages.tsv)"]
    data = json.loads(path.read_text())
    done = "" if "buckets" not in data else f", {data['buckets']} buckets in {data['seconds']:.2f} s"
    return ["", f"Fleet push with CUDA tensors (gloo, one GPU): {data['status']}{done}"
            + (f" - PROBLEMS: {'; '.join(data['problems'])}" if data.get("problems") else "")]


def _nccl_lines(path: Path) -> list[str]:
    """The nccl stage's outcome (``scripts/gpu_check_nccl.py``: a weight group of one rank over NCCL)."""
    if not path.is_file():
        return ["", "NCCL weight group (one rank): no report (the stage did not run or finish: stages.tsv)"]
    data = json.loads(path.read_text())
    done = "" if "push_buckets" not in data else (f", formed in {data['form_s']:.2f} s, a push of "
                                                  f"{data['push_buckets']} buckets in {data['push_s']:.2f} s, "
                                                  f"aborted: {data['aborted']}")
    return ["", f"NCCL weight group (one rank): {data['status']}{done}"
            + (f" - PROBLEMS: {'; '.join(data['problems'])}" if data.get("problems") else "")]


def _num(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("env").add_argument("--cpu", action="store_true")
    p = sub.add_parser("build")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--cpu", action="store_true")
    p = sub.add_parser("grads")
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--report", type=Path, required=True)
    p.add_argument("--cpu", action="store_true")
    p = sub.add_parser("config")
    p.add_argument("--zero", type=int, choices=(2, 3), required=True)
    p.add_argument("--variant", choices=("ppo", "lora"), default="ppo")
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--cpu", action="store_true")
    p = sub.add_parser("run")
    p.add_argument("--config", type=Path, required=True)
    p.add_argument("--report", type=Path, required=True)
    sub.add_parser("summary").add_argument("reports", type=Path, nargs="+")
    args = parser.parse_args(argv)
    if args.command == "env":
        return env(need_gpu=not args.cpu)
    if args.command == "build":
        build(args.out, tiny=args.cpu)
    elif args.command == "config":
        config = make_config(args.model.resolve(), args.zero, args.out.parent.resolve() / args.out.stem, args.cpu,
                             args.variant)
        header = f"# python -m zerotir fit --config {args.out}\n# generated by scripts/gpu_check.py config\n"
        args.out.write_text(header + yaml.safe_dump(config, sort_keys=False))
        print(f"wrote {args.out}")
    elif args.command == "grads":
        from gpu_check_grads import grads

        return grads(args.model, args.report, args.cpu)
    elif args.command == "run":
        return run(args.config, args.report)
    else:
        summary(args.reports)
    return 0


if __name__ == "__main__":
    sys.exit(main())
