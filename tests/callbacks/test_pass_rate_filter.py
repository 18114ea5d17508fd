"""PassRateFilter: what it counts and logs of the filters' decisions, and the statistics that must survive resume
(the rule itself: tests/filters/test_pass_rate.py)."""

from __future__ import annotations

import pytest
import torch

from callbacks import PassRateFilter
from tests.callbacks.helpers import FakeModule, FakeTrainer, make_batch, step_outputs
from zerotir import metric_names
from zerotir.config import FilterConfig, ToolConfig
from zerotir.filters.decide import decide
from zerotir.filters.trajectory import FilterContext
from zerotir.types import Trajectories

CTX = FilterContext.of(ToolConfig(), max_response_tokens=16)


def three_groups():
    # group 10: 0/4 correct, group 11: 2/4, group 12: 4/4
    return make_batch([0, 0, 0, 0, 1, 0, 1, 0, 1, 1, 1, 1], [10] * 4 + [11] * 4 + [12] * 4)


def run_step(callback, trainer, module, batch, rl_step=1, **rules) -> Trajectories:
    """The module's part: decide with ``model.filters`` (``rules``), train on the kept rows; the callback observes
    the result."""
    decision = decide(FilterConfig(**rules), batch, CTX, step=rl_step, seed=0)
    callback.on_train_batch_end(trainer, module, step_outputs(batch, rl_step, decision), None, 0)
    return batch if decision is None else batch.select(decision.keep)


def test_filter_keeps_mixed_groups_and_logs_kept_fraction():
    trainer, module = FakeTrainer(), FakeModule()
    callback = PassRateFilter()
    kept = run_step(callback, trainer, module, three_groups(), rl_step=7, pass_rate=True)  # drops all-wrong / -right
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
    callback = PassRateFilter()
    module = FakeModule()
    kept = run_step(callback, FakeTrainer(), module, three_groups(), pass_rate=True, min_keep_groups=2)
    assert len(kept) == 0 and kept.input_ids.shape == (0, 6) and kept.response_texts == []
    assert module.logged[metric_names.KEPT_FRACTION][0] == 0.0
    assert callback.steps_skipped == 1 and callback.groups_kept == 0 and callback.groups_seen == 3


def test_a_step_without_a_decision_is_not_counted():
    callback = PassRateFilter()
    module = FakeModule()
    batch = three_groups()
    # every rule off: no decision, all trains
    assert run_step(callback, FakeTrainer(), module, batch, infra_failed=False) is batch
    assert module.logged == {} and callback.steps_seen == 0


def test_state_dict_round_trip():
    first = PassRateFilter()
    for _ in range(2):
        run_step(first, FakeTrainer(), FakeModule(), three_groups(), pass_rate=True, pass_rate_low=0.25,
                 pass_rate_high=0.75)
    restored = PassRateFilter()
    restored.load_state_dict(first.state_dict())
    assert restored.state_dict() == first.state_dict()
    assert restored.steps_seen == 2 and restored.groups_seen == 6 and restored.groups_kept == 2
    with pytest.raises(KeyError, match="groups_kept"):
        restored.load_state_dict({"steps_seen": 1})


def test_kept_fraction_is_the_share_of_groups_kept_whatever_the_rules_remove_row_by_row():
    # Groups 10 and 11 pass the pass rate (1 of 2 right each), group 12 does not (both right): 2 of 3 groups kept.
    # model.filters then removes rows: overlong "mask" takes group 11's two truncated rows and void_turn group 10's
    # row 1. The step trains 1 row, but the logged and checkpointed kept fraction stays 2/3.
    void = "```output\n2\n```\nno answer"
    batch = make_batch([1, 0, 1, 0, 1, 1], [10, 10, 11, 11, 12, 12], truncated=[False, False, True, True, False, False],
                       texts=["\\boxed{2}", void, "\\boxed{2}", "\\boxed{", "\\boxed{2}", "\\boxed{2}"])
    trainer, module, callback = FakeTrainer(), FakeModule(), PassRateFilter()
    decision = decide(FilterConfig(pass_rate=True, void_turn=True, overlong="mask"), batch, CTX, step=1, seed=0)
    assert decision.keep.tolist() == [True, False, False, False, False, False]
    callback.on_train_batch_end(trainer, module, step_outputs(batch, 1, decision), None, 0)
    assert module.logged[metric_names.KEPT_FRACTION][0] == pytest.approx(2 / 3)
    saved = callback.state_dict()
    assert saved["last_kept_fraction"] == pytest.approx(2 / 3)
    assert (saved["groups_kept"], saved["groups_seen"], saved["trajectories_kept"]) == (2, 3, 1)
    restored = PassRateFilter()
    restored.load_state_dict(saved)
    assert restored.last_kept_fraction == pytest.approx(2 / 3)
