"""The findings of ``toy_findings.py`` computed from its runs: one function per finding (``f0`` .. ``f10``), each
returning its measured evidence and a verdict by the rule written in ``RULES``; a finding whose runs are missing is
"not measured". ``toy_findings_report.py`` draws the figures and writes docs/findings.md from these.

The sweep's runs (``toy_findings.jobs``): ``tir_{size}_p{p}_s{s}`` (ZeroTIR on the base of ``size`` pretrained with
seed ``p``, RL seed ``s``), ``norl_s{s}``, ``ppo_s{s}``, ``budget{1,2}_s{s}`` (on the medium base of pretraining
seed 0, whose ``tir_medium_p0_s{s}`` they are compared with). Findings about one run's dynamics read every medium
ZeroTIR run (2 pretraining seeds x 3 RL seeds); the size and budget findings compare groups of runs by their means,
with a Welch t-test, and give each group's mean, 95% confidence interval and min-max.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from benchmarks import toy_findings
from benchmarks.toy_findings import base_name
from benchmarks.toy_findings import tir_name as tir
from zerotir import metric_names as mn
from zerotir.scaling import fit as sf
from zerotir.scaling import laws
from zerotir.scaling.groups import closed_form_vs_law
from zerotir.scaling.runs import Run, load_run
from zerotir.toy.pretrain import read_info


GROUPS = ("easy", "hard", "multi", "long")  # the held-out splits; "long" is the one with headroom
SIZES = tuple(toy_findings.SIZES)  # smallest first
BUDGETS = (1, 2, 4)
ALPHA = 0.05  # the significance level of the group comparisons (findings 6 and 7)
RULES = {
    0: "reproduced if ZeroTIR's mean held-out accuracy (the four splits averaged) beats ZeroRL's in every seed; not "
       "reproduced if it beats it in none; else mixed",
    1: "a dip: the smoothed code proportion falls >= 0.03 below its start (first 3 steps) before its peak and ends "
       "above the start; reproduced if every run dips, not reproduced if none, else mixed",
    2: "Pearson r of code-in-correct and reward over steps; reproduced if r > 0.5 with p < 0.05 in every run, not "
       "reproduced if r <= 0 in every run, else mixed",
    3: "last 5 steps' mean length above the first 3 steps' and Spearman rho(step, length) > 0 with p < 0.05; "
       "reproduced in every run / in none / else mixed",
    4: "share of correct rollouts with exactly one call over the last 10 steps (budget 4, multi-step questions "
       "included); reproduced if > 0.9 in every run, not reproduced if <= 0.9 in every run, else mixed",
    5: "steps until the smoothed rollout accuracy covers 80% of the way from its start to the higher of the two "
       "algorithms' plateaus in that seed (never: counted as the run length); reproduced if REINFORCE++ is faster "
       "than PPO in most seeds and on average, not reproduced if PPO is faster in most seeds, else mixed",
    6: "final greedy accuracy on the long multi-step split (4-digit products, never trained on: the split with "
       "headroom), 6 runs per size (2 bases x 3 RL seeds); reproduced if every size step raises the mean (Welch "
       "t-test, one-sided p < 0.05), not reproduced if the largest size's mean is not above the smallest's by that "
       "test, else mixed",
    7: "final greedy accuracy on the multi-step held-out questions (where a call can buy something), 3 RL seeds per "
       "budget 1, 2, 4; the rule of finding 6 over the budgets",
    8: "held-out code rate hard minus easy at the last step; reproduced (selective) if >= 0.2 in every run, not "
       "reproduced if < 0.05 in every run, else mixed",
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


def mean_acc(run: Run, groups: tuple[str, ...] = GROUPS) -> float | None:
    """The last greedy held-out accuracy averaged over ``groups``."""
    values = [last_val(run, g) for g in groups]
    return None if None in values else float(np.mean(values))


def verdict(all_true: bool, none_true: bool) -> str:
    return "reproduced" if all_true else "not reproduced" if none_true else "mixed"


def reference(runs: Runs, seeds: list[int], pseeds: list[int]) -> list[tuple[str, Run]]:
    """The medium ZeroTIR runs that have finished, labelled "p{pseed} s{seed}"."""
    return [(f"p{p} s{s}", r) for p in pseeds for s in seeds if (r := runs.get(tir("medium", p, s))) is not None]


def mean_ci(values: list[float]) -> tuple[float, float]:
    """The mean of ``values`` and the half-width of its 95% t interval (0 for a single value)."""
    v = np.asarray(values, dtype=float)
    if len(v) < 2:
        return float(v.mean()), 0.0
    return float(v.mean()), float(stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v)))


def spread(values: list[float], digits: int = 2) -> str:
    """``mean (95% CI low to high; range min to max; n)`` of ``values``: the t interval of the mean, the runs'
    range (one value: itself)."""
    v = np.asarray(values, dtype=float)
    (mean, half), d = mean_ci(v), digits
    if len(v) < 2:
        return f"{mean:.{d}f} (n 1)"
    return (f"{mean:.{d}f} (95% CI {mean - half:.{d}f} to {mean + half:.{d}f}; range {v.min():.{d}f} to "
            f"{v.max():.{d}f}; n {len(v)})")


def above(low: list[float], high: list[float]) -> tuple[bool, float]:
    """Whether ``high``'s mean is above ``low``'s (Welch t-test, one-sided, p < ALPHA), and the p-value."""
    if len(low) < 2 or len(high) < 2:
        return False, float("nan")
    if np.std(low) == 0 and np.std(high) == 0:  # the test is undefined; equal means are not above
        return float(np.mean(high)) > float(np.mean(low)), 0.0 if np.mean(high) > np.mean(low) else 1.0
    res = stats.ttest_ind(high, low, equal_var=False, alternative="greater")
    return bool(res.pvalue < ALPHA), float(res.pvalue)


def ordered_groups(groups: dict[str, list[float]]) -> dict:
    """The verdict of findings 6 and 7 on ``groups`` (name -> values, in increasing order of size / budget)."""
    names = list(groups)
    steps = [(a, b, *above(groups[a], groups[b])) for a, b in zip(names, names[1:])]
    top, p_top = above(groups[names[0]], groups[names[-1]])
    ev = "; ".join(f"{name}: {spread(values)}" for name, values in groups.items())
    ev += "; one-sided Welch p: " + ", ".join(f"{a} < {b} {p:.3f}" for a, b, _, p in steps)
    if len(names) > 2:
        ev += f", {names[0]} < {names[-1]} {p_top:.3f}"
    return {"evidence": ev, "verdict": verdict(all(ok for *_, ok, _ in steps), not top),
            "data": {str(k): v for k, v in groups.items()}}


def f0(runs: Runs, seeds: list[int]) -> dict:
    rows, wins = [], []
    for s in seeds:
        with_tools, norl = runs.get(tir("medium", 0, s)), runs.get(f"norl_s{s}")
        if with_tools is None or norl is None:
            continue
        rows.append({"seed": s, **{f"tir_{g}": last_val(with_tools, g) for g in GROUPS},
                     **{f"norl_{g}": last_val(norl, g) for g in GROUPS}})
        wins.append(mean_acc(with_tools) > mean_acc(norl))
    if not rows:
        return {}
    ev = "; ".join(f"seed {r['seed']}: ZeroTIR " + " / ".join(f"{g} {r[f'tir_{g}']:.2f}" for g in GROUPS)
                   + ", ZeroRL " + " / ".join(f"{g} {r[f'norl_{g}']:.2f}" for g in GROUPS) for r in rows)
    return {"evidence": ev, "verdict": verdict(all(wins), not any(wins)), "data": rows}


def f1(ref: list[tuple[str, Run]]) -> dict:
    rows = [{"run": k, **laws.dip(r.get(mn.TOOL_CALL_RATE))} for k, r in ref]
    if not rows:
        return {}
    ev = (f"depth {spread([r['depth'] for r in rows], 3)}, dips in {sum(r['dips'] for r in rows)} of {len(rows)} "
          "runs; " + "; ".join(f"{r['run']}: start {r['start']:.3f}, min {fmt(r['min'])} at step {r['min_step']}, "
                               f"end {r['end']:.3f}" for r in rows))
    return {"evidence": ev, "verdict": verdict(all(r["dips"] for r in rows), not any(r["dips"] for r in rows)),
            "data": rows}


def f2(ref: list[tuple[str, Run]]) -> dict:
    rows = []
    for k, r in ref:
        frame = pd.DataFrame({"cic": r.get(mn.TOOL_IN_CORRECT), "reward": r.get(mn.REWARD_MEAN)}).dropna()
        if len(frame) < 3 or frame["cic"].nunique() < 2:
            rows.append({"run": k, "r": None, "p": None, "points": len(frame)})
            continue
        res = stats.pearsonr(frame["cic"], frame["reward"])
        rows.append({"run": k, "r": float(res.statistic), "p": float(res.pvalue), "points": len(frame)})
    if not rows:
        return {}
    ok = [r["r"] is not None and r["r"] > 0.5 and r["p"] < 0.05 for r in rows]
    bad = [r["r"] is None or r["r"] <= 0 for r in rows]
    measured = [r["r"] for r in rows if r["r"] is not None]
    ev = (f"r {spread(measured) if measured else 'n/a'}; " + "; ".join(
        f"{r['run']}: r = {fmt(r['r'], '.2f')} (p {fmt(r['p'], '.1e')})" for r in rows))
    return {"evidence": ev, "verdict": verdict(all(ok), all(bad)), "data": rows}


def f3(ref: list[tuple[str, Run]]) -> dict:
    rows = []
    for k, r in ref:
        length = r.get(mn.RESPONSE_LENGTH)
        res = stats.spearmanr(length.index, length.to_numpy())
        rows.append({"run": k, "first": float(length.iloc[:3].mean()), "last": float(length.iloc[-5:].mean()),
                     "rho": float(res.statistic), "p": float(res.pvalue)})
    if not rows:
        return {}
    ok = [r["last"] > r["first"] and r["rho"] > 0 and r["p"] < 0.05 for r in rows]
    ev = (f"first 3 steps {spread([r['first'] for r in rows], 1)} -> last 5 {spread([r['last'] for r in rows], 1)} "
          f"tokens, rho {spread([r['rho'] for r in rows])}; the test holds in {sum(ok)} of {len(rows)} runs")
    return {"evidence": ev, "verdict": verdict(all(ok), not any(ok)), "data": rows}


def f4(ref: list[tuple[str, Run]]) -> dict:
    rows = []
    for k, r in ref:
        counts = {b: r.get(t) for b, t in zip(sf.CALL_BUCKETS, mn.CORRECT_BY_CALLS) if r.get(t) is not None}
        block = sf.call_shares(counts, last_n=10)
        rows.append({"run": k, "total": block["total"], **{f"share_{b}": block["shares"][b] for b in sf.CALL_BUCKETS}})
    if not rows:
        return {}
    ones = [r["share_1"] or 0.0 for r in rows]
    ev = (f"one call {spread(ones)}; " + "; ".join(
        f"{r['run']}: {r['total']} correct, calls 0/1/2/3+: " + "/".join(fmt(r[f'share_{b}'], '.2f')
                                                                        for b in sf.CALL_BUCKETS) for r in rows))
    return {"evidence": ev, "verdict": verdict(all(v > 0.9 for v in ones), all(v <= 0.9 for v in ones)),
            "data": rows}


def _steps80(run: Run, length: int, plateau: float | None = None) -> tuple[float, dict]:
    reach = laws.steps_to_fraction(run.get(mn.ACCURACY), plateau=plateau)
    return (float(length) if reach["step"] is None else float(reach["step"])), reach


def f5(runs: Runs, seeds: list[int], steps: int) -> dict:
    names = {"reinforce_pp": lambda s: tir("medium", 0, s), "ppo": lambda s: f"ppo_s{s}"}
    table: dict[str, dict[int, dict]] = {}
    for s in seeds:
        present = {algo: r for algo, name in names.items() if (r := runs.get(name(s))) is not None}
        own = {algo: laws.steps_to_fraction(r.get(mn.ACCURACY)) for algo, r in present.items()}
        best = max((o["plateau"] for o in own.values()), default=None)
        for algo, r in present.items():
            n, reach = _steps80(r, steps, best)
            table.setdefault(algo, {})[s] = {"steps": n, "plateau": own[algo]["plateau"], "start": reach["start"],
                                             "target": best, "own_plateau_steps": own[algo]["step"]}
    if "reinforce_pp" not in table or "ppo" not in table:
        return {}
    common = sorted(set(table["reinforce_pp"]) & set(table["ppo"]))
    faster = [table["reinforce_pp"][s]["steps"] < table["ppo"][s]["steps"] for s in common]
    slower = [table["reinforce_pp"][s]["steps"] > table["ppo"][s]["steps"] for s in common]
    mean = {a: float(np.mean([v["steps"] for v in t.values()])) for a, t in table.items()}
    ev = "; ".join(f"{a}: steps to 80% {spread([v['steps'] for v in t.values()], 1)}, plateau "
                   f"{spread([v['plateau'] for v in t.values()])}" for a, t in table.items())
    win = sum(faster) > len(common) / 2 and mean["reinforce_pp"] < mean["ppo"]
    return {"evidence": ev, "verdict": "reproduced" if win else "not reproduced" if sum(slower) > len(common) / 2
            else "mixed", "data": table}


def size_runs(runs: Runs, seeds: list[int], pseeds: list[int]) -> dict[str, list[Run]]:
    """The finished runs of the size sweep by size; fewer than two sizes is none (nothing to compare)."""
    got = {size: [r for p in pseeds for s in seeds if (r := runs.get(tir(size, p, s))) is not None] for size in SIZES}
    got = {size: rs for size, rs in got.items() if rs}
    return got if len(got) >= 2 else {}


def base_params(out: Path, size: str, pseeds: list[int]) -> float | None:
    """The mean parameter count of the bases of ``size`` (they differ only by their seed: the same count)."""
    counts = [info["record"]["params"] for p in pseeds if (info := read_info(out / base_name(size, p)))]
    return float(np.mean(counts)) if counts else None


def f6(runs: Runs, out: Path, seeds: list[int], pseeds: list[int]) -> dict:
    got = size_runs(runs, seeds, pseeds)
    if not got:
        return {}
    labels = {size: f"{size} ({fmt((base_params(out, size, pseeds) or float('nan')) / 1e6, '.2f')}M)" for size in got}
    result = ordered_groups({labels[size]: [last_val(r, "long") for r in rs] for size, rs in got.items()})
    result["evidence"] += "; all four splits averaged: " + "; ".join(
        f"{labels[size]} {spread([mean_acc(r) for r in rs])}" for size, rs in got.items())
    missing = [s for s in SIZES if s not in got]
    if missing:
        result["evidence"] += f" (not finished when the report was written: {', '.join(missing)})"
    return result


def f7(runs: Runs, seeds: list[int]) -> dict:
    names = {1: lambda s: f"budget1_s{s}", 2: lambda s: f"budget2_s{s}", 4: lambda s: tir("medium", 0, s)}
    got = {b: [r for s in seeds if (r := runs.get(name(s))) is not None] for b, name in names.items()}
    if any(not rs for rs in got.values()):
        return {}
    result = ordered_groups({f"N_max {b}": [last_val(r, "multi") for r in rs] for b, rs in got.items()})
    calls = {b: np.mean([last_val(r, "multi", "calls_per_response") for r in rs]) for b, rs in got.items()}
    result["evidence"] += "; multi-step calls per answer " + ", ".join(f"N_max {b} {c:.2f}" for b, c in calls.items())
    return result


def f8(ref: list[tuple[str, Run]]) -> dict:
    rows = [{"run": k, **{g: last_val(r, g, mn.EVAL_TOOL_CALL_RATE) for g in GROUPS}} for k, r in ref]
    if not rows:
        return {}
    gaps = [r["hard"] - r["easy"] for r in rows]
    ev = (f"hard minus easy {spread(gaps)}; code rate easy {spread([r['easy'] for r in rows])}, hard "
          f"{spread([r['hard'] for r in rows])}, multi-step {spread([r['multi'] for r in rows])}")
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
    ev = (f"law beats the flat forecast in {sum(r['beats_naive'] for r in scored)} of {len(scored)} runs; RMSE "
          f"{spread([r['rmse'] for r in scored], 3)} (flat {spread([r['naive_rmse'] for r in scored], 3)}); full-run "
          f"R^2 {spread([r['full_r2'] for r in rows if r.get('full_r2') is not None])}")
    return {"evidence": ev, "verdict": "reproduced" if share >= 0.75 else "not reproduced" if share <= 0.25
            else "mixed", "data": rows}


def f10(runs: Runs, out: Path, seeds: list[int], pseeds: list[int]) -> dict:
    got = size_runs(runs, seeds, pseeds)
    if not got:
        return {}
    params = {r.name: base_params(out, size, pseeds) for size, rs in got.items() for r in rs}
    res = closed_form_vs_law([r for rs in got.values() for r in rs], params)
    if "fit" not in res:
        return {"evidence": f"closed form not fitted: {res.get('error')}", "verdict": "not reproduced", "data": res}
    fit = res["fit"]
    ev = (f"a = {fit['a']:.3g}, b = {fit['b']:.3g}, c = {fit['c']:.3g}: R^2 {fit['r2']:.3f} on {fit['points']} "
          f"points of {sum(len(rs) for rs in got.values())} runs (3 parameters); per-run law R^2 {res['law_r2']:.3f} "
          "(4 per run)")
    return {"evidence": ev, "verdict": "reproduced" if fit["r2"] >= res["law_r2"] - 0.05 else "not reproduced",
            "data": res}


def fmt(value, fmt: str = ".3f") -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, fmt)
