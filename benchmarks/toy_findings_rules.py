"""The findings of ``toy_findings.py`` computed from its runs: one function per finding (``f0`` .. ``f10``), each
returning its measured evidence and a verdict by the rule written in ``RULES``; a finding whose runs are missing is
"not measured". ``toy_findings_report.py`` draws the figures and writes docs/findings.md from these.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from zerotir import metric_names as mn
from zerotir.scaling import fit as sf
from zerotir.scaling import laws
from zerotir.scaling.groups import closed_form_vs_law
from zerotir.scaling.runs import Run, load_run
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


def seed_runs(runs: Runs, seeds: list[int], prefix: str = "tir_rpp") -> list[tuple[int, Run]]:
    return [(s, r) for s in seeds if (r := runs.get(f"{prefix}_s{s}")) is not None]


def f1(runs: Runs, seeds: list[int]) -> dict:
    rows = [{"seed": s, **laws.dip(r.get(mn.CODE_RATE))} for s, r in seed_runs(runs, seeds)]
    if not rows:
        return {}
    ev = "; ".join(f"seed {r['seed']}: start {r['start']:.3f}, min {fmt(r['min'])} at step {r['min_step']}, depth "
                   f"{r['depth']:+.3f}, end {r['end']:.3f}" for r in rows)
    return {"evidence": ev, "verdict": verdict(all(r["dips"] for r in rows), not any(r["dips"] for r in rows)),
            "data": rows}


def f2(runs: Runs, seeds: list[int]) -> dict:
    rows = []
    for s, r in seed_runs(runs, seeds):
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
    ev = "; ".join(f"seed {r['seed']}: r = {fmt(r['r'])} (p {fmt(r['p'], '.1e')}, {r['points']} steps)" for r in rows)
    return {"evidence": ev, "verdict": verdict(all(ok), all(bad)), "data": rows}


def f3(runs: Runs, seeds: list[int]) -> dict:
    rows = []
    for s, r in seed_runs(runs, seeds):
        length = r.get(mn.RESPONSE_LENGTH)
        res = stats.spearmanr(length.index, length.to_numpy())
        rows.append({"seed": s, "first": float(length.iloc[:3].mean()), "last": float(length.iloc[-5:].mean()),
                     "rho": float(res.statistic), "p": float(res.pvalue)})
    if not rows:
        return {}
    ok = [r["last"] > r["first"] and r["rho"] > 0 and r["p"] < 0.05 for r in rows]
    ev = "; ".join(f"seed {r['seed']}: {r['first']:.1f} -> {r['last']:.1f} tokens, rho {r['rho']:+.2f} "
                   f"(p {r['p']:.1e})" for r in rows)
    return {"evidence": ev, "verdict": verdict(all(ok), not any(ok)), "data": rows}


def f4(runs: Runs, seeds: list[int]) -> dict:
    rows = []
    for s, r in seed_runs(runs, seeds):
        counts = {b: r.get(t) for b, t in zip(sf.CALL_BUCKETS, mn.CORRECT_BY_CALLS) if r.get(t) is not None}
        block = sf.call_shares(counts, last_n=10)
        rows.append({"seed": s, "total": block["total"], **{f"share_{b}": block["shares"][b] for b in sf.CALL_BUCKETS}})
    if not rows:
        return {}
    ones = [r["share_1"] or 0.0 for r in rows]
    ev = "; ".join(f"seed {r['seed']}: {r['total']} correct, calls 0/1/2/3+: "
                   + "/".join(fmt(r[f'share_{b}'], '.2f') for b in sf.CALL_BUCKETS) for r in rows)
    return {"evidence": ev, "verdict": verdict(all(v > 0.9 for v in ones), all(v <= 0.9 for v in ones)),
            "data": rows}


def _steps80(run: Run, length: int, plateau: float | None = None) -> tuple[float, dict]:
    reach = laws.steps_to_fraction(run.get(mn.ACCURACY), plateau=plateau)
    return (float(length) if reach["step"] is None else float(reach["step"])), reach


def f5(runs: Runs, seeds: list[int], steps: int) -> dict:
    prefixes = {"reinforce_pp": "tir_rpp", "ppo": "tir_ppo", "reinforce_baseline": "tir_rbl"}
    table: dict[str, dict[int, dict]] = {}
    per_seed = {algo: dict(seed_runs(runs, seeds, prefix)) for algo, prefix in prefixes.items()}
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
                                                     f"reached 80% of it at {fmt(v['own_plateau_steps'], 'd')})"
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
    rows = [{"seed": s, **{g: last_val(r, g, "code_rate") for g in GROUPS}} for s, r in seed_runs(runs, seeds)]
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
          f" full-run R^2: " + ", ".join(f"{r['run']} {fmt(r.get('full_r2'), '.2f')}" for r in rows))
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


def fmt(value, fmt: str = ".3f") -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, fmt)
