"""``python -m zerotir scaling``: the scaling report of one or several RL runs, read from their TensorBoard logs.

Writes into ``--out``:
  * ``figure4.png``: the paper's Figure 4 panels against training step (avg repeat score, response length, raw
    reward, tool calls per response, tool in correct, tool-call proportion: the paper's code count, code in
    correct and code proportion, over calls to any tool), one line per run, smoothed like TensorBoard
    (raw values faint);
  * ``fits.png``: accuracy and tool-call proportion with the fitted law (``zerotir.scaling.fit``), and the share of
    correct trajectories by number of tool calls;
  * ``scaling.json``: the law, per run the fitted parameters with R^2, the Pearson correlation table of steps,
    tool-call proportion, response length and accuracy, the call shares over the run and over its last N steps, and
    a note for every part skipped;
  * ``scaling.md``: the same in short, with the two figures;
  * with ``--group-by KEY`` (a dotted config key such as ``model.tool.max_tool_calls``, or ``params`` for model size):
    ``groups.png`` and a ``groups`` section: per value, final accuracy, calls per response and steps to 80% of the
    accuracy plateau averaged over its runs; by ``params`` also the closed form
    ``sigmoid(a ln N + b sqrt(T) - c L)`` fitted across the runs, against the per-run law (``zerotir.scaling.groups``).

A missing tag or a run too short to fit skips that part with a note; it never stops the report.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import numpy as np

from zerotir import metric_names as mn
from zerotir.scaling import fit as sf
from zerotir.scaling.runs import (  # noqa: F401  (the report's inputs, also re-exported)
    CALL_TAGS, CORRELATED, EVENT_PREFIX, FITTED, PANELS, Run, ScalingInputError, discover_runs, load_run, load_runs,
    smooth, split_label,
)


def _clean(value):
    """Replaces NaN/inf (not valid JSON) by None, recursively."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def analyse_run(run: Run, last_n: int) -> dict:
    """The report of one run: panels present, fits, correlation table and call shares, a note for each part skipped."""
    notes: list[str] = []
    steps = sorted(set().union(*(set(s.index) for s in run.scalars.values()))) if run.scalars else []
    panels = {}
    for key, tag, _ in PANELS:
        series = run.get(tag)
        if series is None or series.empty:
            notes.append(f"panel {key}: tag {tag} not logged; panel skipped")
            continue
        panels[key] = {"tag": tag, "points": len(series), "first": series.iloc[0], "last": series.iloc[-1]}
    fits = {}
    for key, tag, _ in FITTED:
        series = run.get(tag)
        try:
            if series is None:
                raise ValueError(f"tag {tag} not logged")
            fits[key] = {"tag": tag, **sf.fit_law(series.index.to_numpy(), series.to_numpy()).to_dict()}
        except (ValueError, RuntimeError) as err:
            fits[key] = {"tag": tag, "skipped": str(err)}
            notes.append(f"fit {key}: {err}; fit skipped")
    correlation = _correlation(run, notes)
    shares = _shares(run, last_n, notes)
    return {"path": str(run.path), "steps": [int(steps[0]), int(steps[-1])] if steps else None, "num_steps": len(steps),
            "panels": panels, "fits": fits, "correlation": correlation, "correct_by_calls": shares, "notes": notes}


def _correlation(run: Run, notes: list[str]) -> dict | None:
    columns = {key: run.get(tag) for key, tag in CORRELATED}
    missing = [f"{key} ({mn_tag})" for (key, mn_tag) in CORRELATED if columns[key] is None]
    if missing:
        notes.append(f"correlation: {', '.join(missing)} not logged; table skipped")
        return None
    try:
        table = sf.correlation_table(columns)
    except ValueError as err:
        notes.append(f"correlation: {err}; table skipped")
        return None
    if table.isna().to_numpy().any():
        notes.append("correlation: a constant series has no correlation; those entries are null")
    return {row: {col: table.loc[row, col] for col in table.columns} for row in table.index}


def _shares(run: Run, last_n: int, notes: list[str]) -> dict | None:
    counts = {bucket: run.get(tag) for bucket, tag in CALL_TAGS.items() if run.get(tag) is not None}
    if not counts:
        notes.append(f"correct_by_calls: none of {', '.join(mn.CORRECT_BY_CALLS)} logged; shares skipped")
        return None
    if len(counts) < len(CALL_TAGS):
        absent = [tag for bucket, tag in CALL_TAGS.items() if bucket not in counts]
        notes.append(f"correct_by_calls: {', '.join(absent)} not logged; counted as 0")
    result = {"all_steps": sf.call_shares(counts), f"last_{last_n}_steps": sf.call_shares(counts, last_n=last_n)}
    if result["all_steps"]["total"] == 0:
        notes.append("correct_by_calls: no correct trajectory counted; shares are null")
    return result


def build_report(runs: list[Run], last_n: int, smooth_weight: float, group_by: list[str] = ()) -> dict:
    """The whole JSON report (before NaN cleaning) for ``runs``."""
    from zerotir.scaling.groups import analyse_groups

    groups = {key: analyse_groups(runs, key, last_n) for key in group_by}
    return {
        "law": {"name": sf.LAW_NAME, "formula": sf.LAW_FORMULA, "parameters": sf.LAW_PARAMETERS,
                "fit": "scipy.optimize.curve_fit, bounded trust-region, best of several starts; R^2 on the raw points"},
        "smooth": smooth_weight,
        "last_n": last_n,
        "figures": {"metrics": "figure4.png", "fits": "fits.png"},
        "runs": {run.name: analyse_run(run, last_n) for run in runs},
        **({"groups": groups} if groups else {}),
    }


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m zerotir scaling",
        description="The scaling report of RL runs from their TensorBoard logs: figure4.png, fits.png, scaling.json, "
                    "scaling.md.")
    parser.add_argument("--logdir", nargs="+", action="extend", required=True,
                        help="TensorBoard log dir of a run, or a parent of several run dirs (repeatable); "
                             "LABEL=PATH names a single run LABEL in the legend")
    parser.add_argument("--out", default=None, help="output folder (default: <first logdir>/scaling)")
    parser.add_argument("--smooth", type=float, default=0.6,
                        help="TensorBoard-style smoothing weight in [0, 1) for the plotted lines; fits use raw values")
    parser.add_argument("--last-n", type=int, default=10,
                        help="the call shares are also reported over the last N logged steps (N >= 1)")
    parser.add_argument("--dpi", type=int, default=120, help="resolution of the PNGs")
    parser.add_argument("--group-by", nargs="+", action="extend", default=[], dest="group_by",
                        help="group the runs by a dotted config key (model.tool.max_tool_calls, model.rl.algorithm) "
                             "or by 'params' (model size); repeatable; writes groups.png")
    args = parser.parse_args(argv)
    if not 0.0 <= args.smooth < 1.0:
        parser.error(f"--smooth must be in [0, 1), got {args.smooth}")
    if args.last_n < 1:
        parser.error(f"--last-n must be >= 1, got {args.last_n}")
    return args


def default_out(logdirs: list[str]) -> Path:
    """``<first logdir>/scaling``."""
    return split_label(logdirs[0])[1] / "scaling"


def run_report(logdirs: list[str], out: str | os.PathLike | None = None, smooth_weight: float = 0.6, last_n: int = 10,
               dpi: int = 120, group_by: list[str] = ()) -> dict:
    """Reads the runs of ``logdirs`` and writes figure4.png, fits.png, scaling.json and scaling.md into ``out``.

    Returns:
        The report written to scaling.json.

    Raises:
        ScalingInputError: a logdir missing or holding no event file.
    """
    from zerotir.scaling.render import plot_figure4, plot_fits, plot_groups, write_markdown  # matplotlib, here only

    runs = load_runs(list(logdirs))
    out_dir = Path(out) if out is not None else default_out(logdirs)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = _clean(build_report(runs, last_n, smooth_weight, list(group_by)))
    plot_figure4(runs, out_dir / "figure4.png", smooth_weight, dpi)
    if group_by:
        report["figures"]["groups"] = "groups.png"
        plot_groups(runs, report, out_dir / "groups.png", smooth_weight, dpi)
    plot_fits(runs, report, out_dir / "fits.png", dpi)
    (out_dir / "scaling.json").write_text(json.dumps(report, indent=2) + "\n")
    write_markdown(report, out_dir / "scaling.md")
    return report


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m zerotir scaling``; returns the process exit code (2 on bad input)."""
    args = _parse_args(argv)
    try:
        report = run_report(args.logdir, args.out, args.smooth, args.last_n, args.dpi, args.group_by)
    except ScalingInputError as err:
        print(f"zerotir scaling: error: {err}", file=sys.stderr)
        return 2
    out = args.out or default_out(args.logdir)
    print(f"zerotir scaling: {len(report['runs'])} run(s) -> {out}/scaling.md, scaling.json, figure4.png, fits.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
