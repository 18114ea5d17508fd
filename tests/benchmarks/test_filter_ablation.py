"""The arms and the step shares of ``benchmarks/filter_ablation.py`` (the README's filter table) on hand-made runs."""

from pathlib import Path

import numpy as np
import pandas as pd
from benchmarks import filter_ablation as fa
from zerotir import metric_names as mn
from zerotir.config import FilterConfig, RefillConfig
from zerotir.scaling.runs import Run


def run(**tags: dict[int, float]) -> Run:
    """A run with ``tags`` (metric tag -> {step: value})."""
    return Run(name="r", path=Path("r"), scalars={tag: pd.Series(values, dtype=float) for tag, values in tags.items()})


def test_each_arm_adds_one_thing_to_the_one_before():
    arms = fa.arms(rounds=3)
    assert list(arms) == ["off", "paper", "refill", "mask"]
    assert arms["off"] == []
    for before, after in zip(list(arms)[:-1], list(arms)[1:]):
        assert arms[after][:len(arms[before])] == arms[before]  # every arm keeps the one before it
        assert len(arms[after]) == len(arms[before]) + (8 if after == "paper" else 2)
    assert arms["refill"][-2:] == ["--model.filters.refill.max_rounds", "3"]


def test_the_arms_name_settings_that_exist():
    # the flags are --model.<group>.<field>: each field exists in its config group
    fields = {"filters": set(FilterConfig.__dataclass_fields__),
              "filters.refill": set(RefillConfig.__dataclass_fields__)}
    flags = [f for extra in fa.arms(2).values() for f in extra if f.startswith("--")]
    for flag in flags:
        group, _, name = flag.removeprefix("--model.").rpartition(".")
        assert name in fields[group], flag
    assert [j.name for j in fa.jobs([0, 1], 2)][:5] == ["off_s0", "paper_s0", "refill_s0", "mask_s0", "off_s1"]


def test_step_shares_without_refill_read_the_kept_fraction():
    # steps 1-4: full, shrunk (0.5), skipped (no policy loss), full -> skipped 1/4, shrunk 1/4
    r = run(**{mn.KEPT_FRACTION: {1: 1.0, 2: 0.5, 3: 0.0, 4: 1.0}, mn.POLICY_LOSS: {1: 0.1, 2: 0.2, 4: 0.3}})
    assert fa.step_shares(r) == {"skipped": 0.25, "shrunk": 0.25}


def test_step_shares_with_refill_read_the_rise_of_exhausted_steps():
    # the kept fraction is below 1 at every step (a round's share), but only step 3 ran out of rounds
    r = run(**{mn.KEPT_FRACTION: {1: 0.5, 2: 0.5, 3: 0.25, 4: 0.5}, mn.POLICY_LOSS: {1: 0.1, 2: 0.1, 3: 0.1, 4: 0.1},
               mn.EXHAUSTED_STEPS: {1: 0.0, 2: 0.0, 3: 1.0, 4: 1.0}})
    assert fa.step_shares(r) == {"skipped": 0.0, "shrunk": 0.25}


def test_heldout_accuracy_at_a_step_averages_the_groups_and_needs_both():
    easy, hard = f"heldout_easy/{mn.EVAL_ACCURACY}", f"heldout_hard/{mn.EVAL_ACCURACY}"
    both = run(**{easy: {10: 0.5, 20: 1.0}, hard: {10: 0.0, 20: 0.5}})
    assert fa.heldout_acc_at(both, 10) == 0.25 and fa.heldout_acc_at(both, 20) == 0.75
    assert fa.heldout_acc_at(both, 30) is None
    assert fa.heldout_acc_at(run(**{easy: {10: 0.5}}), 10) is None


def test_removed_by_rules_sums_the_rules_means_without_the_pass_rate_decision():
    tag = mn.FILTER_FRACTIONS
    r = run(**{tag["overlong_wrong"]: {1: 0.1, 2: 0.3}, tag["shortcut"]: {1: 0.05, 2: 0.05},
               tag["pass_rate"]: {1: 0.5, 2: 0.5}})
    assert np.isclose(fa.removed_by_rules(r), 0.25)
    assert fa.removed_by_rules(run(**{mn.KEPT_FRACTION: {1: 1.0}})) == 0.0


def test_per_step_cost_averages_rounds_and_prompts_and_is_nan_without_them():
    r = run(**{mn.GENERATION_ROUNDS: {1: 1.0, 2: 3.0}, mn.PROMPTS_CONSUMED: {1: 8.0, 2: 24.0}})
    assert fa.per_step_cost(r) == {"rounds": 2.0, "prompts": 16.0}
    assert all(np.isnan(v) for v in fa.per_step_cost(run(**{mn.KEPT_FRACTION: {1: 1.0}})).values())


def test_spread_gives_mean_and_range_and_skips_missing():
    assert fa._spread([0.5, 0.7, None, float("nan")]) == "0.60 (0.50-0.70)"
    assert fa._spread([]) == "n/a"
    assert np.isclose(float(fa._spread([1.0, 3.0], ".1f").split()[0]), 2.0)
