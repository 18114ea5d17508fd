"""docs/findings.md from the runs of ``toy_findings.py``: one row per finding, its measured evidence and a verdict.

The findings and their verdict rules are ``toy_findings_rules.py``; this file draws the figures with matplotlib's
object API into ``<docs>/findings/`` and writes the Markdown. The size and budget sweeps also get the scaling report
of ``zerotir.scaling.report`` (``python -m zerotir scaling``), grouped by size and by budget.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from benchmarks.toy_findings import SIZES, base_name
from benchmarks.toy_findings_rules import (
    GROUPS, RULES, TITLES, Runs, f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, fmt, mean_ci, reference, size_runs, tir,
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
    fig = Figure(figsize=(8, 3.8), layout="constrained")
    ax = fig.subplots()
    x = np.arange(len(rows))
    bars = [(f"{arm}_{g}", f"{name} {g}") for g in GROUPS for arm, name in (("tir", "ZeroTIR"), ("norl", "ZeroRL"))]
    width = 0.8 / len(bars)
    for i, (key, label) in enumerate(bars):
        ax.bar(x + (i - (len(bars) - 1) / 2) * width, [r[key] for r in rows], width, label=label, color=f"C{i}")
    ax.set_xticks(x, [f"seed {r['seed']}" for r in rows])
    ax.set_ylabel("final held-out accuracy (greedy)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8, ncol=2)
    return _save(fig, path)


def fig_dynamics(ref: list[tuple[str, Run]], path: Path) -> str | None:
    if not ref:
        return None
    panels = [(mn.TOOL_CALL_RATE, "code proportion (finding 1)"), (mn.TOOL_IN_CORRECT, "code in correct (finding 2)"),
              (mn.REWARD_MEAN, "reward (finding 2)"), (mn.RESPONSE_LENGTH, "response length, tokens (finding 3)")]
    fig = Figure(figsize=(14, 3.6), layout="constrained")
    for ax, (tag, title) in zip(fig.subplots(1, 4), panels):
        for i, (label, r) in enumerate(ref):
            series = r.get(tag)
            ax.plot(series.index, series.to_numpy(), color=f"C{i}", alpha=0.2)
            ax.plot(series.index, laws.smooth(series, 0.6).to_numpy(), color=f"C{i}", label=label)
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


def fig_selective(ref: list[tuple[str, Run]], path: Path) -> str | None:
    if not ref:
        return None
    fig = Figure(figsize=(6.5, 4), layout="constrained")
    ax = fig.subplots()
    for i, (label, r) in enumerate(ref):
        for g, style in (("easy", "--"), ("hard", "-"), ("multi", ":")):
            series = r.get(f"heldout_{g}/{mn.EVAL_TOOL_CALL_RATE}")
            if series is not None:
                ax.plot(series.index, series.to_numpy(), style, marker="o", color=f"C{i}", label=f"{label} {g}")
    ax.set_title("held-out code rate: easy dashed, hard solid, multi-step dotted (finding 8)", fontsize=10)
    ax.set_xlabel("RL step")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


def fig_groups(result: dict, ylabel: str, title: str, path: Path) -> str | None:
    """Findings 6 and 7: every run's value by group, with the group's mean and 95% confidence interval."""
    groups = result.get("data")
    if not groups or not isinstance(groups, dict):
        return None
    fig = Figure(figsize=(6.5, 4), layout="constrained")
    ax = fig.subplots()
    for i, (name, values) in enumerate(groups.items()):
        v = np.asarray(values, dtype=float)
        ax.scatter(np.full(len(v), i) + np.linspace(-0.12, 0.12, len(v)), v, color=f"C{i}", alpha=0.6)
        mean, half = mean_ci(v)  # the interval the evidence gives (``spread``)
        ax.errorbar([i + 0.3], [mean], yerr=[half], fmt="o", color="black", capsize=4)
    ax.set_xticks(range(len(groups)), list(groups))
    ax.set_ylabel(ylabel)
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, axis="y")
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


def base_rows(out: Path, pseeds: list[int]) -> list[dict]:
    rows = []
    for size in SIZES:
        for pseed in pseeds:
            info = read_info(out / base_name(size, pseed))
            if info is None:
                continue
            rec = info["record"]
            base = rec.get("base_stats", {})
            rows.append({"size": size, "pseed": pseed, "params": rec["params"], "steps": rec["steps_done"],
                         "decay_reason": rec["decay_reason"], "minutes": rec["train_seconds"] / 60, "stats": base,
                         "design_problems": check_design(base) if set(GROUPS) <= set(base) else ["not measured"]})
    return rows


def write_report(out: Path, docs: Path, command: str, swept: dict | None, steps: int, seeds: list[int],
                 pseeds: list[int]) -> dict:
    """Compute every finding from the runs under ``out`` and write ``docs/findings.md`` and its figures.

    ``swept``: the sweep's record (``command``, wall ``minutes``, ``ended``), None when the runs' sweep wrote none.
    """
    runs = Runs(out)
    figs = docs / "findings"
    all_names = sorted(p.parent.name for p in out.glob("*/done.json"))
    ref = reference(runs, seeds, pseeds)
    measures = {0: lambda: f0(runs, seeds), 1: lambda: f1(ref), 2: lambda: f2(ref), 3: lambda: f3(ref),
                4: lambda: f4(ref), 5: lambda: f5(runs, seeds, steps), 6: lambda: f6(runs, out, seeds, pseeds),
                7: lambda: f7(runs, seeds), 8: lambda: f8(ref),
                9: lambda: f9(runs, [n for n in all_names if not n.startswith("norl")]),
                10: lambda: f10(runs, out, seeds, pseeds)}
    results = {}
    for k, measure in measures.items():
        try:
            results[k] = measure()
        except (ValueError, RuntimeError, KeyError, TypeError) as err:  # a short or broken run: said, not hidden
            results[k] = {"evidence": f"could not be measured: {type(err).__name__}: {err}",
                          "verdict": "not measured"}
    figures = {
        0: fig_headline(results[0], figs / "headline.png"),
        1: fig_dynamics(ref, figs / "dynamics.png"),
        5: fig_curves({n: runs.get(n) for n in all_names if n.startswith(("tir_medium_p0", "ppo_"))}, mn.ACCURACY,
                      "rollout accuracy: REINFORCE++ (tir_*) and PPO (finding 5)", figs / "algorithms.png"),
        6: fig_groups(results[6], "final greedy accuracy, long multi-step split", "by base size, every run (finding 6)",
                      figs / "sizes.png"),
        7: fig_groups(results[7], "final greedy multi-step accuracy", "by call budget, every run (finding 7)",
                      figs / "budgets.png"),
        8: fig_selective(ref, figs / "selective.png"),
        9: fig_prediction(runs, results[9], figs / "prediction.png"),
    }
    figures[2] = figures[3] = figures[1]
    sized = [r.name for rs in size_runs(runs, seeds, pseeds).values() for r in rs]
    budgets = [n for s in seeds for n in (f"budget1_s{s}", f"budget2_s{s}", tir("medium", 0, s))]
    for key, names, sub in (("params", sized, "sizes"), ("model.tool.max_tool_calls", budgets, "budgets")):
        if names and runs.all(names) is not None:
            run_report([str(out / n / "tensorboard") for n in names], figs / sub, group_by=[key], last_n=5)
    figures[10] = "sizes/groups.png" if (figs / "sizes" / "groups.png").is_file() else None
    figs.mkdir(parents=True, exist_ok=True)
    bases = base_rows(out, pseeds)
    (figs / "findings.json").write_text(json.dumps({"results": results, "bases": bases}, indent=2,
                                                   default=_json) + "\n")
    (docs / "findings.md").write_text(markdown(results, figures, bases, command, swept, steps, seeds, pseeds, out))
    return results


def _json(value):
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, np.bool_):
        return bool(value)
    raise TypeError(f"not JSON: {type(value)}")


def markdown(results: dict, figures: dict, bases: list[dict], command: str, swept: dict | None, steps: int,
             seeds: list[int], pseeds: list[int], out: Path) -> str:
    load = os.getloadavg()
    job_minutes = sum(json.loads(p.read_text())["seconds"] for p in out.glob("*/done.json")) / 60
    base_minutes = sum(b["minutes"] for b in bases)
    if swept is None:
        how = f"Report of the runs in `{out}`, written by `{command}` (their sweep recorded no wall time)"
    elif swept["command"] == command:
        how = f"Produced by `{command}` ({swept['minutes']:.0f} min of sweep, ended {swept['ended']})"
    else:
        how = (f"Runs of `{swept['command']}` ({swept['minutes']:.0f} min of sweep, ended {swept['ended']}); report "
               f"written by `{command}`")
    lines = ["# The paper's findings in the mixed toy world", "",
             f"{how}. Job time: {base_minutes:.0f} min of base pretraining and {job_minutes:.0f} min of RL runs "
             f"(up to 3 jobs at a time, one thread each, on {len(os.sched_getaffinity(0))} cores; load "
             f"average at the end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}).", "",
             "The world (`configs/toy_multi.yaml`, docs/toy_mixed.md): easy questions a tiny base answers in text "
             "(1-digit sums and the times table), hard ones it cannot (3-digit products, `a * b + c`) and "
             "multi-step ones whose reliable answer takes two calls (the digit sum of a 2- or 3-digit product: the "
             "product, then the sum of the digits read off its output), and a held-out split of the same two steps "
             "on 4-digit products that no document or training question asks (`long`, the split with headroom); "
             "a budget of 4 calls, REINFORCE++ unless "
             f"said otherwise, {steps} RL steps of 16 prompts x 8 samples. Bases of 3 sizes, each pretrained with "
             f"seeds {', '.join(map(str, pseeds))}; RL seeds {', '.join(map(str, seeds))} on each. Held-out accuracy "
             "and code rate: the last greedy validation on 128 questions of each split. Curves "
             "over steps are the training rollouts (temperature 1). A number given as `mean (95% CI low to "
             "high; range min to max; n)` is the mean over n runs, the t interval of that mean and the runs' range; "
             "the "
             "findings about one run's dynamics (1-4, 8) read the medium base's runs of both pretraining seeds. "
             "Each verdict follows the rule in its row, computed from the logs.", "",
             "| # | finding | evidence | rule | verdict |", "|---|---|---|---|---|"]
    for k in sorted(TITLES):
        res = results.get(k) or {}
        fig = f" ![fig](findings/{figures[k]})" if figures.get(k) else ""
        lines.append(f"| {k} | {TITLES[k]} | {res.get('evidence', 'runs missing')}{fig} | {RULES[k]} | "
                     f"**{res.get('verdict', 'not measured')}** |")
    lines += ["", "## Bases at RL step 0", "",
              "Measured with the real tool loop, one sample per held-out question at temperature 1 (64 of each "
              "group); the design check is `zerotir.toy.mixed.design.check_design`.", "",
              "| size | pretraining seed | params | pretraining steps (end by) | minutes | easy text acc | easy acc | "
              "hard acc | multi-step acc | long acc | two calls or more on multi-step | code rate easy / hard | "
              "design |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for b in bases:
        st = b["stats"]
        e, h, m, long = st.get("easy", {}), st.get("hard", {}), st.get("multi", {}), st.get("long", {})
        lines.append(f"| {b['size']} | {b['pseed']} | {b['params'] / 1e6:.2f}M | {b['steps']} ({b['decay_reason']}) | "
                     f"{b['minutes']:.1f} | {fmt(e.get('accuracy_no_code'), '.2f')} | "
                     f"{fmt(e.get('accuracy'), '.2f')} | "
                     f"{fmt(h.get('accuracy'), '.2f')} | {fmt(m.get('accuracy'), '.2f')} | "
                     f"{fmt(long.get('accuracy'), '.2f')} | "
                     f"{fmt(m.get('multi_call_rate'), '.2f')} | {fmt(e.get('code_rate'), '.2f')} / "
                     f"{fmt(h.get('code_rate'), '.2f')} | {'; '.join(b['design_problems']) or 'meets it'} |")
    lines += ["", "## Figures", ""]
    seen = []
    for k, name in sorted(figures.items()):
        if name and name not in seen:
            seen.append(name)
            lines += [f"Finding {k}: ![finding {k}](findings/{name})", ""]
    lines += ["The size and budget sweeps also have the full scaling report (`zerotir.scaling.report` over the "
              "sweep's runs, grouped by `params` / `model.tool.max_tool_calls`): findings/sizes/scaling.md, "
              "findings/budgets/scaling.md. Numbers: findings/findings.json."]
    return "\n".join(lines) + "\n"
