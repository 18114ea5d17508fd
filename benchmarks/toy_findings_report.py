"""docs/findings.md from the runs of ``toy_findings.py``: one row per finding, its measured evidence and a verdict.

The findings and their verdict rules are ``toy_findings_rules.py``; this file draws the figures with matplotlib's
object API into ``<docs>/findings/`` and writes the Markdown. The size and budget sweeps also get the scaling report
of ``python -m zerotir scaling --group-by`` (``zerotir.scaling.report``).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from benchmarks.toy_findings_rules import (
    GROUPS, RULES, SIZE_RUNS, TITLES, Runs, f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, fmt, seed_runs, size_runs,
)
from zerotir import metric_names as mn
from zerotir.scaling import fit as sf
from zerotir.scaling import laws
from zerotir.scaling.report import run_report
from zerotir.scaling.runs import Run
from zerotir.toy.mixed.design import check_design
from zerotir.toy.pretrain import read_info


# ---------------------------------------------------------------- figures


def _save(fig: Figure, path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return path.name


def fig_headline(result: dict, path: Path) -> str | None:
    rows = result.get("data")
    if not rows:
        return None
    fig = Figure(figsize=(7, 3.8), layout="constrained")
    ax = fig.subplots()
    x = np.arange(len(rows))
    for i, (key, label) in enumerate([("tir_easy", "ZeroTIR easy"), ("norl_easy", "ZeroRL easy"),
                                      ("tir_hard", "ZeroTIR hard"), ("norl_hard", "ZeroRL hard")]):
        ax.bar(x + (i - 1.5) * 0.2, [r[key] for r in rows], 0.2, label=label, color=f"C{i}")
    ax.set_xticks(x, [f"seed {r['seed']}" for r in rows])
    ax.set_ylabel("final held-out accuracy (greedy)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8, ncol=2)
    return _save(fig, path)


def fig_dynamics(runs: Runs, seeds: list[int], path: Path) -> str | None:
    per_seed = seed_runs(runs, seeds)
    if not per_seed:
        return None
    panels = [(mn.CODE_RATE, "code proportion (finding 1)"), (mn.CODE_IN_CORRECT, "code in correct (finding 2)"),
              (mn.REWARD_MEAN, "reward (finding 2)"), (mn.RESPONSE_LENGTH, "response length, tokens (finding 3)")]
    fig = Figure(figsize=(14, 3.6), layout="constrained")
    for ax, (tag, title) in zip(fig.subplots(1, 4), panels):
        for s, r in per_seed:
            series = r.get(tag)
            ax.plot(series.index, series.to_numpy(), color=f"C{s}", alpha=0.25)
            ax.plot(series.index, laws.smooth(series, 0.6).to_numpy(), color=f"C{s}", label=f"seed {s}")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
    fig.axes[0].legend(fontsize=8)
    return _save(fig, path)


def fig_curves(curves: dict[str, Run | None], tag: str, title: str, path: Path) -> str | None:
    present = {k: r for k, r in curves.items() if r is not None and r.get(tag) is not None}
    if not present:
        return None
    fig = Figure(figsize=(6.5, 4), layout="constrained")
    ax = fig.subplots()
    for i, (label, r) in enumerate(present.items()):
        series = r.get(tag)
        ax.plot(series.index, laws.smooth(series, 0.6).to_numpy(), color=f"C{i % 10}", label=label)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("RL step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


def fig_selective(runs: Runs, seeds: list[int], path: Path) -> str | None:
    per_seed = seed_runs(runs, seeds)
    if not per_seed:
        return None
    fig = Figure(figsize=(6.5, 4), layout="constrained")
    ax = fig.subplots()
    for s, r in per_seed:
        for g, style in (("easy", "--"), ("hard", "-")):
            series = r.get(f"heldout_{g}/code_rate")
            if series is not None:
                ax.plot(series.index, series.to_numpy(), style, marker="o", color=f"C{s}", label=f"seed {s} {g}")
    ax.set_title("held-out code rate, easy (dashed) vs hard (solid) (finding 8)", fontsize=10)
    ax.set_xlabel("RL step")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


def fig_prediction(runs: Runs, result: dict, path: Path) -> str | None:
    rows = [r for r in result.get("data", []) if "first_half_fit" in r]
    if not rows:
        return None
    cols = min(4, len(rows))
    fig = Figure(figsize=(3.6 * cols, 3.0 * math.ceil(len(rows) / cols)), layout="constrained")
    axes = np.atleast_1d(fig.subplots(math.ceil(len(rows) / cols), cols)).ravel()
    for ax, row in zip(axes, rows):
        acc = runs.get(row["run"]).get(mn.ACCURACY)
        fit = row["first_half_fit"]
        ax.scatter(acc.index, acc.to_numpy(), s=6, color="grey")
        dense = np.linspace(0, float(acc.index.max()), 200)
        ax.plot(dense, sf.law(dense, fit["lo"], fit["hi"], fit["m"], fit["k"]), color="C0")
        ax.axvline(row["split_step"], color="C3", linestyle=":")
        ax.set_title(f"{row['run']}: RMSE {row['rmse']:.3f} (flat {row['naive_rmse']:.3f})", fontsize=8)
    for ax in axes[len(rows):]:
        ax.set_visible(False)
    return _save(fig, path)


# ---------------------------------------------------------------- the report


def base_rows(out: Path) -> list[dict]:
    rows = []
    for size in ("small", "medium", "large"):
        info = read_info(out / f"base_{size}")
        if info is None:
            continue
        rec = info["record"]
        base = rec.get("base_stats", {})
        rows.append({"size": size, "params": rec["params"], "steps": rec["steps_done"],
                     "decay_reason": rec["decay_reason"], "minutes": rec["train_seconds"] / 60, "stats": base,
                     "design_problems": check_design(base) if set(GROUPS) <= set(base) else ["not measured"]})
    return rows


def write_report(out: Path, docs: Path, command: str, sweep_minutes: float, steps: int, seeds: list[int]) -> dict:
    """Compute every finding from the runs under ``out`` and write ``docs/findings.md`` and its figures."""
    runs = Runs(out)
    figs = docs / "findings"
    all_names = sorted(p.parent.name for p in out.glob("*/done.json"))
    measures = {0: lambda: f0(runs, seeds), 1: lambda: f1(runs, seeds), 2: lambda: f2(runs, seeds),
                3: lambda: f3(runs, seeds), 4: lambda: f4(runs, seeds), 5: lambda: f5(runs, seeds, steps),
                6: lambda: f6(runs, out, steps), 7: lambda: f7(runs), 8: lambda: f8(runs, seeds),
                9: lambda: f9(runs, [n for n in all_names if not n.startswith("norl")]), 10: lambda: f10(runs, out)}
    results = {}
    for k, measure in measures.items():
        try:
            results[k] = measure()
        except (ValueError, RuntimeError, KeyError, TypeError) as err:  # a short or broken run: said, not hidden
            results[k] = {"evidence": f"could not be measured: {type(err).__name__}: {err}",
                          "verdict": "not measured"}
    figures = {
        0: fig_headline(results[0], figs / "headline.png"),
        1: fig_dynamics(runs, seeds, figs / "dynamics.png"),
        5: fig_curves({n: runs.get(n) for n in all_names if n.startswith("tir_")}, mn.ACCURACY,
                      "rollout accuracy by algorithm (finding 5)", figs / "algorithms.png"),
        8: fig_selective(runs, seeds, figs / "selective.png"),
        9: fig_prediction(runs, results[9], figs / "prediction.png"),
    }
    figures[2] = figures[3] = figures[1]
    sized = [SIZE_RUNS[s] for s in size_runs(runs)]
    for key, names, sub in (("params", sized, "sizes"),
                            ("model.tool.max_tool_calls", ["budget1_s0", "budget2_s0", "tir_rpp_s0"], "budgets")):
        if names and runs.all(names) is not None:
            run_report([str(out / n / "tensorboard") for n in names], figs / sub, group_by=[key], last_n=5)
            figures[6 if sub == "sizes" else 7] = f"{sub}/groups.png"
    figures[10] = figures.get(6)
    (figs).mkdir(parents=True, exist_ok=True)
    (figs / "findings.json").write_text(json.dumps({"results": results, "bases": base_rows(out)}, indent=2,
                                                   default=_json) + "\n")
    text = markdown(results, figures, base_rows(out), command, sweep_minutes, steps, seeds, out)
    (docs / "findings.md").write_text(text)
    return results


def _json(value):
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, np.bool_):
        return bool(value)
    raise TypeError(f"not JSON: {type(value)}")


def markdown(results: dict, figures: dict, bases: list[dict], command: str, sweep_minutes: float, steps: int,
             seeds: list[int], out: Path) -> str:
    load = os.getloadavg()
    job_minutes = sum(json.loads(p.read_text())["seconds"] for p in out.glob("*/done.json")) / 60
    base_minutes = sum(b["minutes"] for b in bases)
    how = (f"Report of the runs in `{out}`, written by `{command}`" if "--report-only" in command else
           f"Produced by `{command}` ({sweep_minutes:.0f} min of sweep)")
    lines = ["# The paper's findings in the mixed toy world", "",
             f"{how}. Job time: {base_minutes:.0f} min of base pretraining and {job_minutes:.0f} min of RL runs "
             f"(up to 3 jobs at a time, one thread each, on {len(os.sched_getaffinity(0))} cores; load "
             f"average at the end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}).", "",
             "The world (`configs/toy_mixed.yaml`, docs/toy_mixed.md): easy questions a tiny base answers in text "
             "(1-digit sums and the times table), hard ones it cannot (3-digit products, `a * b + c`), "
             f"a budget of 4 calls, REINFORCE++ unless said otherwise, {steps} RL steps of 16 prompts x 8 samples, "
             f"RL seeds {', '.join(map(str, seeds))} on one shared base per size. Held-out accuracy and code rate: "
             "the last greedy validation on 128 easy and 128 hard questions. Curves over steps are the training "
             "rollouts (temperature 1); a run's \"plateau\" is its last 5 steps, which is where a run of this length "
             "stops, not necessarily where it would level off. Each verdict follows the rule in its row, computed "
             "from the logs.", "",
             "| # | finding | evidence | rule | verdict |", "|---|---|---|---|---|"]
    for k in sorted(TITLES):
        res = results.get(k) or {}
        fig = f" ![fig](findings/{figures[k]})" if figures.get(k) else ""
        lines.append(f"| {k} | {TITLES[k]} | {res.get('evidence', 'runs missing')}{fig} | {RULES[k]} | "
                     f"**{res.get('verdict', 'not measured')}** |")
    lines += ["", "## Bases at RL step 0", "",
              "Measured with the real tool loop, one sample per held-out question at temperature 1 (64 easy, 64 "
              "hard); the design check is `zerotir.toy.mixed.design.check_design`.", "",
              "| size | params | pretraining steps (end by) | minutes | easy text acc | easy acc | hard acc | code rate "
              "easy / hard | code right when used | design |", "|---|---|---|---|---|---|---|---|---|---|"]
    for b in bases:
        st = b["stats"]
        e, h = st.get("easy", {}), st.get("hard", {})
        lines.append(f"| {b['size']} | {b['params'] / 1e6:.2f}M | {b['steps']} ({b['decay_reason']}) | "
                     f"{b['minutes']:.1f} | {fmt(e.get('accuracy_no_code'), '.2f')} | {fmt(e.get('accuracy'), '.2f')} | "
                     f"{fmt(h.get('accuracy'), '.2f')} | {fmt(e.get('code_rate'), '.2f')} / {fmt(h.get('code_rate'), '.2f')}"
                     f" | {fmt(e.get('code_run_accuracy'), '.2f')} / {fmt(h.get('code_run_accuracy'), '.2f')} | "
                     f"{'; '.join(b['design_problems']) or 'meets it'} |")
    lines += ["", "## Figures", ""]
    seen = []
    for k, name in sorted(figures.items()):
        if name and name not in seen:
            seen.append(name)
            lines += [f"Finding {k}: ![finding {k}](findings/{name})", ""]
    lines += ["The size and budget sweeps also have the full scaling report (`python -m zerotir scaling --group-by "
              "params` / `--group-by model.tool.max_tool_calls`): findings/sizes/scaling.md, "
              "findings/budgets/scaling.md. Numbers: findings/findings.json."]
    return "\n".join(lines) + "\n"
