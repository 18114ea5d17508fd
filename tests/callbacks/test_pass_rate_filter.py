"""PassRateFilter: which groups are kept, what is logged, and the statistics that must survive resume."""

from __future__ import annotations

import pytest
import torch

from callbacks import PassRateFilter, pass_rate_decision, pass_rate_keep_mask
from tests.callbacks.helpers import FakeModule, FakeTrainer, make_batch, step_outputs
from zerotir.types import Trajectories
from zerotir import metric_names


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


def test_keep_mask_rejects_bad_bounds():
    with pytest.raises(ValueError, match="low"):
        pass_rate_keep_mask(torch.ones(2), torch.zeros(2), low=0.8, high=0.2)
    with pytest.raises(ValueError, match="low"):
        PassRateFilter(low=0.9, high=0.1)
    with pytest.raises(ValueError, match="min_keep_groups"):
        PassRateFilter(min_keep_groups=0)


def three_groups():
    # group 10: 0/4 correct, group 11: 2/4, group 12: 4/4
    return make_batch([0, 0, 0, 0, 1, 0, 1, 0, 1, 1, 1, 1], [10] * 4 + [11] * 4 + [12] * 4)


def run_step(callback, trainer, module, batch, rl_step=1) -> Trajectories:
    """The module's part: register at setup, decide, train on the kept rows; the callback observes the result."""
    callback.setup(trainer, module, "fit")
    decision = module.rollout_filter(batch) if module.rollout_filter is not None else None
    callback.on_train_batch_end(trainer, module, step_outputs(batch, rl_step, decision), None, 0)
    return batch if decision is None else batch.select(decision.keep)


def test_decision_is_a_pure_function_of_the_mask_and_the_reduced_counts(monkeypatch):
    # The counts over all ranks are the caller's (decide's explicit global_group_counts): the decision runs none.
    import callbacks.pass_rate_filter as F

    monkeypatch.setattr(F, "global_group_counts", lambda *a: pytest.fail("pass_rate_decision ran a collective"))
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


def test_decide_counts_the_groups_over_the_ranks_once(monkeypatch):
    import callbacks.pass_rate_filter as F

    calls = []
    monkeypatch.setattr(F, "global_group_counts", lambda keep, groups: calls.append(keep.tolist()) or (2, 6))
    decision = PassRateFilter(min_keep_groups=2).decide(three_groups())
    assert len(calls) == 1 and (decision.kept_groups, decision.groups, decision.skipped) == (2, 6, False)


def test_filter_keeps_mixed_groups_and_logs_kept_fraction():
    trainer, module = FakeTrainer(), FakeModule()
    callback = PassRateFilter()  # defaults drop all-wrong and all-right groups
    kept = run_step(callback, trainer, module, three_groups(), rl_step=7)
    assert kept.group_ids.tolist() == [11] * 4
    assert kept.rewards.tolist() == [1, 0, 1, 0]
    assert len(kept.response_texts) == 4
    # 1 of 3 groups kept
    value, kwargs = module.logged[metric_names.KEPT_FRACTION]
    assert value == pytest.approx(1 / 3) and kwargs["logger"] is False
    assert trainer.loggers[0].calls == [({metric_names.KEPT_FRACTION: pytest.approx(1 / 3)}, 7)]
    assert callback.state_dict() == {
        "steps_seen": 1, "steps_skipped": 0, "groups_seen": 3, "groups_kept": 1,
        "trajectories_seen": 12, "trajectories_kept": 4, "last_kept_fraction": pytest.approx(1 / 3),
    }


def test_filter_returns_empty_selection_when_too_few_groups_pass():
    callback = PassRateFilter(min_keep_groups=2)
    module = FakeModule()
    kept = run_step(callback, FakeTrainer(), module, three_groups())
    assert len(kept) == 0 and kept.input_ids.shape == (0, 6) and kept.response_texts == []
    assert module.logged[metric_names.KEPT_FRACTION][0] == 0.0
    assert callback.steps_skipped == 1 and callback.groups_kept == 0 and callback.groups_seen == 3


def test_disabled_filter_passes_through_without_counting():
    callback = PassRateFilter(enabled=False)
    module = FakeModule()
    batch = three_groups()
    assert run_step(callback, FakeTrainer(), module, batch) is batch
    assert module.rollout_filter is None and module.logged == {} and callback.steps_seen == 0


def test_state_dict_round_trip():
    first = PassRateFilter(low=0.25, high=0.75)
    for _ in range(2):
        run_step(first, FakeTrainer(), FakeModule(), three_groups())
    restored = PassRateFilter(low=0.25, high=0.75)
    restored.load_state_dict(first.state_dict())
    assert restored.state_dict() == first.state_dict()
    assert restored.steps_seen == 2 and restored.groups_seen == 6 and restored.groups_kept == 2
    with pytest.raises(KeyError, match="groups_kept"):
        restored.load_state_dict({"steps_seen": 1})


def test_kept_fraction_is_the_share_of_groups_kept_whatever_the_rules_remove_row_by_row():
    # Groups 10 and 11 pass the pass rate (1 of 2 right each), group 12 does not (both right): 2 of 3 groups kept.
    # model.filters then removes rows: overlong "mask" takes group 11's two truncated rows and void_turn group 10's
    # row 1. The step trains 1 row, but the logged and checkpointed kept fraction stays 2/3.
    from zerotir.config import FilterConfig, ToolConfig
    from zerotir.filters.decide import decide
    from zerotir.filters.trajectory import FilterContext

    void = "```output\n2\n```\nno answer"
    batch = make_batch([1, 0, 1, 0, 1, 1], [10, 10, 11, 11, 12, 12], truncated=[False, False, True, True, False, False],
                       texts=["\\boxed{2}", void, "\\boxed{2}", "\\boxed{", "\\boxed{2}", "\\boxed{2}"])
    trainer, module, callback = FakeTrainer(), FakeModule(), PassRateFilter()
    callback.setup(trainer, module, "fit")
    decision = decide(FilterConfig(void_turn=True, overlong="mask"), batch, module.rollout_filter(batch),
                      FilterContext.of(ToolConfig(), max_response_tokens=16), step=1, seed=0)
    assert decision.keep.tolist() == [True, False, False, False, False, False]
    callback.on_train_batch_end(trainer, module, step_outputs(batch, 1, decision), None, 0)
    assert module.logged[metric_names.KEPT_FRACTION][0] == pytest.approx(2 / 3)
    saved = callback.state_dict()
    assert saved["last_kept_fraction"] == pytest.approx(2 / 3)
    assert (saved["groups_kept"], saved["groups_seen"], saved["trajectories_kept"]) == (2, 3, 1)
    restored = PassRateFilter()
    restored.load_state_dict(saved)
    assert restored.last_kept_fraction == pytest.approx(2 / 3)
