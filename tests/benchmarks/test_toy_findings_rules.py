"""The verdict rules of ``benchmarks/toy_findings_rules.py`` (the table of docs/findings.md) on hand-made runs.

Each finding gets a case its rule calls reproduced and one it calls not reproduced, from series shaped like the
sweep's logs (scalars by step) under the sweep's run names; a missing run makes the finding "not measured" ({}).
"""

import json
from pathlib import Path

import numpy as np
import pandas as pd
from benchmarks import toy_findings_rules as rules
from zerotir import metric_names as mn
from zerotir.scaling import fit as sf
from zerotir.scaling import laws
from zerotir.scaling.runs import Run
from zerotir.toy.pretrain import INFO_FILE

SEEDS = [0, 1, 2]
PSEEDS = [0, 1]


class MemoryRuns(rules.Runs):
    """The sweep's runs by name, held in memory instead of read from TensorBoard folders."""

    def __init__(self, runs: dict[str, Run]) -> None:
        self.runs = runs

    def get(self, name: str) -> Run | None:
        return self.runs.get(name)


def series(values) -> pd.Series:
    return pd.Series(np.asarray(values, dtype=float), index=pd.Index(range(len(values)), name="step"))


def make_run(name: str, **tags) -> Run:
    """A run with ``tags`` (metric tag -> values by step); keyword names use ``__`` for ``/``."""
    return Run(name=name, path=Path(name), scalars={t.replace("__", "/"): series(v) for t, v in tags.items()})


def heldout(easy: float, hard: float, tag: str = "accuracy", multi: float | None = None) -> dict:
    """The last greedy validation of the four held-out splits (two validations logged, the last one counts);
    multi-step (short and long) as hard unless given."""
    multi = hard if multi is None else multi
    return {f"heldout_easy__{tag}": [0.0, easy], f"heldout_hard__{tag}": [0.0, hard],
            f"heldout_multi__{tag}": [0.0, multi], f"heldout_long__{tag}": [0.0, multi]}


def by_seed(prefix: str, make) -> dict[str, Run]:
    """One run per RL seed named ``{prefix}_s{seed}`` (the medium ZeroTIR runs: prefix ``tir_medium_p0``)."""
    return {f"{prefix}_s{s}": make(f"{prefix}_s{s}", s) for s in SEEDS}


def reference(make) -> list[tuple[str, Run]]:
    """The medium ZeroTIR runs of both pretraining seeds as the dynamics findings read them."""
    runs = {rules.tir("medium", p, s): make(rules.tir("medium", p, s), s) for p in PSEEDS for s in SEEDS}
    return rules.reference(MemoryRuns(runs), SEEDS, PSEEDS)


# ---------------------------------------------------------------- finding 0: ZeroTIR beats ZeroRL


def f0_runs(tir_acc: list[float], norl_acc: list[float]) -> MemoryRuns:
    runs = by_seed("tir_medium_p0", lambda n, s: make_run(n, **heldout(tir_acc[s], tir_acc[s])))
    runs.update(by_seed("norl", lambda n, s: make_run(n, **heldout(norl_acc[s], 0.0))))
    return MemoryRuns(runs)


def test_f0_verdict_both_ways():
    assert rules.f0(f0_runs([0.9] * 3, [0.8] * 3), SEEDS)["verdict"] == "reproduced"
    # ZeroRL's mean (easy 0.8, the three others 0) is 0.2: ZeroTIR at 0.15 loses in every seed.
    assert rules.f0(f0_runs([0.15] * 3, [0.8] * 3), SEEDS)["verdict"] == "not reproduced"
    assert rules.f0(f0_runs([0.9, 0.15, 0.9], [0.8] * 3), SEEDS)["verdict"] == "mixed"


def test_f0_without_its_runs_is_not_measured():
    assert rules.f0(MemoryRuns({}), SEEDS) == {}


# ---------------------------------------------------------------- finding 1: the code proportion dips


DIP = [0.20, 0.20, 0.20, 0.05, 0.05, 0.05, 0.05, 0.30, 0.50, 0.70, 0.80, 0.80]
RISE = [0.20, 0.20, 0.20, 0.25, 0.30, 0.40, 0.50, 0.60, 0.70, 0.75, 0.80, 0.80]


def f1_runs(curves: list[list[float]]) -> list[tuple[str, Run]]:
    return reference(lambda n, s: make_run(n, **{mn.TOOL_CALL_RATE: curves[s]}))


def test_f1_verdict_both_ways():
    assert rules.f1(f1_runs([DIP] * 3))["verdict"] == "reproduced"
    assert rules.f1(f1_runs([RISE] * 3))["verdict"] == "not reproduced"
    mixed = rules.f1(f1_runs([DIP, RISE, DIP]))
    assert mixed["verdict"] == "mixed" and "dips in 4 of 6 runs" in mixed["evidence"]


# ---------------------------------------------------------------- finding 2: code in correct rises with reward


def f2_runs(sign: float) -> list[tuple[str, Run]]:
    reward = np.linspace(0.1, 0.8, 12)
    cic = 0.5 + sign * (reward - 0.45)
    return reference(lambda n, s: make_run(n, **{mn.TOOL_IN_CORRECT: cic, mn.REWARD_MEAN: reward}))


def test_f2_verdict_both_ways():
    assert rules.f2(f2_runs(+1.0))["verdict"] == "reproduced"
    assert rules.f2(f2_runs(-1.0))["verdict"] == "not reproduced"


def test_f2_constant_code_in_correct_counts_against():
    """A run whose code-in-correct never changes has no correlation (r None): not reproduced."""
    runs = reference(lambda n, s: make_run(n, **{mn.TOOL_IN_CORRECT: [1.0] * 12,
                                                 mn.REWARD_MEAN: np.linspace(0, 1, 12)}))
    out = rules.f2(runs)
    assert out["verdict"] == "not reproduced" and all(row["r"] is None for row in out["data"])


# ---------------------------------------------------------------- finding 3: response length rises


# Ends above its start but not a significant rise (Spearman p about 0.075): the rule's test fails in this seed.
LENGTH_U = [25, 25, 25, 25, 25, 10, 10, 10, 10, 10, 26, 26, 26, 26, 26]


def f3_runs(curves: list) -> list[tuple[str, Run]]:
    return reference(lambda n, s: make_run(n, **{mn.RESPONSE_LENGTH: curves[s]}))


def test_f3_verdict_both_ways():
    rising, falling = np.linspace(20, 40, 15), np.linspace(40, 20, 15)
    assert rules.f3(f3_runs([rising] * 3))["verdict"] == "reproduced"
    assert rules.f3(f3_runs([falling] * 3))["verdict"] == "not reproduced"
    assert rules.f3(f3_runs([rising, falling, rising]))["verdict"] == "mixed"


def test_f3_a_rise_without_a_significant_trend_in_every_seed_is_not_reproduced():
    """The rule: reproduced when both tests hold in every run, not reproduced when they hold in none."""
    out = rules.f3(f3_runs([LENGTH_U] * 3))
    assert all(row["last"] > row["first"] and row["p"] >= 0.05 for row in out["data"])
    assert out["verdict"] == "not reproduced"


# ---------------------------------------------------------------- finding 4: exactly one call


def f4_runs(one_call_share: float) -> list[tuple[str, Run]]:
    """Per step 100 correct rollouts, ``one_call_share`` of them with one call and the rest with two."""
    ones = round(100 * one_call_share)
    counts = dict(zip(mn.CORRECT_BY_CALLS, ([0] * 12, [ones] * 12, [100 - ones] * 12, [0] * 12)))
    return reference(lambda n, s: make_run(n, **counts))


def test_f4_verdict_both_ways():
    assert rules.f4(f4_runs(0.95))["verdict"] == "reproduced"
    assert rules.f4(f4_runs(0.90))["verdict"] == "not reproduced"  # the threshold is strict: > 0.9


def test_f4_counts_only_the_last_ten_steps():
    counts = dict(zip(mn.CORRECT_BY_CALLS, ([100] * 5 + [0] * 10, [0] * 5 + [100] * 10, [0] * 15, [0] * 15)))
    out = rules.f4(reference(lambda n, s: make_run(n, **counts)))
    assert out["verdict"] == "reproduced" and out["data"][0]["total"] == 1000


# ---------------------------------------------------------------- finding 5: REINFORCE++ faster than PPO


FAST = [0.1, 0.1, 0.1, 0.5, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7]
SLOW = [0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.7, 0.7]


def f5_runs(rpp: list[float], ppo: list[float]) -> MemoryRuns:
    runs = by_seed("tir_medium_p0", lambda n, s: make_run(n, **{mn.ACCURACY: rpp}))
    runs.update(by_seed("ppo", lambda n, s: make_run(n, **{mn.ACCURACY: ppo})))
    return MemoryRuns(runs)


def test_f5_verdict_both_ways():
    assert rules.f5(f5_runs(FAST, SLOW), SEEDS, steps=len(FAST))["verdict"] == "reproduced"
    assert rules.f5(f5_runs(SLOW, FAST), SEEDS, steps=len(FAST))["verdict"] == "not reproduced"
    assert rules.f5(f5_runs(FAST, FAST), SEEDS, steps=len(FAST))["verdict"] == "mixed"


def test_f5_a_run_that_levels_off_low_is_not_fast():
    """PPO reaching 80% of its own low plateau at once still counts against the higher plateau of REINFORCE++."""
    low_fast = [0.1, 0.1, 0.1, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3]
    out = rules.f5(f5_runs(SLOW, low_fast), SEEDS, steps=len(SLOW))
    assert out["data"]["ppo"][0]["steps"] == len(SLOW)  # never reaches the shared target: the run length
    assert out["verdict"] == "reproduced"


def test_f5_without_ppo_is_not_measured():
    runs = by_seed("tir_medium_p0", lambda n, s: make_run(n, **{mn.ACCURACY: FAST}))
    assert rules.f5(MemoryRuns(runs), SEEDS, steps=len(FAST)) == {}


# ---------------------------------------------------------------- findings 6 and 7: size and budget sweeps


PARAMS = {"small": 230_000, "medium": 850_000, "large": 1_900_000}


def size_runs(tmp_path: Path, finals: dict[str, list[float]]) -> MemoryRuns:
    """The size sweep: for each size, one final held-out accuracy per run (pretraining seed, then RL seed)."""
    runs = {}
    for size, values in finals.items():
        for p in PSEEDS:
            (tmp_path / f"base_{size}_p{p}").mkdir(exist_ok=True)
            (tmp_path / f"base_{size}_p{p}" / INFO_FILE).write_text(json.dumps({"record": {"params": PARAMS[size]}}))
        names = [rules.tir(size, p, s) for p in PSEEDS for s in SEEDS]
        runs.update({n: make_run(n, **heldout(v, v)) for n, v in zip(names, values)})
    return MemoryRuns(runs)


NOISE = [0.0, 0.02, -0.02, 0.01, -0.01, 0.0]  # the spread over the 6 runs of one size


def finals(means: list[float]) -> dict[str, list[float]]:
    return {size: [m + e for e in NOISE] for size, m in zip(PARAMS, means)}


def test_f6_verdict_both_ways(tmp_path):
    rising = rules.f6(size_runs(tmp_path, finals([0.5, 0.6, 0.7])), tmp_path, SEEDS, PSEEDS)
    assert rising["verdict"] == "reproduced" and "small (0.23M): 0.50 (95% CI 0.49 to 0.51; range 0.48 to 0.52; n 6)" in rising["evidence"]
    assert rules.f6(size_runs(tmp_path, finals([0.6, 0.6, 0.6])), tmp_path, SEEDS, PSEEDS)["verdict"] == \
        "not reproduced"
    # Larger at the top but not at every size step.
    assert rules.f6(size_runs(tmp_path, finals([0.5, 0.5, 0.7])), tmp_path, SEEDS, PSEEDS)["verdict"] == "mixed"


def test_f6_a_step_inside_the_spread_of_the_seeds_is_no_rise(tmp_path):
    """Means 0.01 apart with runs spread over +-0.05: the t-test cannot tell the sizes apart."""
    wide = [0.05, -0.05, 0.04, -0.04, 0.0, 0.0]
    runs = {size: [m + e for e in wide] for size, m in zip(PARAMS, [0.50, 0.51, 0.52])}
    assert rules.f6(size_runs(tmp_path, runs), tmp_path, SEEDS, PSEEDS)["verdict"] == "not reproduced"


def test_f6_needs_two_sizes(tmp_path):
    runs = size_runs(tmp_path, {"medium": [0.5] * 6})
    assert rules.f6(runs, tmp_path, SEEDS, PSEEDS) == {}


def budget_runs(multi: list[float]) -> MemoryRuns:
    """Budgets 1, 2, 4 with the given multi-step accuracy (each seed's run spread by NOISE)."""
    names = {1: "budget1_s{}", 2: "budget2_s{}", 4: "tir_medium_p0_s{}"}
    return MemoryRuns({name.format(s): make_run(name.format(s), **heldout(0.9, 0.9, multi=m + NOISE[s]),
                                                **heldout(1.0, 1.0, "calls_per_response", multi=b / 2))
                       for (b, name), m in zip(names.items(), multi) for s in SEEDS})


def test_f7_verdict_both_ways():
    assert rules.f7(budget_runs([0.2, 0.5, 0.7]), SEEDS)["verdict"] == "reproduced"
    flat = rules.f7(budget_runs([0.6, 0.6, 0.6]), SEEDS)
    assert flat["verdict"] == "not reproduced" and "multi-step calls per answer N_max 1 0.50" in flat["evidence"]


def test_f7_needs_every_budget():
    runs = budget_runs([0.2, 0.5, 0.7])
    assert rules.f7(MemoryRuns({f"budget1_s{s}": runs.get(f"budget1_s{s}") for s in SEEDS}), SEEDS) == {}


def test_spread_gives_the_mean_its_interval_and_the_range():
    assert rules.spread([0.5, 0.7]) == "0.60 (95% CI -0.67 to 1.87; range 0.50 to 0.70; n 2)"
    assert rules.spread([0.4]) == "0.40 (n 1)"


# ---------------------------------------------------------------- finding 8: selective tool use


def f8_runs(easy: float, hard: float) -> list[tuple[str, Run]]:
    return reference(lambda n, s: make_run(n, **heldout(easy, hard, mn.EVAL_TOOL_CALL_RATE)))


def test_f8_verdict_both_ways():
    assert rules.f8(f8_runs(0.2, 0.9))["verdict"] == "reproduced"
    assert rules.f8(f8_runs(1.0, 1.0))["verdict"] == "not reproduced"
    assert rules.f8(f8_runs(0.5, 0.6))["verdict"] == "mixed"  # a gap of 0.1: between the two thresholds


# ---------------------------------------------------------------- finding 9: the first half predicts the second


def law_curve(points: int = 30) -> np.ndarray:
    return sf.law(np.arange(points), 0.1, 0.8, 10.0, 2.5)


def flat_after_half(points: int = 30) -> np.ndarray:
    """Rises through the first half, then holds the first half's last-quarter mean: the flat forecast is exact."""
    half = points // 2
    first = np.linspace(0.1, 0.5, half)
    naive = float(np.mean(first[half - max(1, half // 4):]))
    return np.concatenate([first, np.full(points - half, naive)])


def test_f9_verdict_both_ways():
    names = ["tir_medium_p0_s0", "tir_medium_p0_s1", "tir_medium_p1_s0", "ppo_s0"]
    law_runs = MemoryRuns({n: make_run(n, **{mn.ACCURACY: law_curve()}) for n in names})
    assert rules.f9(law_runs, names)["verdict"] == "reproduced"
    flat_runs = MemoryRuns({n: make_run(n, **{mn.ACCURACY: flat_after_half()}) for n in names})
    assert rules.f9(flat_runs, names)["verdict"] == "not reproduced"
    half = MemoryRuns({**{n: law_runs.get(n) for n in names[:2]}, **{n: flat_runs.get(n) for n in names[2:]}})
    assert rules.f9(half, names)["verdict"] == "mixed"


# ---------------------------------------------------------------- finding 10: the closed form across sizes


def f10_runs(tmp_path: Path, success) -> MemoryRuns:
    """The size sweep with accuracy ``success(params, steps)``; response length 30 at every step of every run."""
    steps = np.arange(20)
    runs = {}
    for size, params in PARAMS.items():
        for p in PSEEDS:
            (tmp_path / f"base_{size}_p{p}").mkdir(exist_ok=True)
            (tmp_path / f"base_{size}_p{p}" / INFO_FILE).write_text(json.dumps({"record": {"params": params}}))
            for s in SEEDS:
                name = rules.tir(size, p, s)
                runs[name] = make_run(name, **{mn.ACCURACY: success(params, steps),
                                               mn.RESPONSE_LENGTH: np.full(20, 30.0)})
    return MemoryRuns(runs)


def test_f10_verdict_both_ways(tmp_path):
    closed = f10_runs(tmp_path, lambda n, t: laws.closed_form(np.log(n), t, np.full(len(t), 30.0), 0.3, 0.6, 0.2))
    assert rules.f10(closed, tmp_path, SEEDS, PSEEDS)["verdict"] == "reproduced"
    # The middle size plateaus far below the two others: a per-run law follows each, a + b ln N cannot.
    plateau = {230_000: 0.9, 850_000: 0.2, 1_900_000: 0.9}
    per_run = f10_runs(tmp_path, lambda n, t: sf.law(t, 0.1, plateau[n], 5.0, 2.0))
    out = rules.f10(per_run, tmp_path, SEEDS, PSEEDS)
    assert out["verdict"] == "not reproduced" and out["data"]["fit"]["r2"] < out["data"]["law_r2"] - 0.05


def test_f10_without_a_fit_is_not_reproduced(tmp_path):
    constant = f10_runs(tmp_path, lambda n, t: np.full(len(t), 0.5))  # no law fits a constant curve
    out = rules.f10(constant, tmp_path, SEEDS, PSEEDS)
    assert out["verdict"] == "not reproduced" and out["evidence"].startswith("closed form not fitted")


def test_every_finding_has_a_rule_and_a_title():
    assert set(rules.RULES) == set(rules.TITLES) == set(range(11))
    assert rules.fmt(None) == rules.fmt(float("nan")) == "n/a"
