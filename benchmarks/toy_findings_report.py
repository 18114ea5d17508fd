"""docs/findings.md from the runs of ``toy_findings.py``: one row per finding, its measured evidence and a verdict.

Every verdict is computed from the logs by the rule written next to it (``RULES``); a finding whose runs are missing
is "not measured". Figures are drawn with matplotlib's object API into ``<docs>/findings/``; the size and budget
sweeps also get the scaling report of ``python -m zerotir scaling --group-by`` (``zerotir.scaling.report``).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from scipy import stats

from zerotir import metric_names as mn
from zerotir.scaling import fit as sf
from zerotir.scaling import laws
from zerotir.scaling.groups import closed_form_vs_law
from zerotir.scaling.report import run_report
from zerotir.scaling.runs import Run, load_run
from zerotir.toy.mixed.design import check_design
from zerotir.toy.pretrain import read_info

GROUPS = ("easy", "hard")
RULES = {
    0: "reproduced if ZeroTIR's mean held-out accuracy (easy and hard averaged) beats ZeroRL's in every seed; "
       "not reproduced if it beats it in none; else mixed",
    1: "a dip: the smoothed code proportion falls >= 0.03 below its start (first 3 steps) before its peak and ends "
       "above the start; reproduced if every seed dips, not reproduced if none, else mixed",
    2: "Pearson r of code-in-correct and reward over steps; reproduced if r > 0.5 with p < 0.05 in every seed, not "
       "reproduced if r <= 0 in every seed, else mixed",
    3: "last 5 steps' mean length above the first 3 steps' and Spearman rho(step, length) > 0 with p < 0.05; "
       "reproduced in every seed / in none / else mixed",
    4: "share of correct rollouts with exactly one call over the last 10 steps (budget 4); reproduced if > 0.9 in "
       "every seed, not reproduced if <= 0.9 in every seed, else mixed",
    5: "steps until the smoothed rollout accuracy covers 80% of the way from its start to the higher of the two "
       "algorithms' plateaus in that seed (never: counted as the run length); reproduced if REINFORCE++ is faster "
       "than PPO in most seeds and on average, not reproduced if PPO is faster in most seeds, else mixed",
    6: "final greedy held-out accuracy (easy and hard averaged), or where all runs are at its ceiling (>= 0.98) the "
       "rollout accuracy of the last 5 steps; reproduced if it rises by > 0.02 with every size step, not reproduced "
       "if the largest base is not > 0.02 above the smallest, else mixed (one seed per size)",
    7: "as finding 6, over the call budgets 1, 2, 4 (one seed per budget)",
    8: "held-out code rate hard minus easy at the last step; reproduced (selective) if >= 0.2 in every seed, not "
       "reproduced if < 0.05 in every seed, else mixed",
    9: "the law fitted on the first half of a run's rollout accuracy predicts the second half better (RMSE) than "
       "holding the first half's last quarter flat; reproduced in >= 75% of runs, not reproduced in <= 25%, else "
       "mixed",
    10: "reproduced if the closed form's R^2 across the size sweep is within 0.05 of the per-run law's on the same "
        "points, else not reproduced",
}
TITLES = {
    0: "ZeroTIR beats ZeroRL (same RL without tools) on the same base",
    1: "code proportion dips before it rises",
    2: "code in correct rises with reward",
    3: "response length rises",
    4: "> 90% of correct trajectories use exactly one call (budget 4)",
    5: "REINFORCE++ converges faster than PPO",
    6: "a larger base learns more",
    7: "a larger call budget helps",
    8: "selective tool use: code on hard questions, text on easy ones",
    9: "a predictive law: first half predicts second half",
    10: "closed form sigmoid(a ln N + b sqrt(T) - c L) across sizes",
}


class Runs:
    """The runs of a sweep folder, loaded on first use; ``None`` for a run that is missing or unfinished."""

    def __init__(self, out: Path) -> None:
        self.out, self._cache = out, {}

    def get(self, name: str) -> Run | None:
        if name not in self._cache:
            path = self.out / name / "tensorboard"
            done = (self.out / name / "done.json").is_file()
            self._cache[name] = load_run(name, path) if done and path.is_dir() else None
        return self._cache[name]

    def all(self, names: list[str]) -> list[Run] | None:
        runs = [self.get(n) for n in names]
        return None if any(r is None for r in runs) else runs


def last_val(run: Run, group: str, tag: str = "accuracy") -> float | None:
    series = run.get(f"heldout_{group}/{tag}")
    return None if series is None or series.empty else float(series.iloc[-1])


def mean_acc(run: Run) -> float | None:
    values = [last_val(run, g) for g in GROUPS]
    return None if None in values else float(np.mean(values))


def verdict(all_true: bool, none_true: bool) -> str:
    return "reproduced" if all_true else "not reproduced" if none_true else "mixed"


def f0(runs: Runs, seeds: list[int]) -> dict:
    rows, wins = [], []
    for s in seeds:
        tir, norl = runs.get(f"tir_rpp_s{s}"), runs.get(f"norl_s{s}")
        if tir is None or norl is None:
            continue
        rows.append({"seed": s, **{f"tir_{g}": last_val(tir, g) for g in GROUPS},
                     **{f"norl_{g}": last_val(norl, g) for g in GROUPS}})
        wins.append(mean_acc(tir) > mean_acc(norl))
    if not rows:
        return {}
    ev = "; ".join(f"seed {r['seed']}: ZeroTIR easy {r['tir_easy']:.2f} / hard {r['tir_hard']:.2f}, ZeroRL easy "
                   f"{r['norl_easy']:.2f} / hard {r['norl_hard']:.2f}" for r in rows)
    return {"evidence": ev, "verdict": verdict(all(wins), not any(wins)), "data": rows}


def _per_seed(runs: Runs, seeds: list[int], prefix: str = "tir_rpp") -> list[tuple[int, Run]]:
    return [(s, r) for s in seeds if (r := runs.get(f"{prefix}_s{s}")) is not None]


def f1(runs: Runs, seeds: list[int]) -> dict:
    rows = [{"seed": s, **laws.dip(r.get(mn.CODE_RATE))} for s, r in _per_seed(runs, seeds)]
    if not rows:
        return {}
    ev = "; ".join(f"seed {r['seed']}: start {r['start']:.3f}, min {_f(r['min'])} at step {r['min_step']}, depth "
                   f"{r['depth']:+.3f}, end {r['end']:.3f}" for r in rows)
    return {"evidence": ev, "verdict": verdict(all(r["dips"] for r in rows), not any(r["dips"] for r in rows)),
            "data": rows}


def f2(runs: Runs, seeds: list[int]) -> dict:
    rows = []
    for s, r in _per_seed(runs, seeds):
        frame = pd.DataFrame({"cic": r.get(mn.CODE_IN_CORRECT), "reward": r.get(mn.REWARD_MEAN)}).dropna()
        if len(frame) < 3 or frame["cic"].nunique() < 2:
            rows.append({"seed": s, "r": None, "p": None, "points": len(frame)})
            continue
        res = stats.pearsonr(frame["cic"], frame["reward"])
        rows.append({"seed": s, "r": float(res.statistic), "p": float(res.pvalue), "points": len(frame)})
    if not rows:
        return {}
    ok = [r["r"] is not None and r["r"] > 0.5 and r["p"] < 0.05 for r in rows]
    bad = [r["r"] is None or r["r"] <= 0 for r in rows]
    ev = "; ".join(f"seed {r['seed']}: r = {_f(r['r'])} (p {_f(r['p'], '.1e')}, {r['points']} steps)" for r in rows)
    return {"evidence": ev, "verdict": verdict(all(ok), all(bad)), "data": rows}


def f3(runs: Runs, seeds: list[int]) -> dict:
    rows = []
    for s, r in _per_seed(runs, seeds):
        length = r.get(mn.RESPONSE_LENGTH)
        res = stats.spearmanr(length.index, length.to_numpy())
        rows.append({"seed": s, "first": float(length.iloc[:3].mean()), "last": float(length.iloc[-5:].mean()),
                     "rho": float(res.statistic), "p": float(res.pvalue)})
    if not rows:
        return {}
    ok = [r["last"] > r["first"] and r["rho"] > 0 and r["p"] < 0.05 for r in rows]
    ev = "; ".join(f"seed {r['seed']}: {r['first']:.1f} -> {r['last']:.1f} tokens, rho {r['rho']:+.2f} "
                   f"(p {r['p']:.1e})" for r in rows)
    return {"evidence": ev, "verdict": verdict(all(ok), not any(r["last"] > r["first"] for r in rows)),
            "data": rows}


def f4(runs: Runs, seeds: list[int]) -> dict:
    rows = []
    for s, r in _per_seed(runs, seeds):
        counts = {b: r.get(t) for b, t in zip(sf.CALL_BUCKETS, mn.CORRECT_BY_CALLS) if r.get(t) is not None}
        block = sf.call_shares(counts, last_n=10)
        rows.append({"seed": s, "total": block["total"], **{f"share_{b}": block["shares"][b] for b in sf.CALL_BUCKETS}})
    if not rows:
        return {}
    ones = [r["share_1"] or 0.0 for r in rows]
    ev = "; ".join(f"seed {r['seed']}: {r['total']} correct, calls 0/1/2/3+: "
                   + "/".join(_f(r[f'share_{b}'], '.2f') for b in sf.CALL_BUCKETS) for r in rows)
    return {"evidence": ev, "verdict": verdict(all(v > 0.9 for v in ones), all(v <= 0.9 for v in ones)),
            "data": rows}


def _steps80(run: Run, length: int, plateau: float | None = None) -> tuple[float, dict]:
    reach = laws.steps_to_fraction(run.get(mn.ACCURACY), plateau=plateau)
    return (float(length) if reach["step"] is None else float(reach["step"])), reach


def f5(runs: Runs, seeds: list[int], steps: int) -> dict:
    prefixes = {"reinforce_pp": "tir_rpp", "ppo": "tir_ppo", "reinforce_baseline": "tir_rbl"}
    table: dict[str, dict[int, dict]] = {}
    per_seed = {algo: dict(_per_seed(runs, seeds, prefix)) for algo, prefix in prefixes.items()}
    for s in seeds:
        present = {algo: r[s] for algo, r in per_seed.items() if s in r}
        own = {algo: laws.steps_to_fraction(r.get(mn.ACCURACY)) for algo, r in present.items()}
        best = max((o["plateau"] for o in own.values()), default=None)
        for algo, r in present.items():
            n, reach = _steps80(r, steps, best)
            own_steps = own[algo]["step"]
            table.setdefault(algo, {})[s] = {"steps": n, "plateau": own[algo]["plateau"], "start": reach["start"],
                                             "target": best, "own_plateau_steps": own_steps}
    if "reinforce_pp" not in table or "ppo" not in table:
        return {}
    common = sorted(set(table["reinforce_pp"]) & set(table["ppo"]))
    faster = [table["reinforce_pp"][s]["steps"] < table["ppo"][s]["steps"] for s in common]
    slower = [table["reinforce_pp"][s]["steps"] > table["ppo"][s]["steps"] for s in common]
    mean = {a: float(np.mean([v["steps"] for v in t.values()])) for a, t in table.items()}
    ev = "; ".join(f"{a}: steps to 80% " + ", ".join(f"s{s} {v['steps']:.0f} (own plateau {v['plateau']:.2f}, "
                                                     f"reached 80% of it at {_f(v['own_plateau_steps'], 'd')})"
                                                     for s, v in sorted(t.items())) + f", mean {mean[a]:.1f}"
                   for a, t in table.items())
    win = sum(faster) > len(common) / 2 and mean["reinforce_pp"] < mean["ppo"]
    return {"evidence": ev, "verdict": "reproduced" if win else "not reproduced" if sum(slower) > len(common) / 2
            else "mixed", "data": table}


def final_rollout(run: Run) -> float:
    """Mean rollout accuracy (temperature 1) of the last 5 steps."""
    return float(run.get(mn.ACCURACY).iloc[-5:].mean())


def _at_ceiling(rows: list[dict]) -> bool:
    return all(r["final"] >= 0.98 for r in rows)


def _ceiling(rows: list[dict]) -> str:
    if _at_ceiling(rows):
        return (" (greedy held-out accuracy is at its ceiling in all runs and cannot separate them: the verdict "
                "uses the rollout accuracy)")
    return ""


def _judged(rows: list[dict]) -> list[float]:
    """The values a verdict of findings 6 and 7 compares (see their rule)."""
    return [r["rollout"] if _at_ceiling(rows) else r["final"] for r in rows]


MARGIN = 0.02  # about one binomial standard error of 640 rollouts (5 steps x 128) at accuracy 0.7


def _monotone(values: list[float]) -> tuple[bool, bool]:
    """(rises by more than MARGIN at every step, last not more than MARGIN above first)."""
    return all(b > a + MARGIN for a, b in zip(values, values[1:])), values[-1] <= values[0] + MARGIN


SIZE_RUNS = {"small": "size_small_s0", "medium": "tir_rpp_s0", "large": "size_large_s0"}


def size_runs(runs: Runs) -> dict[str, Run]:
    """The finished runs of the size sweep by size; fewer than two is none (nothing to compare)."""
    got = {size: r for size, name in SIZE_RUNS.items() if (r := runs.get(name)) is not None}
    return got if len(got) >= 2 else {}


def _missing_sizes(got: dict) -> str:
    missing = [s for s in SIZE_RUNS if s not in got]
    return f" (not finished when the report was written: {', '.join(missing)})" if missing else ""


def f6(runs: Runs, out: Path, steps: int) -> dict:
    got = size_runs(runs)
    if not got:
        return {}
    rows = []
    for size, r in got.items():
        info = read_info(out / f"base_{size}") or {}
        rows.append({"size": size, "params": info.get("record", {}).get("params"), "final": mean_acc(r),
                     "steps80": _steps80(r, steps)[0], "rollout": final_rollout(r)})
    rises, flat = _monotone(_judged(rows))
    ev = "; ".join(f"{r['size']} ({r['params'] / 1e6:.2f}M): final {r['final']:.2f} (rollouts, last 5 steps "
                   f"{r['rollout']:.2f}), steps to 80% {r['steps80']:.0f}" for r in rows) + _ceiling(rows)
    return {"evidence": ev + _missing_sizes(got), "verdict": verdict(rises, flat), "data": rows}


def f7(runs: Runs) -> dict:
    names = {1: "budget1_s0", 2: "budget2_s0", 4: "tir_rpp_s0"}
    got = runs.all(list(names.values()))
    if got is None:
        return {}
    rows = [{"budget": b, "final": mean_acc(r), "rollout": final_rollout(r),
             "calls": float(np.mean([last_val(r, g, "calls_per_response") for g in GROUPS]))}
            for b, r in zip(names, got)]
    rises, flat = _monotone(_judged(rows))
    ev = "; ".join(f"N_max {r['budget']}: final {r['final']:.2f} (rollouts, last 5 steps {r['rollout']:.2f}), "
                   f"calls per answer {r['calls']:.2f}" for r in rows) + _ceiling(rows)
    return {"evidence": ev, "verdict": verdict(rises, flat), "data": rows}


def f8(runs: Runs, seeds: list[int]) -> dict:
    rows = [{"seed": s, **{g: last_val(r, g, "code_rate") for g in GROUPS}} for s, r in _per_seed(runs, seeds)]
    if not rows:
        return {}
    gaps = [r["hard"] - r["easy"] for r in rows]
    ev = "; ".join(f"seed {r['seed']}: code rate easy {r['easy']:.2f}, hard {r['hard']:.2f}" for r in rows)
    return {"evidence": ev, "verdict": verdict(all(g >= 0.2 for g in gaps), all(g < 0.05 for g in gaps)),
            "data": rows}


def f9(runs: Runs, names: list[str]) -> dict:
    rows = []
    for name in names:
        r = runs.get(name)
        if r is None or r.get(mn.ACCURACY) is None:
            continue
        rows.append({"run": name, **laws.predict_second_half(r.get(mn.ACCURACY))})
    scored = [r for r in rows if "rmse" in r]
    if not scored:
        return {}
    share = sum(r["beats_naive"] for r in scored) / len(scored)
    ev = (f"law beats the flat forecast in {sum(r['beats_naive'] for r in scored)} of {len(scored)} runs; "
          f"median RMSE {np.median([r['rmse'] for r in scored]):.3f} (flat {np.median([r['naive_rmse'] for r in scored]):.3f});"
          f" full-run R^2: " + ", ".join(f"{r['run']} {_f(r.get('full_r2'), '.2f')}" for r in rows))
    return {"evidence": ev, "verdict": "reproduced" if share >= 0.75 else "not reproduced" if share <= 0.25
            else "mixed", "data": rows}


def f10(runs: Runs, out: Path) -> dict:
    got = size_runs(runs)
    if not got:
        return {}
    params = {r.name: (read_info(out / f"base_{size}") or {}).get("record", {}).get("params")
              for size, r in got.items()}
    res = closed_form_vs_law(list(got.values()), params)
    if "fit" not in res:
        return {"evidence": f"closed form not fitted: {res.get('error')}", "verdict": "not reproduced", "data": res}
    fit = res["fit"]
    ev = (f"a = {fit['a']:.3g}, b = {fit['b']:.3g}, c = {fit['c']:.3g}: R^2 {fit['r2']:.3f} on {fit['points']} "
          f"points (3 parameters); per-run law R^2 {res['law_r2']:.3f} (4 per run)" + _missing_sizes(got))
    return {"evidence": ev, "verdict": "reproduced" if fit["r2"] >= res["law_r2"] - 0.05 else "not reproduced",
            "data": res}


def _f(value, fmt: str = ".3f") -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, fmt)


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
    per_seed = _per_seed(runs, seeds)
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
    per_seed = _per_seed(runs, seeds)
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
             f"(up to 3 jobs at a time, one thread each, on {os.cpu_count()} cores shared with other work; load "
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
                     f"{b['minutes']:.1f} | {_f(e.get('accuracy_no_code'), '.2f')} | {_f(e.get('accuracy'), '.2f')} | "
                     f"{_f(h.get('accuracy'), '.2f')} | {_f(e.get('code_rate'), '.2f')} / {_f(h.get('code_rate'), '.2f')}"
                     f" | {_f(e.get('code_run_accuracy'), '.2f')} / {_f(h.get('code_run_accuracy'), '.2f')} | "
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
