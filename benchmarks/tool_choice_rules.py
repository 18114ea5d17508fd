"""The findings of ``tool_choice.py`` computed from its runs: one function per finding, each returning
its evidence and a verdict by the rule written in ``RULES`` before any run, and the docs/findings.md section with
its figures. A finding whose runs are missing is "not measured".

Every number is read from the training rollouts' tags of ``zerotir.choice_metrics`` (``kinds/<kind>/...``), the
start as the mean of the first ``HEAD`` logged steps, the end as the mean of the last ``TAIL``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from benchmarks.toy_findings_rules import Runs, spread, verdict
from zerotir import metric_names as mn
from zerotir.scaling.runs import Run
from zerotir.toy.choice.tasks import ANSWERING, KINDS

HEAD, TAIL = 3, 5
START, END = "<!-- tool_choice:start -->", "<!-- tool_choice:end -->"
RULES = {
    1: "share of answers whose first call can answer the question (a computing tool or none on easy sums, either "
       "computing tool on products, search on lookups and combined questions), end of run, per kind; reproduced if "
       ">= 0.9 on every kind in every base x RL seed run, not reproduced if in none, else mixed",
    2: "on combined questions at the end of run: share of correct answers that called two different tools, and "
       "accuracy; reproduced if >= 0.8 with accuracy >= 0.5 in every run, not reproduced if < 0.2 in every run, "
       "else mixed",
    3: "cost arm against the reference of the same RL seed: calls per answer on easy sums at the end lower, and "
       "accuracy over the four kinds at most 0.05 lower; reproduced in every seed / in none / else mixed",
    4: "budget raised to 16 calls: calls per answer over the run's last steps <= 3 and no step's mean above 4 (the "
       "need is 2); reproduced in every seed / in none / else mixed",
    5: "steps until the 3-step rolling accuracy on combined questions reaches 0.8 (never: the run length), "
       "curriculum against the reference of the same RL seed; reproduced if the curriculum is faster in most seeds "
       "and on average, not reproduced if the reference is faster in most seeds, else mixed",
}
TITLES = {1: "selection: the right tool first on every kind", 2: "coordination: search, then a computing tool",
          3: "a cost per call cuts calls on easy questions, accuracy holds", 4: "no cap: calls stay bounded",
          5: "curriculum: single-tool kinds first reach 80% on combined questions sooner"}


def kind_series(run: Run, kind: str, metric: str) -> pd.Series | None:
    return run.get(mn.kind_tag(kind, metric))


def right_first(run: Run, kind: str) -> pd.Series | None:
    """Per step, the share of ``kind``'s answers whose first call can answer it (a label never first: 0)."""
    steps = kind_series(run, kind, "answers")
    if steps is None or steps.empty:
        return None
    total = pd.Series(0.0, index=steps.index)
    for label in ANSWERING[kind]:
        part = kind_series(run, kind, f"first_{label}")
        if part is not None:
            total = total.add(part.reindex(steps.index).fillna(0.0), fill_value=0.0)
    return total


def head(s: pd.Series) -> float:
    return float(s.iloc[:HEAD].mean())


def tail(s: pd.Series) -> float:
    return float(s.iloc[-TAIL:].mean())


def reference_runs(runs: Runs, seeds: list[int], pseeds: list[int]) -> list[tuple[str, Run]]:
    return [(f"p{p} s{s}", r) for p in pseeds for s in seeds if (r := runs.get(f"choice_p{p}_s{s}")) is not None]


def f1(ref: list[tuple[str, Run]]) -> dict:
    rows = []
    for label, run in ref:
        series = {k: right_first(run, k) for k in KINDS}
        if any(s is None for s in series.values()):
            continue
        rows.append({"run": label, **{f"{k}_start": head(s) for k, s in series.items()},
                     **{f"{k}_end": tail(s) for k, s in series.items()}})
    if not rows:
        return {}
    ok = [all(r[f"{k}_end"] >= 0.9 for k in KINDS) for r in rows]
    ev = "; ".join(f"{k}: start {spread([r[f'{k}_start'] for r in rows])}, end {spread([r[f'{k}_end'] for r in rows])}"
                   for k in KINDS)
    return {"evidence": ev, "verdict": verdict(all(ok), not any(ok)), "data": rows}


def f2(ref: list[tuple[str, Run]]) -> dict:
    rows = []
    for label, run in ref:
        two, acc = (kind_series(run, "combined", m) for m in ("two_tools_in_correct", "accuracy"))
        if two is not None and acc is not None:
            rows.append({"run": label, "two_tools": tail(two), "accuracy": tail(acc)})
    if not rows:
        return {}
    ok = [r["two_tools"] >= 0.8 and r["accuracy"] >= 0.5 for r in rows]
    ev = (f"two tools in correct {spread([r['two_tools'] for r in rows])}; combined accuracy "
          f"{spread([r['accuracy'] for r in rows])}")
    return {"evidence": ev, "verdict": verdict(all(ok), all(r["two_tools"] < 0.2 for r in rows)), "data": rows}


def mean_accuracy(run: Run) -> float | None:
    values = [kind_series(run, k, "accuracy") for k in KINDS]
    return None if any(v is None for v in values) else float(np.mean([tail(v) for v in values]))


def f3(runs: Runs, seeds: list[int]) -> dict:
    rows = []
    for s in seeds:
        base, cost = runs.get(f"choice_p0_s{s}"), runs.get(f"cost_s{s}")
        if base is None or cost is None:
            continue
        calls = [kind_series(r, "easy", "calls_per_response") for r in (base, cost)]
        accs = [mean_accuracy(r) for r in (base, cost)]
        if any(c is None for c in calls) or None in accs:
            continue
        rows.append({"seed": s, "easy_calls": tail(calls[0]), "easy_calls_cost": tail(calls[1]),
                     "accuracy": accs[0], "accuracy_cost": accs[1]})
    if not rows:
        return {}
    ok = [r["easy_calls_cost"] < r["easy_calls"] and r["accuracy_cost"] >= r["accuracy"] - 0.05 for r in rows]
    ev = (f"easy calls per answer: cost 0 {spread([r['easy_calls'] for r in rows])}, with cost "
          f"{spread([r['easy_calls_cost'] for r in rows])}; accuracy: cost 0 {spread([r['accuracy'] for r in rows])}, "
          f"with cost {spread([r['accuracy_cost'] for r in rows])}")
    return {"evidence": ev, "verdict": verdict(all(ok), not any(ok)), "data": rows}


def f4(runs: Runs, seeds: list[int]) -> dict:
    rows = [{"seed": s, "end": tail(c), "max": float(c.max())} for s in seeds
            if (r := runs.get(f"nocap_s{s}")) is not None and (c := r.get(mn.CALLS_PER_RESPONSE)) is not None]
    if not rows:
        return {}
    ok = [r["end"] <= 3 and r["max"] <= 4 for r in rows]
    ev = f"calls per answer at the end {spread([r['end'] for r in rows])}; highest step {spread([r['max'] for r in rows])}"
    return {"evidence": ev, "verdict": verdict(all(ok), not any(ok)), "data": rows}


def steps_to(series: pd.Series | None, length: int, level: float = 0.8) -> int:
    """The first step whose 3-step rolling mean reaches ``level``; ``length`` when none does."""
    if series is None or series.empty:
        return length
    hit = series.rolling(3, min_periods=3).mean() >= level
    return int(hit.idxmax()) if hit.any() else length


def f5(runs: Runs, seeds: list[int]) -> dict:
    rows = []
    for s in seeds:
        base, cur = runs.get(f"choice_p0_s{s}"), runs.get(f"curriculum_s{s}")
        if base is None or cur is None or base.get(mn.ACCURACY) is None or cur.get(mn.ACCURACY) is None:
            continue
        length = int(max(base.get(mn.ACCURACY).index.max(), cur.get(mn.ACCURACY).index.max()))
        rows.append({"seed": s, "uniform": steps_to(kind_series(base, "combined", "accuracy"), length),
                     "curriculum": steps_to(kind_series(cur, "combined", "accuracy"), length)})
    if not rows:
        return {}
    faster = sum(r["curriculum"] < r["uniform"] for r in rows)
    slower = sum(r["curriculum"] > r["uniform"] for r in rows)
    on_average = np.mean([r["curriculum"] for r in rows]) < np.mean([r["uniform"] for r in rows])
    ev = (f"steps to 80%: uniform {spread([r['uniform'] for r in rows], 1)}, curriculum "
          f"{spread([r['curriculum'] for r in rows], 1)}")
    result = "reproduced" if faster > len(rows) / 2 and on_average else \
        "not reproduced" if slower > len(rows) / 2 else "mixed"
    return {"evidence": ev, "verdict": result, "data": rows}


def fig_selection(ref: list[tuple[str, Run]], path: Path) -> str | None:
    """The right-first share per kind over steps, each reference run a thin line."""
    if not ref:
        return None
    fig = Figure(figsize=(8, 3.6), layout="constrained")
    axes = fig.subplots(1, len(KINDS), sharey=True)
    for ax, kind in zip(axes, KINDS):
        for _, run in ref:
            s = right_first(run, kind)
            if s is not None:
                ax.plot(s.index, s.values, lw=0.8)
        ax.set_title(kind)
        ax.set_xlabel("RL step")
        ax.axhline(0.9, color="grey", ls=":")
    axes[0].set_ylabel("right tool first")
    axes[0].set_ylim(0, 1.02)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path.name


def section(results: dict[int, dict], command: str, swept: dict | None, figure: str | None) -> str:
    """The docs/findings.md section of this sweep (between ``START`` and ``END``)."""
    when = f"{swept['ended']}, {swept['minutes']} min" if swept else "runs already there"
    lines = [START, "## Tool choice (`tools` world)", "",
             f"`{command}` ({when}); rules written before the run in `benchmarks/tool_choice_rules.py`.", "",
             "| # | finding | rule | evidence | verdict |", "|---|---|---|---|---|"]
    for n in sorted(RULES):
        r = results.get(n) or {}
        lines.append(f"| {n} | {TITLES[n]} | {RULES[n]} | {r.get('evidence') or '-'} | "
                     f"{r.get('verdict', 'not measured')} |")
    if figure:
        lines += ["", f"![right tool first per kind](findings/{figure})"]
    return "\n".join(lines + [END]) + "\n"


def write_report(out: Path, docs: Path, command: str, swept: dict | None, seeds: list[int],
                 pseeds: list[int]) -> Path:
    """Compute the findings from the runs under ``out`` and put their section into ``docs/findings.md`` (replacing
    this sweep's previous section, the rest of the file untouched); returns the file."""

    runs = Runs(out)
    ref = reference_runs(runs, seeds, pseeds)
    results = {1: f1(ref), 2: f2(ref), 3: f3(runs, seeds), 4: f4(runs, seeds), 5: f5(runs, seeds)}
    figure = fig_selection(ref, docs / "findings" / "tool_choice_selection.png")
    target = docs / "findings.md"
    text = target.read_text() if target.is_file() else ""
    new = section(results, command, swept, figure)
    if START in text and END in text:
        before, _, rest = text.partition(START)
        text = before + new.rstrip("\n") + rest.partition(END)[2]
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + new
    target.write_text(text)
    return target
