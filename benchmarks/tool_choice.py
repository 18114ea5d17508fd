"""Which tool to call, learned by RL alone: the sweep of the tool-choice findings 1-5 in the ``tools`` world, then its
rows of docs/findings.md.

    python -m benchmarks.tool_choice                                 # the sweep (its time on 2 cores: docs/results.md)
    python -m benchmarks.tool_choice --out /tmp/tc --report-only     # the report from the runs already there
    python -m benchmarks.tool_choice --smoke                         # 1 seed, 2 steps, tiny bases: end to end
    python -m benchmarks.tool_choice --rebuild                       # every base pretrained here, none reused

Method. ``configs/toy_tools.yaml``: three tools (python, calculator, search over a fact table found only in the
search corpus), four kinds of questions, a base whose corpus calls tools without regard to the question. Bases of
that config's ``toy_base`` settings, pretrained with ``--pseeds`` (2): seeds 0 and 1 are shipped
(``data/toy_tools_base``, ``data/toy_tools_base_p1``: their checksums verified, nothing pretrained; ``--rebuild``
pretrains them in ``--out``, each most of an hour on one thread: docs/toy_tools.md), any other seed is pretrained in
``--out`` in a slot of its own while the runs on the seed-0 base go on (they come first).
RL runs of ``--steps`` steps, REINFORCE++, RL seeds ``--seeds`` (3), each arm varying one thing:

- ``choice_p{p}_s{s}``: the config as it is (outcome reward, 4 calls): findings 1 (selection) and 2 (coordination),
  on both bases;
- ``cost_s{s}``: reward = correctness - ``--cost`` per call (``zerotir.rewards.ToolCallCost``): finding 3, against
  ``choice_p0_s{s}``;
- ``nocap_s{s}``: a budget of ``--nocap_calls`` calls and a response budget to match: finding 4;
- ``curriculum_s{s}``: ``data.curriculum`` with lookups, products and easy sums first and the combined questions
  after (:data:`CURRICULUM`): finding 5, against ``choice_p0_s{s}``.

The rules are written in ``tool_choice_rules.py`` before any run; the runs reuse ``benchmarks.toy_findings``'
``Sweep`` (bases first, ``--jobs`` runs at a time, one torch thread each, a log beside each run folder).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import yaml

from benchmarks.toy_findings import REPO, Job, Sweep

CONFIG = REPO / "configs" / "toy_tools.yaml"
SWEEP_FILE = "sweep.json"
# Finding 5's curriculum: the kinds a single tool answers first, until 80% of their answers over 4 batches are
# right; then every kind, the combined questions weighted up.
CURRICULUM = {"window": 4, "stages": [{"weights": {"easy": 1.0, "arith": 1.0, "lookup": 1.0}, "pass_rate": 0.8},
                                      {"weights": {"easy": 1.0, "arith": 1.0, "lookup": 1.0, "combined": 3.0}}]}
SMOKE_BASE = {"steps": 20, "decay_steps": 5, "warmup_steps": 2, "eval_n": 2}
# The config's toy_base settings pretrained with seeds 0 (the config's own base) and 1.
SHIPPED_BASES = {0: REPO / "data" / "toy_tools_base", 1: REPO / "data" / "toy_tools_base_p1"}


def cost_args(cost: float) -> list[str]:
    reward = {"class_path": "zerotir.rewards.WeightedReward", "init_args": {"terms": [
        {"class_path": "zerotir.rewards.MathReward"},
        {"class_path": "zerotir.rewards.ToolCallCost", "init_args": {"cost": cost}}]}}
    return ["--model.reward", json.dumps(reward)]


def jobs(seeds: list[int], pseeds: list[int], cost: float, nocap_calls: int) -> list[Job]:
    """The RL runs: the reference arm on the first base, the other arms (on that base), then the reference arm on
    the other bases (pretrained meanwhile: a run waiting for its base holds a slot)."""
    out = [Job(f"choice_p{pseeds[0]}_s{s}", size="tools", seed=s, pseed=pseeds[0]) for s in seeds]
    for s in seeds:
        out.append(Job(f"cost_s{s}", size="tools", seed=s, extra=tuple(cost_args(cost))))
        out.append(Job(f"nocap_s{s}", size="tools", seed=s, budget=nocap_calls,
                       extra=("--model.sampling.max_response_tokens", str(80 * nocap_calls + 320))))
        out.append(Job(f"curriculum_s{s}", size="tools", seed=s, extra=("--data.curriculum", json.dumps(CURRICULUM))))
    return out + [Job(f"choice_p{p}_s{s}", size="tools", seed=s, pseed=p) for p in pseeds[1:] for s in seeds]


class ChoiceSweep(Sweep):
    """``toy_findings.Sweep`` with this world's bases: the config's ``toy_base`` as it is, one per pretraining seed,
    the shipped ones (seeds 0 and 1) unless ``--rebuild`` or ``--smoke``."""

    def base(self, size: str, pseed: int = 0) -> Path:
        settings = {**yaml.safe_load(self.config.read_text())["toy_base"], "threads": 1, "seed": pseed,
                    "minutes": self.args.base_minutes, **(SMOKE_BASE if self.args.smoke else {})}
        shipped = pseed in SHIPPED_BASES and not (self.args.rebuild or self.args.smoke)
        out = SHIPPED_BASES[pseed] if shipped else self.args.out / f"base_p{pseed}"  # toy-base reuses a matching folder
        flags = [x for k, v in settings.items() for x in (f"--{k.replace('_', '-')}", str(v))]
        log = self.args.out / f"base_p{pseed}.log"
        seconds = self._run(["toy-base", "--out", str(out), "--no-progress", *flags], log)
        self._log(f"base p{pseed} ready in {seconds / 60:.1f} min ({out})")
        return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=REPO / "runs" / "tool_choice", help="runs and bases")
    p.add_argument("--docs", type=Path, default=REPO / "docs", help="where findings.md and its figures are")
    p.add_argument("--steps", type=int, default=60, help="RL steps per run")
    p.add_argument("--val_every", type=int, default=30, help="RL steps between validations")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="RL seeds")
    p.add_argument("--pseeds", type=int, nargs="+", default=[0, 1], help="pretraining seeds of the bases")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time (one torch thread each)")
    p.add_argument("--cost", type=float, default=0.1, help="finding 3's cost per call")
    p.add_argument("--nocap_calls", type=int, default=16, help="finding 4's call budget (4 is the reference)")
    p.add_argument("--base_minutes", type=float, default=60.0, help="safety cap of each base's pretraining")
    p.add_argument("--rebuild", action="store_true",
                   help="pretrain the seed-0 and seed-1 bases in --out too, instead of reusing the shipped ones")
    p.add_argument("--smoke", action="store_true",
                   help="1 RL seed, 1 pretraining seed, 2 steps, 20-step bases: proves the sweep runs end to end")
    p.add_argument("--report-only", action="store_true", help="only write the report from existing runs")
    args = p.parse_args(argv)
    if args.smoke:
        args.seeds, args.pseeds, args.steps, args.val_every = [0], [0], 2, 2
    return args


def main(argv: list[str] | None = None) -> None:
    # Imported before the sweep: a broken import fails in a second, not after an hour of runs.
    from benchmarks.tool_choice_rules import write_report

    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    command = ("python -m benchmarks.tool_choice " + " ".join(argv if argv is not None else sys.argv[1:])).strip()
    record_file, start = args.out / SWEEP_FILE, time.time()
    if args.report_only:
        swept = json.loads(record_file.read_text()) if record_file.is_file() else None
    else:
        todo = jobs(args.seeds, args.pseeds, args.cost, args.nocap_calls)
        ChoiceSweep(args, config=CONFIG).run(todo, bases=[("tools", p) for p in args.pseeds])
        swept = {"command": command, "minutes": round((time.time() - start) / 60, 1),
                 "ended": time.strftime("%Y-%m-%d %H:%M")}
        record_file.write_text(json.dumps(swept) + "\n")
    path = write_report(args.out, args.docs, command, swept, args.seeds, args.pseeds)
    print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()
