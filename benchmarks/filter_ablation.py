"""What trains, ablated in the mixed toy world: the paper's trajectory filters, refill and overlong masking, side by
side over RL seeds.

    python -m benchmarks.filter_ablation                               # the runs, then the table
    python -m benchmarks.filter_ablation --out /tmp/fa --report-only   # the table from the runs already there

Arms, each a ``configs/toy_mixed.yaml`` run on one shared medium base (``benchmarks.toy_findings``' ``Sweep``: the
base is built once, its copy probe ends its pretraining), REINFORCE++, 4 calls, the pass-rate filter on in all:

- ``off``: the pass-rate filter alone (today's default);
- ``paper``: + the paper's trajectory filters (overlong-or-truncated and wrong, shortcut, code-count mismatch, void by
  repetition at 0.2; the perplexity rule needs a reference model, which a run with ``kl_coef: 0`` does not load);
- ``refill``: + dynamic sampling, up to ``--rounds`` generation rounds per step;
- ``mask``: + truncated responses masked out of the loss (``model.filters.overlong: mask``).

Per arm, over seeds (mean and min-max): the final greedy held-out accuracy (easy and hard averaged) and that of the
validation before it (the toy world lets every arm reach its ceiling by the end), the held-out code rate, the steps
until the smoothed rollout accuracy covers 80% of the way from its start to the best plateau of the arms in that
seed (``zerotir.scaling.laws.steps_to_fraction``; never reached: the run length), the share of a step's
trajectories the rules removed, the share of steps that trained on fewer prompt groups than a full batch
(``filter/kept_fraction`` below 1 without refill, ``filter/exhausted_steps`` rising with it) or on none (no
``train/policy_loss`` at that step), and what a step generated to get its batch: generation rounds and prompts.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.toy_findings import REPO, Job, Sweep
from benchmarks.toy_findings_rules import Runs, mean_acc
from zerotir import metric_names as mn
from zerotir.scaling import laws
from zerotir.scaling.runs import Run

CONFIG = REPO / "configs" / "toy_mixed.yaml"  # the world its results were measured in (docs/results.md)
GROUPS = ("easy", "hard")  # its held-out groups

PAPER = ["--model.filters.overlong_wrong", "true", "--model.filters.shortcut", "true",
         "--model.filters.code_mismatch", "true", "--model.filters.void_repetition", "true"]


def arms(rounds: int) -> dict[str, list[str]]:
    """Each arm's settings over ``configs/toy_mixed.yaml``, in the order of the table."""
    refill = ["--model.filters.refill.max_rounds", str(rounds)]
    return {"off": [], "paper": PAPER, "refill": PAPER + refill,
            "mask": PAPER + refill + ["--model.filters.overlong", "mask"]}


def jobs(seeds: list[int], rounds: int) -> list[Job]:
    return [Job(f"{arm}_s{seed}", seed=seed, extra=tuple(extra)) for seed in seeds
            for arm, extra in arms(rounds).items()]


def _heldout_tool_call_rate(run: Run) -> float | None:
    values = [run.get(f"heldout_{group}/{mn.EVAL_TOOL_CALL_RATE}") for group in ("easy", "hard")]
    if any(v is None or v.empty for v in values):
        return None
    return float(np.mean([v.iloc[-1] for v in values]))


def step_shares(run: Run) -> dict[str, float]:
    """Shares of the run's steps that trained on no group (``skipped``) or on fewer than a full batch
    (``shrunk``, skipped steps not included)."""
    kept = run.get(mn.KEPT_FRACTION)
    steps = sorted(set(kept.index)) if kept is not None else []
    if not steps:
        return {"skipped": float("nan"), "shrunk": float("nan")}
    trained = run.get(mn.POLICY_LOSS)
    trained_steps = set(trained.index) if trained is not None else set()
    exhausted = run.get(mn.EXHAUSTED_STEPS)
    skipped = [s for s in steps if s not in trained_steps]
    if exhausted is not None:  # refill: a step is short when the count of short steps rises at it
        rises = exhausted.diff().fillna(exhausted.iloc[0])
        shrunk = [s for s in steps if s in trained_steps and rises.get(s, 0.0) > 0]
    else:
        shrunk = [s for s in steps if s in trained_steps and kept[s] < 1.0 - 1e-9]
    return {"skipped": len(skipped) / len(steps), "shrunk": len(shrunk) / len(steps)}


def heldout_acc_at(run: Run, step: int) -> float | None:
    """The greedy held-out accuracy (easy and hard averaged) of the validation at ``step``: at the end every arm of
    the toy world may be at its ceiling, where an earlier validation still tells them apart."""
    values = []
    for group in GROUPS:
        series = run.get(f"heldout_{group}/{mn.EVAL_ACCURACY}")
        if series is None or step not in series.index:
            return None
        values.append(float(series[step]))
    return float(np.mean(values))


def removed_by_rules(run: Run) -> float:
    """The share of a step's trajectories the trajectory rules matched (``filter/<name>_fraction`` of every rule but
    the pass-rate decision, summed; a trajectory two rules matched counts twice), averaged over the run's steps: 0
    when the arm has no rule on."""
    tags = [tag for name, tag in mn.FILTER_FRACTIONS.items() if name != "pass_rate"]
    series = [run.get(tag) for tag in tags]
    present = [s for s in series if s is not None and not s.empty]
    return float(sum(s.mean() for s in present)) if present else 0.0


def per_step_cost(run: Run) -> dict[str, float]:
    """What a step generated, on average over the run's steps: its generation rounds and the prompts they consumed
    (refill's price for a full batch)."""
    rounds, prompts = run.get(mn.GENERATION_ROUNDS), run.get(mn.PROMPTS_CONSUMED)
    return {"rounds": float("nan") if rounds is None or rounds.empty else float(rounds.mean()),
            "prompts": float("nan") if prompts is None or prompts.empty else float(prompts.mean())}


def _spread(values: list[float], fmt: str = ".2f") -> str:
    values = [v for v in values if v is not None and not np.isnan(v)]
    if not values:
        return "n/a"
    return f"{np.mean(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def report(out: Path, seeds: list[int], rounds: int, steps: int, mid_step: int) -> str:
    """The markdown table of the arms (mean and min-max over seeds); ``mid_step`` is the earlier validation shown
    beside the final one."""
    runs = Runs(out)
    names = list(arms(rounds))
    speed: dict[str, list[float]] = {arm: [] for arm in names}
    for seed in seeds:
        present = {arm: runs.get(f"{arm}_s{seed}") for arm in names}
        present = {arm: r for arm, r in present.items() if r is not None and r.get(mn.ACCURACY) is not None}
        best = max((laws.steps_to_fraction(r.get(mn.ACCURACY))["plateau"] for r in present.values()), default=None)
        for arm, run in present.items():
            reach = laws.steps_to_fraction(run.get(mn.ACCURACY), plateau=best)["step"]
            speed[arm].append(float(steps if reach is None else reach))
    lines = [f"| arm | held-out accuracy | at step {mid_step} | held-out code rate | steps to 80% of plateau "
             "| removed by the rules | steps skipped | steps shrunk | rounds / step | prompts / step | runs |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for arm in names:
        present = [r for r in (runs.get(f"{arm}_s{s}") for s in seeds) if r is not None]
        shares, costs = [step_shares(r) for r in present], [per_step_cost(r) for r in present]
        lines.append(f"| {arm} | {_spread([mean_acc(r, GROUPS) for r in present])} "
                     f"| {_spread([heldout_acc_at(r, mid_step) for r in present])} "
                     f"| {_spread([_heldout_tool_call_rate(r) for r in present])} | {_spread(speed[arm], '.1f')} "
                     f"| {_spread([removed_by_rules(r) for r in present], '.3f')} "
                     f"| {_spread([s['skipped'] for s in shares])} | {_spread([s['shrunk'] for s in shares])} "
                     f"| {_spread([c['rounds'] for c in costs])} | {_spread([c['prompts'] for c in costs], '.1f')} "
                     f"| {len(present)} of {len(seeds)} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=REPO / "runs" / "filter_ablation", help="runs and the base")
    p.add_argument("--steps", type=int, default=40, help="RL steps per run")
    p.add_argument("--val_every", type=int, default=10, help="RL steps between validations")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--rounds", type=int, default=3, help="model.filters.refill.max_rounds of the refill arms")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time (one torch thread each)")
    p.add_argument("--base_minutes", type=float, default=120.0,
                   help="safety cap of the base's pretraining; its copy probe ends it first")
    p.add_argument("--report-only", action="store_true", help="only print the table from existing runs")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    if not args.report_only:
        Sweep(args, config=CONFIG).run(jobs(args.seeds, args.rounds), bases=[("medium", 0)])
    table = report(args.out, args.seeds, args.rounds, args.steps, args.steps - args.val_every)
    command = "python -m benchmarks.filter_ablation " + " ".join(argv if argv is not None else sys.argv[1:])
    text = f"{command.strip()}: {(time.time() - start) / 60:.1f} min\n\n{table}\n"
    (args.out / "ablation.md").write_text(text)
    print(text, flush=True)


if __name__ == "__main__":
    main()
