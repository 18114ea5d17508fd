"""Renders the scaling report of ``zerotir.scaling.report``: the Figure 4 PNG, the fits PNG and the Markdown summary.

Figures are drawn with matplotlib's object API (``matplotlib.figure.Figure``, saved by the Agg canvas), never pyplot,
so the report changes no global backend state and runs headless.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from zerotir.scaling import fit as sf
from zerotir.scaling.runs import FITTED, PANELS, Run, smooth


BUCKET_LABELS = {"0": "0", "1": "1", "2": "2", "3plus": "3+"}


def _colors(runs: list[Run]) -> dict[str, str]:
    """One colour per run, the same in every panel (matplotlib's tab10 cycle)."""
    return {run.name: f"C{i % 10}" for i, run in enumerate(runs)}


def _legend(fig: Figure, runs: list[Run], colors: dict[str, str]) -> None:
    handles = [fig.axes[0].plot([], [], color=colors[run.name], label=run.name)[0] for run in runs]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(runs), 4), frameon=False)


def _missing(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="grey")


def _step_panel(ax, title: str) -> None:
    ax.set_title(title)
    ax.set_xlabel("training step")
    ax.grid(alpha=0.3)


def _logged(runs: list[Run], tag: str) -> Iterator[tuple[Run, pd.Series]]:
    """``(run, series)`` for every run that logged ``tag``."""
    for run in runs:
        series = run.get(tag)
        if series is not None and not series.empty:
            yield run, series


def plot_figure4(runs: list[Run], path: Path, smooth_weight: float, dpi: int = 120) -> None:
    """The paper's Figure 4 panels against training step, one line per run (raw values faint, smoothed line solid)."""

    colors = _colors(runs)
    fig = Figure(figsize=(13, 7.5), layout="constrained")
    axes = fig.subplots(2, 3).ravel()
    for ax, (_, tag, title) in zip(axes, PANELS):
        _step_panel(ax, title)
        logged = list(_logged(runs, tag))
        for run, series in logged:
            color = colors[run.name]
            if smooth_weight > 0:
                ax.plot(series.index, series.to_numpy(), color=color, alpha=0.25, linewidth=1)
            ax.plot(series.index, smooth(series, smooth_weight).to_numpy(), color=color, linewidth=1.8)
        if not logged:
            _missing(ax, f"{tag}\nnot logged")
    _legend(fig, runs, colors)
    fig.get_layout_engine().set(rect=(0, 0.05, 1, 0.95))
    fig.suptitle(f"ZeroTIR training dynamics (smoothing {smooth_weight:g})")
    fig.savefig(path, dpi=dpi)


def plot_fits(runs: list[Run], report: dict, path: Path, dpi: int = 120) -> None:
    """Accuracy and tool-call proportion with their fitted law per run; the share of correct trajectories by call
    count."""

    colors = _colors(runs)
    fig = Figure(figsize=(15, 4.8), layout="constrained")
    axes = fig.subplots(1, 3)
    for ax, (key, tag, title) in zip(axes, FITTED):
        _step_panel(ax, f"{title}: fitted law")
        logged = list(_logged(runs, tag))
        for run, series in logged:
            color = colors[run.name]
            ax.scatter(series.index, series.to_numpy(), s=9, color=color, alpha=0.45)
            fit = report["runs"][run.name]["fits"][key]
            if "skipped" not in fit:
                dense = np.linspace(float(series.index.min()), float(series.index.max()), 300)
                ax.plot(dense, sf.law(dense, fit["lo"], fit["hi"], fit["m"], fit["k"]), color=color, linewidth=2,
                        label=f"{run.name}: R²={fit['r2']:.3f}")
        if logged:
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
        else:
            _missing(ax, f"{tag}\nnot logged")
    _plot_call_shares(axes[2], runs, report, colors)
    fig.suptitle(f"law: {sf.LAW_FORMULA}", fontsize=10)
    fig.savefig(path, dpi=dpi)


def _plot_call_shares(ax, runs: list[Run], report: dict, colors: dict[str, str]) -> None:
    ax.set_title("correct trajectories by tool calls (all steps)")
    ax.set_xlabel("tool calls in the trajectory")
    ax.set_ylabel("share of correct trajectories")
    with_shares = [run for run in runs if (report["runs"][run.name]["correct_by_calls"] or {}).get("all_steps", {})
                   .get("total")]
    if not with_shares:
        _missing(ax, "no correct trajectory\ncounted")
        return
    width = 0.8 / len(with_shares)
    x = np.arange(len(sf.CALL_BUCKETS))
    for i, run in enumerate(with_shares):
        shares = report["runs"][run.name]["correct_by_calls"]["all_steps"]["shares"]
        ax.bar(x + (i - (len(with_shares) - 1) / 2) * width, [shares[b] for b in sf.CALL_BUCKETS], width,
               color=colors[run.name], label=run.name)
    ax.set_xticks(x, [BUCKET_LABELS[b] for b in sf.CALL_BUCKETS])
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)


def plot_groups(runs: list[Run], report: dict, path: Path, smooth_weight: float, dpi: int = 120) -> None:
    """Per ``--group-by`` key, rollout accuracy against step: one line per group, the mean of its runs' curves."""
    from zerotir import metric_names as mn

    by_name = {run.name: run for run in runs}
    keys = list(report["groups"])
    fig = Figure(figsize=(6 * len(keys), 4.5), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(keys)))
    for ax, key in zip(axes, keys):
        ax.set_title(f"accuracy by {key}")
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
        for i, (label, group) in enumerate(report["groups"][key]["groups"].items()):
            curves = [by_name[r["run"]].get(mn.ACCURACY) for r in group["runs"]]
            curves = [c for c in curves if c is not None and not c.empty]
            if not curves:
                continue
            mean = smooth(sum(curves) / len(curves), smooth_weight).dropna()
            ax.plot(mean.index, mean.to_numpy(), color=f"C{i % 10}", linewidth=1.8,
                    label=f"{label} ({len(curves)} run{'s' if len(curves) > 1 else ''})")
        ax.legend(fontsize=8)
    fig.savefig(path, dpi=dpi)


def _num(value, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def write_markdown(report: dict, path: Path) -> None:
    """A short Markdown summary of ``report`` (the dict written to scaling.json), linking the two figures."""
    runs = report["runs"]
    law = report["law"]
    lines = ["# Scaling report", ""]
    lines += _table(["run", "log folder", "steps", "logged steps"],
                    [[name, f"`{r['path']}`", "n/a" if r["steps"] is None else f"{r['steps'][0]}-{r['steps'][1]}",
                      str(r["num_steps"])] for name, r in runs.items()])
    lines += ["", f"## Training dynamics (the paper's Figure 4, smoothing {report['smooth']:g})", "",
              f"![Figure 4 panels]({report['figures']['metrics']})", "", "## Fitted law", "",
              f"{law['name']}: `{law['formula']}`, {law['fit']}.", ""]
    lines += [f"- `{p}`: {text}" for p, text in law["parameters"].items()] + [""]
    rows = []
    for name, r in runs.items():
        for key, fit in r["fits"].items():
            if "skipped" in fit:
                rows.append([name, key] + ["-"] * 4 + ["skipped", "-"])
            else:
                rows.append([name, key] + [_num(fit[p]) for p in ("lo", "hi", "m", "k")]
                            + [_num(fit["r2"], 4), str(fit["points"])])
    lines += _table(["run", "metric", "lo", "hi", "m", "k", "R^2", "points"], rows)
    lines += ["", f"![fits]({report['figures']['fits']})", "", "## Pearson correlation", ""]
    for name, r in runs.items():
        table = r["correlation"]
        if table is None:
            lines += [f"{name}: skipped (see notes).", ""]
            continue
        cols = list(table)
        rows = [[row] + [_num(table[row][c], 3) for c in cols] for row in cols]
        lines += [f"{name}:", ""] + _table([""] + cols, rows)
        lines.append("")
    lines += ["## Correct trajectories by number of tool calls", ""]
    rows = []
    for name, r in runs.items():
        for window, block in (r["correct_by_calls"] or {}).items():
            rows.append([name, window.replace("_", " "), str(block["total"])]
                        + [f"{_num(block['shares'][b])} ({block['counts'][b]})" for b in sf.CALL_BUCKETS])
    header = [f"share with {BUCKET_LABELS[b]} calls (count)" for b in sf.CALL_BUCKETS]
    lines += _table(["run", "window", "correct trajectories", *header], rows)
    for key, block in report.get("groups", {}).items():
        lines += ["", f"## Runs grouped by {key}", "", f"![groups]({report['figures']['groups']})", ""]
        lines += _table([key, "runs", f"final accuracy (last {block['last_n']} steps)", "calls per response",
                         f"steps to {block['fraction']:.0%} of plateau"],
                        [[label, str(len(g["runs"])), _num(g["final_accuracy"]), _num(g["calls_per_response"]),
                          _num(g["steps_to_fraction"])] for label, g in block["groups"].items()])
        closed = block.get("closed_form")
        if closed:
            fit = closed.get("fit")
            lines += ["", f"Closed form `{closed['formula']}`: " + (
                f"a={_num(fit['a'])}, b={_num(fit['b'])}, c={_num(fit['c'])}, R^2={_num(fit['r2'], 4)} on "
                f"{fit['points']} points; the per-run law on the same points: R^2={_num(closed['law_r2'], 4)}."
                if fit else f"not fitted ({closed.get('error')}).")]
    notes = [f"- {name}: {note}" for name, r in runs.items() for note in r["notes"]]
    if notes:
        lines += ["", "## Notes", ""] + notes
    path.write_text("\n".join(lines) + "\n")
