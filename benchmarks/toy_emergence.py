"""Tool use emerging on 2 CPU cores: pretrain the toy base, then RL by outcome reward alone, timed end to end.

    python -m benchmarks.toy_emergence                      # REINFORCE++ on seeds 0 1 2, PPO and GRPO on seed 0
    python -m benchmarks.toy_emergence --seeds 0 --algorithms reinforce_pp
    python -m benchmarks.toy_emergence --algorithms reinforce_baseline rloo --seeds 0 1 2 --other_seeds 0 1 2
    python -m benchmarks.toy_emergence --algorithms reinforce_pp_vllm --seeds 0   # the vLLM engine and its base

Method. For each seed, in this order and alone on the machine:

1. ``toy-base``: the toy base model of the run's config (its ``toy_base`` settings: ``zerotir.toy.pretrain``
   defaults; ``configs/toy_cpu_vllm.yaml`` adds heads widened to 32, ``serve_head_dim``) with that seed, built into
   ``<out>/base_s<seed>``
   (``base_s<seed>_<settings>`` for other settings; reused when present; its recorded training seconds are what is
   reported). Its
   base statistics are measured on held-out questions with the real tool loop (one sample each at temperature 1):
   how often it opens a code block, how often it is right.
2. For each algorithm run on this seed: ``python -m zerotir fit --config configs/toy_cpu.yaml [--config
   configs/toy_cpu_<algo>.yaml]`` (the arm's overlay on the base) from that base, validation on 64 held-out
   questions (greedy) every ``--val_every`` RL steps, stopped by Lightning's ``EarlyStopping`` once held-out
   accuracy reaches ``--target`` (or at ``--max_steps``). Wall time is measured from the start of the process; the
   time of each validation comes from its TensorBoard event.
3. The last checkpoint is evaluated on all 256 held-out questions (``zerotir test``): the confirmation figure.

Printed and written to ``<out>/emergence.{json,md,png}``: per run, base accuracy and code rate, pretraining
minutes, RL steps and minutes to the target, total minutes (pretraining + RL), the held-out accuracy and code use at
that point and on all 256 questions, and (JSON) the 1-minute load average before and after the RL run. The PNG shows
held-out accuracy and code use against wall minutes, pretraining included. ``python -m zerotir scaling --logdir <out>`` draws the paper's Figure-4 panels for the same runs.

Target: accuracy >= 80% and code use >= 80% on held-out questions within 15 minutes including pretraining.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from zerotir import metric_names as mn
from zerotir.toy.pretrain import PretrainSettings, ensure_toy_base, read_info

REPO = Path(__file__).resolve().parents[1]

BASE_CONFIG = "configs/toy_cpu.yaml"
CONFIGS = {  # the --config files of each arm, in order: the base, then the arm's overlay on it
    "reinforce_pp": [BASE_CONFIG], "ppo": [BASE_CONFIG, "configs/toy_cpu_ppo.yaml"],
    "grpo": [BASE_CONFIG, "configs/toy_cpu_grpo.yaml"],
    "reinforce_baseline": [BASE_CONFIG, "configs/toy_cpu_reinforce_baseline.yaml"],
    "rloo": [BASE_CONFIG, "configs/toy_cpu_rloo.yaml"],
    "reinforce_pp_vllm": [BASE_CONFIG, "configs/toy_cpu_vllm.yaml"],  # REINFORCE++ on the vLLM engine, its base's shape
    "reinforce_pp_lora": [BASE_CONFIG, "configs/toy_cpu_lora.yaml"],  # REINFORCE++ training LoRA adapters only
}
DEFAULT_ALGORITHMS = ["reinforce_pp", "ppo", "grpo"]
VAL_NAME = "heldout"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds of the first algorithm")
    p.add_argument("--algorithms", nargs="+", default=DEFAULT_ALGORITHMS, choices=list(CONFIGS),
                   help="the first runs on --seeds, the others on --other_seeds")
    p.add_argument("--other_seeds", type=int, nargs="+", default=[0], help="seeds of the other algorithms")
    p.add_argument("--out", type=Path, default=REPO / "runs" / "emergence")
    p.add_argument("--target", type=float, default=0.8, help="held-out accuracy that ends a run")
    p.add_argument("--max_steps", type=int, default=60, help="RL steps at most")
    p.add_argument("--val_every", type=int, default=5, help="RL steps between validations")
    p.add_argument("--final_rows", type=int, default=256, help="held-out questions of the final evaluation")
    p.add_argument("--base_minutes", type=float, default=PretrainSettings.minutes,
                   help="wall-time limit of the toy-base pretraining (0 = none); a build that reaches it fails "
                        "(it never reshapes the base)")
    p.add_argument("--base_threads", type=int, default=PretrainSettings.threads,
                   help="torch threads of the toy-base pretraining (1 wastes less time than 2 on a crowded machine; "
                        "the base can differ in the last bits)")
    return p.parse_args(argv)


def base_settings(algo: str) -> dict:
    """The ``toy_base`` settings of the algorithm's config files, later files overriding earlier ones (``{}``: the
    toy world's defaults)."""
    import yaml

    settings: dict = {}
    for path in CONFIGS[algo]:
        settings.update(yaml.safe_load((REPO / path).read_text()).get("toy_base") or {})
    return settings


def config_args(algo: str) -> list[str]:
    """``--config`` of each of the algorithm's config files, in order."""
    return [arg for path in CONFIGS[algo] for arg in ("--config", path)]


def build_base(out: Path, seed: int, minutes: float = PretrainSettings.minutes,
               threads: int = PretrainSettings.threads, settings: dict | None = None) -> dict:
    """The toy base of ``seed`` (built unless present) and its record: training seconds and base statistics."""
    settings = settings or {}
    name = f"base_s{seed}" + "".join(f"_{k}{v}" for k, v in sorted(settings.items()))
    path = ensure_toy_base(out / name, show_progress=False, **{**settings, "seed": seed, "minutes": minutes,
                                                               "threads": threads})
    record = read_info(path)["record"]
    stats = record.get("base_stats", {})
    return {
        "path": str(path),
        "pretrain_minutes": record["train_seconds"] / 60,
        "steps": record["steps_done"],
        "decay_reason": record.get("decay_reason"),
        "base_accuracy": stats.get("accuracy"),
        "base_code_rate": stats.get("code_rate"),
    }


def early_stop_args(target: float) -> list[str]:
    """Append Lightning's EarlyStopping on held-out accuracy to the config's own callbacks."""
    return ["--trainer.callbacks+=lightning.pytorch.callbacks.EarlyStopping",
            "--trainer.callbacks.monitor", f"{VAL_NAME}/accuracy", "--trainer.callbacks.mode", "max",
            "--trainer.callbacks.stopping_threshold", str(target), "--trainer.callbacks.patience", "10000",
            "--trainer.callbacks.check_on_train_epoch_end", "false"]


def zerotir(args: list[str], log: Path) -> float:
    """Run ``python -m zerotir <args>`` with its output in ``log``; returns the start time (epoch seconds)."""
    start = time.time()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with log.open("w") as f:
        done = subprocess.run([sys.executable, "-m", "zerotir", *args], cwd=REPO, env=env, stdout=f,
                              stderr=subprocess.STDOUT)
    if done.returncode:
        raise RuntimeError(f"python -m zerotir {' '.join(args[:3])} failed ({done.returncode}); see {log}")
    return start


def val_curve(run_dir: Path, start: float) -> list[dict]:
    """Each validation of a run: RL step, minutes since ``start``, held-out accuracy and code use."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    code = {e.step: e.value for e in acc.Scalars(f"{VAL_NAME}/{mn.EVAL_TOOL_CALL_RATE}")}
    return [{"step": e.step, "minutes": (e.wall_time - start) / 60, "accuracy": e.value, "code_rate": code[e.step]}
            for e in acc.Scalars(f"{VAL_NAME}/accuracy")]


def fit_args(args: argparse.Namespace, algo: str, seed: int, common: list[str]) -> list[str]:
    """The ``zerotir fit`` command of a run. A checkpoint at every validation: the run stops at one (early stop) and
    the final evaluation reads ``last.ckpt``, which must then be that step's (the config's own interval, 5 in
    ``configs/toy_cpu.yaml``, would leave an earlier one at a stop between two of its checkpoints)."""
    return ["fit", *config_args(algo), *early_stop_args(args.target),
            "--seed_everything", str(seed), "--model.seed", str(seed), "--data.seed", str(seed),
            "--trainer.max_steps", str(args.max_steps), "--trainer.val_check_interval", str(args.val_every),
            "--checkpoint.every_n_train_steps", str(args.val_every), *common]


def train_run(args: argparse.Namespace, algo: str, seed: int, base: dict) -> dict:
    """RL from ``base`` until held-out accuracy reaches the target, then the final evaluation."""
    run_dir = args.out / f"{algo}_s{seed}"
    common = ["--model.base.path", base["path"], "--toy_base", "null",
              "--trainer.default_root_dir", str(run_dir), "--trainer.enable_progress_bar", "false"]
    fit = fit_args(args, algo, seed, common)
    print(f"[{algo} seed {seed}] RL from {base['path']} (log {run_dir}.log)", flush=True)
    for old in (run_dir, args.out / f"{algo}_s{seed}_final"):  # a rerun starts clean: no stale curves or reports
        shutil.rmtree(old, ignore_errors=True)
    run_dir.mkdir(parents=True)
    load_before = os.getloadavg()[0]  # other jobs on the cores slow the minutes down: keep the load with them
    start = zerotir(fit, Path(f"{run_dir}.log"))
    load_after = os.getloadavg()[0]
    curve = val_curve(run_dir, start)
    rl_minutes = (time.time() - start) / 60
    hit = next((v for v in curve if v["accuracy"] >= args.target and v["code_rate"] >= args.target), None)
    final_dir = args.out / f"{algo}_s{seed}_final"  # its own folder: no test scalars in the training curves
    test = ["test", "--config", "configs/eval_toy_heldout.yaml", "--ckpt_path", str(run_dir / "checkpoints" / "last.ckpt"),
            "--data.limit_test_rows", str(args.final_rows), *common[:4], "--trainer.default_root_dir", str(final_dir),
            "--trainer.enable_progress_bar", "false"]
    zerotir(test, Path(f"{final_dir}.log"))
    # `zerotir test` writes a run folder of its own, <root>/test/<stamp>/ (zerotir.eval.report.new_run_dir)
    summaries = sorted((final_dir / "test").glob("*/eval/test_summary.json"))
    if len(summaries) != 1:
        raise RuntimeError(f"{final_dir}: expected the summary of one test run, found {len(summaries)}; see "
                           f"{final_dir}.log")
    final = json.loads(summaries[0].read_text())["benchmarks"][VAL_NAME]
    return {
        "algorithm": algo, "seed": seed, **{k: base[k] for k in ("pretrain_minutes", "base_accuracy", "base_code_rate")},
        "reached": hit is not None, "steps_to_target": hit and hit["step"], "rl_minutes_to_target": hit and hit["minutes"],
        "total_minutes_to_target": hit and hit["minutes"] + base["pretrain_minutes"],
        "accuracy_at_target": hit and hit["accuracy"], "code_rate_at_target": hit and hit["code_rate"],
        "rl_minutes": rl_minutes, "final_accuracy": final["accuracy"], "final_code_rate": final["code_rate"],
        "final_rows": final["num_problems"], "load_1min": [load_before, load_after], "curve": curve,
    }


def _cell(value: object, fmt: str = "{:.2f}") -> str:
    return "-" if value is None or value is False else fmt.format(value) if isinstance(value, float) else str(value)


def markdown(runs: list[dict], target: float) -> str:
    head = ("| algorithm | seed | base acc % | base code % | pretrain min | RL steps to target | RL min to target | "
            "total min | acc % at target | code % at target | acc % (all held-out) | code % (all held-out) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in runs:
        pct = lambda v: _cell(v if v is None else 100 * v, "{:.1f}")  # noqa: E731
        lines.append("| " + " | ".join([
            r["algorithm"], str(r["seed"]), pct(r["base_accuracy"]), pct(r["base_code_rate"]),
            _cell(r["pretrain_minutes"]), _cell(r["steps_to_target"]), _cell(r["rl_minutes_to_target"]),
            _cell(r["total_minutes_to_target"]), pct(r["accuracy_at_target"]), pct(r["code_rate_at_target"]),
            pct(r["final_accuracy"]), pct(r["final_code_rate"])]) + " |")
    reached = sum(r["reached"] and r["total_minutes_to_target"] <= 15 for r in runs)
    lines.append(f"\nTarget: held-out accuracy and code use >= {100 * target:.0f}% within 15 minutes including "
                 f"pretraining: met by {reached} of {len(runs)} runs.")
    return "\n".join(lines)


def plot(runs: list[dict], path: Path) -> None:
    """Held-out accuracy and code use (greedy validation) against wall minutes, pretraining included (top), and
    against RL steps (bottom); colour = algorithm, line style = seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {a: f"C{i}" for i, a in enumerate(CONFIGS)}
    styles = ["-", "--", ":", "-."]
    seeds = sorted({r["seed"] for r in runs})
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    for r in runs:
        style = dict(color=colours[r["algorithm"]], ls=styles[seeds.index(r["seed"]) % len(styles)], marker="o", ms=3,
                     label=f"{r['algorithm']} seed {r['seed']}")
        minutes = [r["pretrain_minutes"] + v["minutes"] for v in r["curve"]]
        steps = [v["step"] for v in r["curve"]]
        for col, key in enumerate(("accuracy", "code_rate")):
            values = [100 * v[key] for v in r["curve"]]
            axes[0, col].plot(minutes, values, **style)
            axes[1, col].plot(steps, values, **style)
    for col, title in enumerate(("held-out accuracy %", "held-out responses with code %")):
        axes[0, col].set(title=title, xlabel="wall minutes on 2 CPU cores (pretraining + RL)", xlim=(0, 15.5))
        axes[0, col].axvline(15, color="grey", ls="--", lw=1)
        axes[1, col].set(xlabel="RL step")
        for ax in axes[:, col]:
            ax.axhline(80, color="grey", ls=":", lw=1)
            ax.set_ylim(0, 102)
            ax.grid(alpha=0.3)
    axes[1, 0].legend(fontsize=7, ncol=1)
    fig.suptitle("ZeroTIR toy world: tool use emerging from outcome reward alone (validation: 64 held-out, greedy)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # toy-base progress: step, loss, copy probe
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not every sandbox request of the base statistics
    args.out.mkdir(parents=True, exist_ok=True)
    first, runs = args.algorithms[0], []
    for seed in sorted(set(args.seeds) | set(args.other_seeds)):
        plan = [a for a in args.algorithms if (seed in args.seeds if a == first else seed in args.other_seeds)]
        if not plan:
            continue
        bases: dict[str, dict] = {}
        for algo in plan:
            settings = base_settings(algo)
            key = json.dumps(settings, sort_keys=True)
            if key not in bases:
                print(f"[seed {seed}] toy base {settings or '(defaults)'} -> {args.out}", flush=True)
                base = bases[key] = build_base(args.out, seed, args.base_minutes, args.base_threads, settings)
                print(f"[seed {seed}] base: pretrain {base['pretrain_minutes']:.1f} min ({base['steps']} steps, decay "
                      f"by {base['decay_reason']}), accuracy {base['base_accuracy']}, code rate "
                      f"{base['base_code_rate']}", flush=True)
            runs.append(train_run(args, algo, seed, bases[key]))
            r = runs[-1]
            print(f"[{algo} seed {seed}] target {'reached' if r['reached'] else 'NOT reached'}: "
                  f"{_cell(r['steps_to_target'])} steps, {_cell(r['total_minutes_to_target'])} min in all; "
                  f"all held-out: accuracy {r['final_accuracy']:.3f}, code {r['final_code_rate']:.3f}; load "
                  f"{r['load_1min'][0]:.1f} -> {r['load_1min'][1]:.1f}", flush=True)
    table = markdown(runs, args.target)
    (args.out / "emergence.json").write_text(json.dumps(runs, indent=2) + "\n")
    (args.out / "emergence.md").write_text(table + "\n")
    plot(runs, args.out / "emergence.png")
    print(table)
    print(f"written: {args.out / 'emergence.json'}, .md, .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
