"""The pass-rate rule of ``model.filters``: which groups are kept, the skip rule, its settings, one collective."""

from __future__ import annotations

import pytest
import torch

import zerotir.filters.pass_rate as P
from tests.callbacks.helpers import make_batch
from zerotir.config import FilterConfig, RefillConfig
from zerotir.filters.pass_rate import pass_rate, pass_rate_decision, pass_rate_keep_mask


def test_keep_mask_keeps_two_to_six_of_eight():
    # 9 groups of 8 samples; group k has k correct answers (k = 0..8)
    rewards, groups = [], []
    for k in range(9):
        rewards += [1.0] * k + [0.0] * (8 - k)
        groups += [k] * 8
    keep = pass_rate_keep_mask(torch.tensor(rewards), torch.tensor(groups), low=0.25, high=0.75)
    # means k / 8; [0.25, 0.75] inclusive keeps k = 2 (0.25) .. 6 (0.75): 5 groups, 40 rows
    kept_groups = sorted(set(torch.tensor(groups)[keep].tolist()))
    assert kept_groups == [2, 3, 4, 5, 6]
    assert int(keep.sum()) == 40


def test_keep_mask_bounds_are_inclusive_and_exact_for_decimals():
    # 3 of 5 correct: mean 0.6, which float32 would store as 0.6000000238 > 0.6 and drop
    rewards = torch.tensor([1, 1, 1, 0, 0, 1, 1, 1, 1, 0], dtype=torch.float32)
    groups = torch.tensor([4] * 5 + [8] * 5)  # second group: 4 of 5 = 0.8
    assert pass_rate_keep_mask(rewards, groups, low=0.6, high=0.6).tolist() == [True] * 5 + [False] * 5
    # groups need not be contiguous or sorted
    mixed = pass_rate_keep_mask(torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([2, 1, 2, 1]), 0.4, 0.6)
    assert mixed.tolist() == [False, True, False, True]  # group 2 mean 1.0, group 1 mean 0.5


def test_bad_settings_name_the_field_and_the_fix():
    with pytest.raises(ValueError, match="low"):
        pass_rate_keep_mask(torch.ones(2), torch.zeros(2), low=0.8, high=0.2)
    with pytest.raises(ValueError, match=r"model.filters.pass_rate_low=0.9 is above pass_rate_high=0.1"):
        FilterConfig(pass_rate=True, pass_rate_low=0.9, pass_rate_high=0.1)
    with pytest.raises(ValueError, match=r"model.filters.min_keep_groups=0: must be >= 1"):
        FilterConfig(pass_rate=True, min_keep_groups=0)
    with pytest.raises(ValueError, match=r"model.filters.pass_rate_low=0.2 applies only with pass_rate: true"):
        FilterConfig(pass_rate_low=0.2)


def test_refill_without_a_rule_that_drops_groups_is_an_error_naming_the_fix():
    with pytest.raises(ValueError, match=r"model.filters.refill.max_rounds=2: .* no rule here drops a group .* set "
                                         r"model.filters.pass_rate: true, or model.filters.refill.max_rounds: 1"):
        FilterConfig(void_turn=True, refill=RefillConfig(max_rounds=2))
    assert FilterConfig(pass_rate=True, refill=RefillConfig(max_rounds=2)).refill.enabled


def three_groups():
    # group 10: 0/4 correct, group 11: 2/4, group 12: 4/4
    return make_batch([0, 0, 0, 0, 1, 0, 1, 0, 1, 1, 1, 1], [10] * 4 + [11] * 4 + [12] * 4)


def test_decision_is_a_pure_function_of_the_mask_and_the_reduced_counts(monkeypatch):
    # The counts over all ranks are the caller's (pass_rate's explicit global_group_counts): the decision runs none.
    monkeypatch.setattr(P, "global_group_counts", lambda *a: pytest.fail("pass_rate_decision ran a collective"))
    batch = three_groups()
    keep = pass_rate_keep_mask(batch.rewards, batch.group_ids, 0.01, 0.99)
    decision = pass_rate_decision(keep, 1, 3)
    assert decision.keep.tolist() == [False] * 4 + [True] * 4 + [False] * 4
    assert (decision.kept_groups, decision.groups, decision.skipped) == (1, 3, False)
    assert decision.kept_fraction == pytest.approx(1 / 3)
    skipped = pass_rate_decision(keep, 1, 3, min_keep_groups=2)
    assert skipped.skipped and not skipped.keep.any() and skipped.kept_groups == 0 and skipped.groups == 3
    # Another rank's groups enter through the counts: 2 kept of 6 over the ranks pass min_keep_groups=2.
    assert not pass_rate_decision(keep, 2, 6, min_keep_groups=2).skipped


def test_the_rule_counts_the_groups_over_the_ranks_once(monkeypatch):
    calls = []
    monkeypatch.setattr(P, "global_group_counts", lambda keep, groups: calls.append(keep.tolist()) or (2, 6))
    decision = pass_rate(FilterConfig(pass_rate=True, min_keep_groups=2), three_groups())
    assert len(calls) == 1 and (decision.kept_groups, decision.groups, decision.skipped) == (2, 6, False)
    assert decision.keep.tolist() == [False] * 4 + [True] * 4 + [False] * 4


def test_too_few_groups_passing_keep_nothing():
    decision = pass_rate(FilterConfig(pass_rate=True, min_keep_groups=2), three_groups())  # 1 of 3 passes
    assert decision.skipped and not decision.keep.any() and (decision.kept_groups, decision.groups) == (0, 3)
