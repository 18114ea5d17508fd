"""The toy world's LoRA finding: does LoRA RL reach 80% held-out accuracy and code use from the shipped
base, and in how many RL steps against full fine-tuning on the same RL seed.

    python -m benchmarks.lora_toy                              # 3 RL seeds x 2 arms into runs/lora_toy (alone)
    python -m benchmarks.lora_toy --seeds 0 --max_steps 20     # one seed, shorter runs
    python -m benchmarks.lora_toy --report                     # the table and verdict of the runs in --out again

Method. Both arms start from the shipped toy base (``data/toy_base``, no pretraining in the run) and differ only by
``configs/toy_cpu_lora.yaml``: ``full`` is ``configs/toy_cpu.yaml`` (REINFORCE++, every weight trained), ``lora`` adds
that overlay (rank-16 adapters on every projection, lr 1e-3, the base frozen). Each run is
``benchmarks.toy_emergence.train_run`` (its arms ``reinforce_pp`` and ``reinforce_pp_lora``): RL seed ``s`` for the
model, the data order and Lightning, greedy validation on 64 held-out questions every ``--val_every`` steps, stopped
by Lightning's ``EarlyStopping`` once held-out accuracy reaches 80% (or at ``--max_steps``), then the last
checkpoint on all 256 held-out questions. Runs go one after the other, seed by seed (full, then LoRA), and
``<out>/lora_toy.json`` is rewritten after each, so a cut run keeps what finished. Steps do not depend on the
machine's load; minutes do (each run records the 1-minute load before and after).

The rule (``RULE``, written before the first run) gives the verdict; ``<out>/lora_toy.md`` holds the table and it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks import toy_emergence
from benchmarks.toy_findings_rules import spread, verdict
from zerotir.toy.pretrain import read_info

ARMS = {"full": "reinforce_pp", "lora": "reinforce_pp_lora"}  # toy_emergence's arm of each
BASE = toy_emergence.REPO / "data" / "toy_base"
RULE = ("a run reaches at the first validation (64 held-out questions, greedy, every val_every steps) with held-out "
        "accuracy >= 0.8 and code use >= 0.8; its steps to 80% are that validation's RL step (never: max_steps, a "
        "lower bound; the early stop watches accuracy only, so a stop with code use < 0.8 is never). LoRA RL "
        "reaching 80%: reproduced if the LoRA run reaches in every seed, not reproduced if in none, else mixed. "
        "Steps, LoRA against full fine-tuning on the same RL seed: slower if LoRA needs more steps in most seeds and "
        "on average, faster if fewer in most seeds and on average, else no difference at the validation's "
        "resolution. Spreads: mean (95% t interval; range; n) over the seeds")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="RL seeds (each runs both arms)")
    p.add_argument("--out", type=Path, default=toy_emergence.REPO / "runs" / "lora_toy")
    p.add_argument("--target", type=float, default=0.8, help="held-out accuracy (and code use) that counts as reached")
    p.add_argument("--max_steps", type=int, default=60, help="RL steps at most per run")
    p.add_argument("--val_every", type=int, default=5, help="RL steps between validations")
    p.add_argument("--final_rows", type=int, default=256, help="held-out questions of the final evaluation")
    p.add_argument("--report", action="store_true", help="only the table and verdict of <out>/lora_toy.json")
    return p.parse_args(argv)


def shipped_base() -> dict:
    """``toy_emergence.train_run``'s base record of ``data/toy_base``: no pretraining in this run (0 minutes)."""
    stats = read_info(BASE)["record"].get("base_stats", {})
    return {"path": str(BASE), "pretrain_minutes": 0.0, "base_accuracy": stats.get("accuracy"),
            "base_code_rate": stats.get("code_rate")}


def steps(run: dict) -> float:
    """A run's steps to 80% by ``RULE`` (never: its ``max_steps``)."""
    return float(run["steps_to_target"]) if run["reached"] else float(run["max_steps"])


def finding(runs: list[dict]) -> dict:
    """The verdict of ``RULE`` on ``runs`` (``arm`` and ``seed`` keys added to train_run's records) and its
    evidence; the seeds with both arms are the ones compared."""
    by = {(r["arm"], r["seed"]): r for r in runs}
    seeds = sorted(s for a, s in by if a == "lora" and ("full", s) in by)
    if not seeds:
        return {"verdict": "not measured", "speed": "not measured", "evidence": "no seed has both arms"}
    lora = [by["lora", s] for s in seeds]
    full = [by["full", s] for s in seeds]
    reached = [r["reached"] for r in lora]
    diff = [steps(a) - steps(b) for a, b in zip(lora, full)]
    mean_diff = sum(diff) / len(diff)
    slower, faster = sum(d > 0 for d in diff), sum(d < 0 for d in diff)
    speed = ("LoRA slower" if slower > len(diff) / 2 and mean_diff > 0 else
             "LoRA faster" if faster > len(diff) / 2 and mean_diff < 0 else "no difference at the resolution")
    ev = []
    for arm, rs in (("full", full), ("lora", lora)):
        ev.append(f"{arm}: reached in {sum(r['reached'] for r in rs)} of {len(rs)} seeds, steps to 80% "
                  f"{spread([steps(r) for r in rs], 1)}, held-out accuracy on all "
                  f"{rs[0]['final_rows']} {spread([r['final_accuracy'] for r in rs])}, code use "
                  f"{spread([r['final_code_rate'] for r in rs])}")
    ev.append(f"LoRA minus full steps per seed {', '.join(f'{d:+.0f}' for d in diff)}: {spread(diff, 1)}")
    return {"verdict": verdict(all(reached), not any(reached)), "speed": speed, "evidence": "; ".join(ev),
            "seeds": seeds}


def markdown(runs: list[dict], result: dict) -> str:
    head = ("| arm | seed | reached | RL steps to 80% | RL min to 80% | held-out acc / code % at 80% | "
            "all held-out acc / code % | steps run | load 1-min |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in sorted(runs, key=lambda r: (r["seed"], r["arm"])):
        pct = lambda a, b: "-" if a is None else f"{100 * a:.1f} / {100 * b:.1f}"  # noqa: E731
        last = r["curve"][-1]["step"] if r["curve"] else 0
        to_target = r["steps_to_target"] if r["reached"] else f"> {r['max_steps']}"
        minutes = f"{r['rl_minutes_to_target']:.2f}" if r["reached"] else "-"
        lines.append(f"| {r['arm']} | {r['seed']} | {'yes' if r['reached'] else 'no'} | {to_target} | {minutes} | "
                     f"{pct(r['accuracy_at_target'], r['code_rate_at_target'])} | "
                     f"{pct(r['final_accuracy'], r['final_code_rate'])} | {last} | "
                     f"{r['load_1min'][0]:.1f} -> {r['load_1min'][1]:.1f} |")
    lines += ["", f"Rule: {RULE}.", "", f"Verdict: LoRA RL reaching 80%: **{result['verdict']}**; steps: "
              f"**{result['speed']}**. {result['evidence']}."]
    return "\n".join(lines)


def report(out: Path) -> str:
    """The table and verdict of ``<out>/lora_toy.json``, also written to ``<out>/lora_toy.md``."""
    runs = json.loads((out / "lora_toy.json").read_text())
    table = markdown(runs, finding(runs))
    (out / "lora_toy.md").write_text(table + "\n")
    return table


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.report:
        args.out.mkdir(parents=True, exist_ok=True)
        base, runs = shipped_base(), []
        for seed in args.seeds:
            for arm, algo in ARMS.items():
                record = toy_emergence.train_run(args, algo, seed, base)
                runs.append({"arm": arm, "max_steps": args.max_steps, **record})
                r = runs[-1]
                print(f"[{arm} seed {seed}] {'reached' if r['reached'] else 'NOT reached'} at step "
                      f"{r['steps_to_target']}; all held-out: accuracy {r['final_accuracy']:.3f}, code "
                      f"{r['final_code_rate']:.3f}; load {r['load_1min'][0]:.1f} -> {r['load_1min'][1]:.1f}",
                      flush=True)
                (args.out / "lora_toy.json").write_text(json.dumps(runs, indent=2) + "\n")
    print(report(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
