"""The verdict rules of ``benchmarks/tool_choice_rules.py`` and its findings.md section, on hand-made runs shaped
like the sweep's logs (``kinds/<kind>/...`` scalars by step under the sweep's run names)."""

import json
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks import tool_choice, tool_choice_rules as rules
from zerotir import metric_names as mn
from zerotir.scaling.runs import Run

SEEDS, PSEEDS, STEPS = [0, 1, 2], [0, 1], 12


class MemoryRuns(rules.Runs):
    def __init__(self, runs: dict[str, Run]) -> None:
        self.runs = runs

    def get(self, name: str) -> Run | None:
        return self.runs.get(name)


def ramp(start: float, end: float) -> pd.Series:
    """``start`` for 3 steps, a straight line to ``end`` at step 7, then ``end``."""
    steps = np.arange(1, STEPS + 1)
    return pd.Series(np.interp(steps, [3, 7], [start, end]), index=pd.Index(steps, name="step"))


def run(name: str, right: float = 1.0, two: float = 0.9, acc: float = 0.9, easy_calls: float = 0.5,
        calls: float = 1.5, combined_from: float = 0.0) -> Run:
    """A run whose answers end with ``right`` of the first calls right on every kind (start: chance-like)."""
    scalars = {mn.ACCURACY: ramp(0.1, acc), mn.CALLS_PER_RESPONSE: ramp(1.0, calls)}
    for kind in rules.KINDS:
        right_tool = rules.ANSWERING[kind][-1]  # python on easy / arith, search on lookup / combined
        scalars[mn.kind_tag(kind, "answers")] = ramp(16, 16)
        scalars[mn.kind_tag(kind, f"first_{right_tool}")] = ramp(0.3, right)
        scalars[mn.kind_tag(kind, "first_invalid")] = ramp(0.7, 1 - right)
        scalars[mn.kind_tag(kind, "accuracy")] = ramp(combined_from if kind == "combined" else 0.1, acc)
        scalars[mn.kind_tag(kind, "two_tools_in_correct")] = ramp(0.0, two)
    scalars[mn.kind_tag("easy", "calls_per_response")] = ramp(1.0, easy_calls)
    return Run(name=name, path=Path(name), scalars=scalars)


def reference(**kw) -> dict[str, Run]:
    return {f"choice_p{p}_s{s}": run(f"choice_p{p}_s{s}", **kw) for p in PSEEDS for s in SEEDS}


def test_selection_and_coordination():
    good = rules.reference_runs(MemoryRuns(reference()), SEEDS, PSEEDS)
    assert len(good) == 6
    assert rules.f1(good)["verdict"] == "reproduced" and rules.f2(good)["verdict"] == "reproduced"
    assert "lookup: start 0.30" in rules.f1(good)["evidence"] and "end 1.00" in rules.f1(good)["evidence"]
    bad = rules.reference_runs(MemoryRuns(reference(right=0.5, two=0.1)), SEEDS, PSEEDS)
    assert rules.f1(bad)["verdict"] == "not reproduced" and rules.f2(bad)["verdict"] == "not reproduced"
    mixed = {**reference(), "choice_p1_s2": run("x", right=0.5)}
    assert rules.f1(rules.reference_runs(MemoryRuns(mixed), SEEDS, PSEEDS))["verdict"] == "mixed"
    assert rules.f1([]) == {}


def test_cost_no_cap_and_curriculum():
    arms = {**reference(easy_calls=0.8), **{f"cost_s{s}": run("c", easy_calls=0.1, acc=0.88) for s in SEEDS},
            **{f"nocap_s{s}": run("n", calls=2.0) for s in SEEDS},
            **{f"curriculum_s{s}": run("k", combined_from=0.8) for s in SEEDS}}
    runs = MemoryRuns(arms)
    assert rules.f3(runs, SEEDS)["verdict"] == "reproduced"
    assert rules.f4(runs, SEEDS)["verdict"] == "reproduced"
    five = rules.f5(runs, SEEDS)
    assert five["verdict"] == "reproduced" and five["data"][0]["curriculum"] < five["data"][0]["uniform"]
    worse = MemoryRuns({**arms, **{f"cost_s{s}": run("c", easy_calls=0.1, acc=0.5) for s in SEEDS},
                        **{f"nocap_s{s}": run("n", calls=6.0) for s in SEEDS}})
    assert rules.f3(worse, SEEDS)["verdict"] == "not reproduced"  # accuracy fell by more than 0.05
    assert rules.f4(worse, SEEDS)["verdict"] == "not reproduced"
    assert rules.f3(MemoryRuns({}), SEEDS) == {} and rules.f4(MemoryRuns({}), SEEDS) == {}


def test_steps_to():
    s = pd.Series([0.1, 0.9, 0.9, 0.9, 0.2], index=range(1, 6))
    assert rules.steps_to(s, 40) == 4 and rules.steps_to(s * 0.5, 40) == 40 and rules.steps_to(None, 7) == 7


def test_section_replaces_only_its_own_part(tmp_path, monkeypatch):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "findings.md").write_text("# Findings\n\nthe other sweeps' table\n")
    monkeypatch.setattr(rules, "Runs", lambda out: MemoryRuns(reference()))
    for _ in range(2):  # a second report replaces the first
        rules.write_report(tmp_path, docs, "python -m benchmarks.tool_choice", None, SEEDS, PSEEDS)
    text = (docs / "findings.md").read_text()
    assert text.startswith("# Findings\n\nthe other sweeps' table\n") and text.count(rules.START) == 1
    assert "| 1 | selection" in text and "| reproduced |" in text
    assert "| 3 | " in text and "| - | not measured |" in text  # no cost runs: finding 3 not measured
    assert "| 5 | " in text and text.count("| - | not measured |") >= 2  # nor curriculum runs: finding 5
    assert (docs / "findings" / "tool_choice_selection.png").stat().st_size > 0


def test_jobs_and_smoke_arguments():
    names = [j.name for j in tool_choice.jobs([0, 1], [0, 1], 0.1, 16)]
    # the runs on the shipped seed-0 base first, those on the base pretrained meanwhile last
    assert names[:2] == ["choice_p0_s0", "choice_p0_s1"] and names[-2:] == ["choice_p1_s0", "choice_p1_s1"]
    assert "cost_s1" in names and "nocap_s0" in names and "curriculum_s1" in names
    curriculum = next(j for j in tool_choice.jobs([0], [0], 0.1, 16) if j.name == "curriculum_s0")
    assert curriculum.extra == ("--data.curriculum", json.dumps(tool_choice.CURRICULUM))
    nocap = next(j for j in tool_choice.jobs([0], [0], 0.1, 16) if j.name == "nocap_s0")
    assert nocap.budget == 16
    args = tool_choice.parse_args(["--smoke"])
    assert args.seeds == [0] and args.pseeds == [0] and args.steps == 2


def test_the_seed_0_and_1_bases_are_the_shipped_ones_unless_rebuilt(tmp_path):
    built = []

    def sweep(*flags):
        out = tool_choice.ChoiceSweep(tool_choice.parse_args(["--out", str(tmp_path), *flags]), tool_choice.CONFIG)
        out._run = lambda argv, log: built.append(argv[argv.index("--out") + 1]) or 0.0
        return out

    shipped = tool_choice.SHIPPED_BASES
    assert sweep().base("tools", 0) == shipped[0] and built == [str(shipped[0])]
    assert sweep().base("tools", 1) == shipped[1] and built[-1] == str(shipped[1])
    assert sweep().base("tools", 2) == tmp_path / "base_p2"
    assert sweep("--rebuild").base("tools", 1) == tmp_path / "base_p1"
    assert sweep("--rebuild").base("tools", 0) == tmp_path / "base_p0"
    assert sweep("--smoke").base("tools", 0) == tmp_path / "base_p0"
