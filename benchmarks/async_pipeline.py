"""The asynchronous pipeline on 2 CPU cores: the toy world trained synchronously, with max_staleness 1 and 2 through
the engine host in a thread, and through the rollout fleet (an engine process of its own).

    python -m benchmarks.async_pipeline                                  # every arm on RL seeds 0 1 2
    python -m benchmarks.async_pipeline --model_dir data/toy_base --arms sync s1 fleet_s1 --seeds 0

Method. One toy base (``configs/toy_cpu.yaml``'s, pretraining seed 0; built into ``<out>/base_s0`` unless
``--model_dir`` names one). Then, for each RL seed and in that order each arm (so that a change of the machine's
load falls on every arm alike), ``python -m zerotir fit --config configs/toy_cpu.yaml`` from that base:

- ``sync``: ``model.hosts.max_staleness`` null, the default: each step generates its batch in line;
- ``s1`` / ``s2``: ``max_staleness`` 1 / 2: the engine host in a thread of the trainer's process, with its own copy
  of the weights, generates ahead (its engine's threads its own, the trainer's torch's); ``off_policy_correction: tis``;
- ``fleet_s0`` / ``fleet_s1``: ``model.hosts.engines`` 1 (``configs/toy_cpu_fleet.yaml``): one engine process (a Ray
  actor with one torch thread and one CPU of a local cluster), the weights broadcast after every update over gloo,
  S = 0 (the synchronous schedule through the fleet: its overhead) and S = 1 (``tis``).

Each run validates on 64 held-out questions (greedy) every ``--val_every`` steps and stops at ``--target`` held-out
accuracy (Lightning's ``EarlyStopping``) or ``--max_steps``. Measured per run, from its TensorBoard logs: RL steps per
minute of training (steps / the sum of ``time/step``: the training loop's wall time, validation excluded), minutes
from the process start to the first validation at the target, and the profile: mean seconds per step of
generation, update, the trainer waiting for rollouts, the engine host waiting for the trainer
(``time/wait_for_trainer``, empty where no host logs it) and the weights' push (``time/weight_sync``), and the mean
staleness. Written to
``<out>/async_pipeline.{json,md,png}``.

Targets: S = 1 at least 1.25x the steps per minute of the synchronous run, and no more minutes to 80%.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

from benchmarks.toy_emergence import build_base, early_stop_args, val_curve, zerotir
from zerotir import metric_names as mn
from zerotir.scaling.runs import load_run

REPO = Path(__file__).resolve().parents[1]
CONFIG = "configs/toy_cpu.yaml"
ARMS = {"sync": [], "s1": ["--model.hosts.max_staleness", "1", "--model.rl.off_policy_correction", "tis"],
        "s2": ["--model.hosts.max_staleness", "2", "--model.rl.off_policy_correction", "tis"],
        "fleet_s0": ["--model.hosts.max_staleness", "0", "--model.hosts.engines", "1"],
        "fleet_s1": ["--model.hosts.max_staleness", "1", "--model.rl.off_policy_correction", "tis",
                     "--model.hosts.engines", "1"]}
PROFILE = {"generation": mn.TIME_GENERATION, "update": mn.TIME_UPDATE, "wait_for_rollout": mn.TIME_WAIT_ROLLOUT,
           "wait_for_trainer": mn.TIME_WAIT_TRAINER, "weight_sync": mn.TIME_WEIGHT_SYNC, "staleness": mn.STALENESS_MEAN}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="RL seeds")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--out", type=Path, default=REPO / "runs" / "async")
    p.add_argument("--model_dir", type=Path, default=None, help="a toy base to reuse (else built into <out>)")
    p.add_argument("--target", type=float, default=0.8, help="held-out accuracy that ends a run")
    p.add_argument("--max_steps", type=int, default=40)
    p.add_argument("--val_every", type=int, default=5)
    return p.parse_args(argv)


def run(args: argparse.Namespace, arm: str, seed: int, base: Path, arms: dict[str, list[str]] = ARMS,
        profile: dict[str, str] = PROFILE, extra: tuple[str, ...] = ()) -> dict:
    """One arm's fit from ``base`` with RL seed ``seed`` (``arms[arm]``'s settings, then ``extra``): its speed, its
    validation curve against the target and the mean of each ``profile`` tag per step."""
    run_dir = args.out / f"{arm}_s{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    fit = ["fit", "--config", CONFIG, "--model.base.path", str(base), "--toy_base", "null",
           "--trainer.default_root_dir", str(run_dir), "--trainer.enable_progress_bar", "false",
           "--trainer.enable_checkpointing", "false", *early_stop_args(args.target),
           "--seed_everything", str(seed), "--model.seed", str(seed), "--data.seed", str(seed),
           "--trainer.max_steps", str(args.max_steps), "--trainer.val_check_interval", str(args.val_every), *arms[arm],
           *extra]
    print(f"[{time.strftime('%H:%M:%S')} load {os.getloadavg()[0]:.1f}] {arm} seed {seed} (log {run_dir}.log)",
          flush=True)
    start = zerotir(fit, Path(f"{run_dir}.log"))
    curve = val_curve(run_dir, start)
    hit = next((v for v in curve if v["accuracy"] >= args.target), None)
    series = load_run(run_dir.name, run_dir / "tensorboard").scalars
    steps = len(series[mn.TIME_STEP])
    out = {"arm": arm, "seed": seed, "steps": steps, "steps_per_minute": steps / (sum(series[mn.TIME_STEP]) / 60),
           "reached": hit is not None, "steps_to_target": hit and hit["step"],
           "minutes_to_target": hit and hit["minutes"], "final_accuracy": curve[-1]["accuracy"] if curve else None,
           "profile": {k: statistics.fmean(series[tag]) for k, tag in profile.items() if tag in series}}
    print(f"    {steps} steps, {out['steps_per_minute']:.1f} steps/min, target at step {out['steps_to_target']} "
          f"({out['minutes_to_target'] and round(out['minutes_to_target'], 2)} min); profile "
          + ", ".join(f"{k} {v:.2f}" for k, v in out["profile"].items()), flush=True)
    return out


def summary(runs: list[dict], arms: list[str], profile: dict[str, str] = PROFILE, baseline: str = "sync") -> list[dict]:
    """Per arm: mean steps / min, its ratio to ``baseline``'s (per seed, then the mean), minutes to the target."""
    sync = {r["seed"]: r for r in runs if r["arm"] == baseline}
    rows = []
    for arm in arms:
        mine = [r for r in runs if r["arm"] == arm]
        ratios = [r["steps_per_minute"] / sync[r["seed"]]["steps_per_minute"] for r in mine if r["seed"] in sync]
        minutes = [r["minutes_to_target"] for r in mine if r["reached"]]
        rows.append({"arm": arm, "seeds": len(mine), "steps_per_minute": statistics.fmean(r["steps_per_minute"]
                                                                                          for r in mine),
                     "speedup": statistics.fmean(ratios) if ratios else None,
                     "speedup_range": [min(ratios), max(ratios)] if ratios else None,
                     "reached": len(minutes), "minutes_to_target": statistics.fmean(minutes) if minutes else None,
                     "profile": {k: statistics.fmean(r["profile"][k] for r in mine if k in r["profile"])
                                 for k in profile if any(k in r["profile"] for r in mine)}})
    return rows


def markdown(rows: list[dict], target: float) -> str:
    def cell(v, fmt="{:.2f}"):
        return "-" if v is None else fmt.format(v)

    lines = [f"| arm | seeds | RL steps / min | vs sync (range) | reached {target:.0%} | minutes to {target:.0%} | "
             "s/step generation | s/step update | trainer waits s/step | host waits s/step | weights s/step | "
             "staleness |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        p = r["profile"]
        rng = r["speedup_range"]
        lines.append(f"| {r['arm']} | {r['seeds']} | {r['steps_per_minute']:.1f} | {cell(r['speedup'])}x "
                     f"({cell(rng and rng[0])}-{cell(rng and rng[1])}) | {r['reached']}/{r['seeds']} | "
                     f"{cell(r['minutes_to_target'])} | {cell(p.get('generation'))} | {cell(p.get('update'))} | "
                     f"{cell(p.get('wait_for_rollout'))} | {cell(p.get('wait_for_trainer'))} | "
                     f"{cell(p.get('weight_sync'))} | {cell(p.get('staleness'))} |")
    return "\n".join(lines) + "\n"


def plot(runs: list[dict], out: Path, arms: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for i, arm in enumerate(arms):
        values = [r["steps_per_minute"] for r in runs if r["arm"] == arm]
        ax.scatter([i] * len(values), values, label=arm)
    ax.set_xticks(range(len(arms)), arms)
    ax.set_ylabel("RL steps per minute")
    ax.set_title("Toy world on 2 CPU cores: in line, thread host, fleet")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    base = args.model_dir or Path(build_base(args.out, seed=0)["path"])
    runs = [run(args, arm, seed, base) for seed in args.seeds for arm in args.arms]
    rows = summary(runs, args.arms)
    table = markdown(rows, args.target)
    command = "python -m benchmarks.async_pipeline " + " ".join(argv if argv is not None else sys.argv[1:])
    (args.out / "async_pipeline.json").write_text(json.dumps({"command": command.strip(), "runs": runs,
                                                              "summary": rows}, indent=1) + "\n")
    (args.out / "async_pipeline.md").write_text(f"`{command.strip()}`\n\n{table}")
    plot(runs, args.out / "async_pipeline.png", args.arms)
    print(table, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
