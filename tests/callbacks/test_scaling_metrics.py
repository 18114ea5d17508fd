"""ScalingMetrics: hand-worked rollout metrics and what on_train_batch_end logs."""

from __future__ import annotations

import pytest
import torch

from callbacks import ScalingMetrics, rollout_metrics
from tests.callbacks.helpers import FakeModule, FakeTrainer, make_batch, step_outputs
from zerotir import metric_names as mn
from zerotir.types import ToolCall


def four_trajectories():
    return make_batch(
        rewards=[1, 0, 1, 1],
        group_ids=[0, 0, 1, 1],
        num_calls=[1, 0, 0, 3],
        exec_errors=[0, 0, 0, 1],
        timeouts=[1, 0, 0, 0],
        sandbox_errors=[0, 0, 0, 1],
        truncated=[False, True, False, False],
        response_lens=[10, 20, 30, 40],
        texts=["aaaa", "abc", "abab", ""],
    )


def test_rollout_metrics_hand_worked():
    m = rollout_metrics(four_trajectories())
    expected = {
        mn.REWARD_MEAN: 0.75,  # (1 + 0 + 1 + 1) / 4
        mn.ACCURACY: 0.75,
        mn.TOOL_CALL_RATE: 0.5,  # rows 0 and 3 made calls
        mn.TOOL_IN_CORRECT: 2 / 3,  # correct rows 0, 2, 3; rows 0 and 3 used code
        mn.CALLS_PER_RESPONSE: 1.0,  # (1 + 0 + 0 + 3) / 4
        mn.RESPONSE_LENGTH: 25.0,  # (10 + 20 + 30 + 40) / 4
        mn.REPEAT_SCORE: 0.225,  # (0.6 + 0 + 0.3 + 0) / 4, see test_text_metrics
        mn.EXEC_ERROR_RATE: 0.25,  # 1 error / 4 executions
        mn.TIMEOUT_RATE: 0.25,  # 1 / 4
        mn.SANDBOX_ERROR_RATE: 0.25,  # 1 / 4
        mn.TRUNCATION_RATE: 0.25,  # row 1
        mn.TOOLS_INFRA_FAILED: 0.25,  # row 3: its sandbox failed
        "rollout/correct_calls_0": 1.0,  # row 2
        "rollout/correct_calls_1": 1.0,  # row 0
        "rollout/correct_calls_2": 0.0,
        "rollout/correct_calls_3plus": 1.0,  # row 3
    }
    assert m == pytest.approx(expected)
    assert set(m) == set(expected) and set(mn.CORRECT_BY_CALLS) <= set(m)


def test_rollout_metrics_carry_the_per_tool_metrics_of_the_tools_called():
    batch = four_trajectories()
    batch.tool_calls = [[ToolCall("1+1", "ok", "2", "calculator", 0.5)], [], [],
                        [ToolCall("x", "timeout", "", "python", 2.0)] * 3]
    m = rollout_metrics(batch)
    assert m[mn.tool_tag("calculator", "calls")] == 1 and m[mn.tool_tag("python", "calls")] == 3
    assert m[mn.tool_tag("python", "timeouts")] == 1.0 and m[mn.tool_tag("python", "latency")] == 2.0
    # no call, no tag (the step's share of infrastructure failures is logged whatever was called)
    assert [k for k in rollout_metrics(four_trajectories()) if k.startswith("tools/")] == [mn.TOOLS_INFRA_FAILED]


def test_rollout_metrics_without_calls_or_correct_answers_are_zero_not_nan():
    m = rollout_metrics(make_batch([0, 0], [0, 0], exec_errors=[0, 0]))
    assert m[mn.TOOL_IN_CORRECT] == 0.0 and m[mn.EXEC_ERROR_RATE] == 0.0 and m[mn.SANDBOX_ERROR_RATE] == 0.0


def test_rollout_metrics_repeat_ngram_and_bad_input():
    # bigram form: "aaaa" -> aa x3, 1 distinct -> 2/3; "abc" 0; "abab" 1/3; "" 0 -> mean (2/3 + 1/3) / 4 = 0.25
    assert rollout_metrics(four_trajectories(), repeat_ngram=2)[mn.REPEAT_SCORE] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="non-empty"):
        rollout_metrics(four_trajectories().select(torch.zeros(4, dtype=torch.bool)))
    batch = four_trajectories()
    batch.response_texts = batch.response_texts[:2]
    with pytest.raises(ValueError, match="response_texts"):
        rollout_metrics(batch)


def test_on_train_batch_end_logs_everything_on_the_rl_step_axis():
    trainer, module = FakeTrainer(), FakeModule()
    timings = {"generation": 2.0, "sandbox": 0.5, "reward": 0.1, "update": 1.0, "weight_sync": 0.2, "step": 3.9,
               "queue": 0.05}
    stats = {"kl": 0.01, "entropy": 1.2, "policy_loss": -0.1, "value_loss": 0.3, "clip_fraction": 0.05,
             "grad_norm": 0.9, "lr": 1e-6, "ratio_mean": 1.0}
    outputs = step_outputs(four_trajectories(), rl_step=5, stats=stats, timings=timings)
    ScalingMetrics().on_train_batch_end(trainer, module, outputs, None, 0)
    [(metrics, step)] = trainer.loggers[0].calls
    assert step == 5
    assert metrics[mn.TIME_GENERATION] == 2.0 and metrics[mn.TIME_STEP] == 3.9 and metrics["time/queue"] == 0.05
    assert metrics[mn.KL] == 0.01 and metrics[mn.LEARNING_RATE] == 1e-6 and metrics["train/ratio_mean"] == 1.0
    assert metrics[mn.ACCURACY] == 0.75
    assert set(module.logged) == set(metrics)  # also sent to callback_metrics, with logger=False
    assert all(kwargs["logger"] is False for _, kwargs in module.logged.values())


def test_each_removal_rule_logs_the_share_of_trajectories_it_matched():
    # 4 trajectories: the pass rate dropped group 1 (rows 2, 3) -> 0.5; void_turn matched row 0 -> 0.25; roc none -> 0.
    from zerotir.rl.step import FilterDecision

    removed = {"pass_rate": torch.tensor([False, False, True, True]),
               "void_turn": torch.tensor([True, False, False, False]), "roc": torch.zeros(4, dtype=torch.bool)}
    decision = FilterDecision(torch.tensor([False, True, False, False]), 1, 2, removed=removed)
    trainer = FakeTrainer()
    ScalingMetrics().on_train_batch_end(trainer, FakeModule(), step_outputs(four_trajectories(), decision=decision),
                                        None, 0)
    [(metrics, _)] = trainer.loggers[0].calls
    assert metrics["filter/pass_rate_fraction"] == 0.5 and metrics[mn.FILTER_FRACTIONS["void_turn"]] == 0.25
    assert metrics["filter/roc_fraction"] == 0.0
    trainer = FakeTrainer()
    ScalingMetrics().on_train_batch_end(trainer, FakeModule(), step_outputs(four_trajectories()), None, 0)
    assert not [name for name in trainer.loggers[0].calls[0][0]
                if name.endswith("_fraction") and name != mn.TOOLS_INFRA_FAILED]


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="repeat_ngram"):
        ScalingMetrics(repeat_ngram=0)
