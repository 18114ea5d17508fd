"""Infrastructure failures kept out of the gradient (``model.filters.infra_failed``): a trajectory whose tool call or
score failed for a reason that is not the model's leaves the loss, its group's baseline and its pass rate."""

from __future__ import annotations

import asyncio

import pytest
import torch

from callbacks.scaling_metrics import filter_fractions, rollout_metrics
from tests.callbacks.helpers import make_batch, step_outputs
from zerotir import metric_names as mn
from zerotir.config import FilterConfig, ToolConfig
from zerotir.filters.decide import decide, infra_failed_rows
from zerotir.filters.trajectory import FilterContext
from zerotir.rewards import WeightedReward
from zerotir.rl.update import RLConfig, compute_advantages
from zerotir.rewards.protocol import Reward, Sample, Score
from zerotir.rollout.scoring import score_trajectories

CTX = FilterContext.of(ToolConfig(), max_response_tokens=16)


def _failing(traj, sandbox: list[int] = (), tool: list[int] = (), reward: list[int] = ()):
    for row in sandbox:
        traj.num_sandbox_errors[row] = 1
    for row in tool:
        traj.num_tool_errors[row] = 1
    for row in reward:
        traj.reward_failed[row] = True
    return traj


def test_the_failed_rows_and_the_rest_of_a_group_they_leave_below_two():
    # Group 0 (4 rows): row 1's sandbox failed -> row 1 only. Group 1 (2 rows): row 4's tool raised -> row 5 is
    # alone in its group -> both. Group 2: one row by design, not failed -> stays. Group 3: the judge failed on row 7.
    traj = _failing(make_batch([1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0], [0, 0, 0, 0, 1, 1, 2, 3, 3, 3]),
                    sandbox=[1], tool=[4], reward=[7])
    assert infra_failed_rows(traj).tolist() == [False, True, False, False, True, True, False, True, False, False]
    # the model's own errors and timeouts are not infrastructure failures
    ok = make_batch([0.0, 1.0], [0, 0], num_calls=[1, 1], exec_errors=[1, 0], timeouts=[0, 1])
    assert not infra_failed_rows(ok).any() and not ok.infra_failed.any()


@pytest.mark.parametrize("algorithm", ["grpo", "rloo", "reinforce_baseline", "reinforce_pp"])
def test_a_group_with_a_failed_trajectory_gives_the_others_the_advantages_of_the_group_without_it(algorithm):
    """The acceptance case: a group of 4 with one sandbox failure scored 0, against the same batch without that
    row: every other trajectory's advantage is the same (group baselines and the batch whitening alike)."""
    rewards, groups = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0], [0, 0, 0, 0, 1, 1, 1, 1]
    traj = _failing(make_batch(rewards, groups, num_calls=[1] * 8), sandbox=[2])
    traj.rewards[2] = 0.0  # what the failure scored: a right answer whose check could not run
    without = make_batch([r for i, r in enumerate(rewards) if i != 2], [g for i, g in enumerate(groups) if i != 2])
    cfg = RLConfig(algorithm=algorithm, kl_coef=0.0)
    decision = decide(FilterConfig(), traj, CTX, step=1, seed=0)
    assert decision.keep.tolist() == [True, True, False, True, True, True, True, True]
    kept = traj.select(decision.keep)
    got, _ = compute_advantages(cfg, kept, kept.action_mask, None, None)
    want, _ = compute_advantages(cfg, without, without.action_mask, None, None)
    torch.testing.assert_close(got, want)
    # with the rule off, the failure trains as a wrong answer and moves its group's advantages
    assert decide(FilterConfig(infra_failed=False), traj, CTX, step=1, seed=0) is None
    trained, _ = compute_advantages(cfg, traj, traj.action_mask, None, None)
    assert not torch.allclose(trained[[0, 1, 3]], want[:3])


def test_the_pass_rate_is_taken_without_the_failed_rows():
    # Group 0: three right answers and a sandbox failure scored 0: all right among those that ran, so the pass-rate
    # rule drops the group (with the failure counted it would look 3 of 4 and train). Group 1: 1 of 2 right: kept.
    traj = _failing(make_batch([1.0, 1.0, 1.0, 0.0, 1.0, 0.0], [0, 0, 0, 0, 1, 1]), sandbox=[3])
    decision = decide(FilterConfig(pass_rate=True), traj, CTX, step=1, seed=0)
    assert decision.keep.tolist() == [False, False, False, False, True, True]
    assert (decision.kept_groups, decision.groups) == (1, 2)
    assert decision.removed["infra_failed"].tolist() == [False, False, False, True, False, False]
    counted = decide(FilterConfig(pass_rate=True, infra_failed=False), traj, CTX, step=1, seed=0)
    assert counted.keep.tolist() == [True] * 6


def test_a_group_the_failures_empty_counts_as_dropped_for_refill():
    traj = _failing(make_batch([0.0, 1.0, 1.0, 0.0], [0, 0, 1, 1]), tool=[0])
    decision = decide(FilterConfig(), traj, CTX, step=1, seed=0)
    assert decision.keep.tolist() == [False, False, True, True] and (decision.kept_groups, decision.groups) == (1, 2)


def test_the_failures_are_counted_in_the_step_metrics():
    traj = _failing(make_batch([1.0, 0.0, 1.0, 0.0], [0, 0, 0, 0], num_calls=[1] * 4), sandbox=[1], reward=[2])
    assert rollout_metrics(traj)[mn.TOOLS_INFRA_FAILED] == 0.5
    decision = decide(FilterConfig(), traj, CTX, step=1, seed=0)
    assert filter_fractions(step_outputs(traj, decision=decision)["step"])[mn.FILTER_FRACTIONS["infra_failed"]] == 0.5


class _Judged(Reward):
    """A reward whose verdicts are given: None for a sample it could not judge."""

    def __init__(self, verdicts: list[bool | None]):
        self.verdicts = verdicts

    async def score(self, samples):
        return [Score(0.0, False, infra_failed=True) if v is None else Score(float(v), v) for v in self.verdicts]


def test_a_score_the_reward_could_not_give_marks_the_trajectory_and_a_weighted_sum_keeps_the_mark():
    traj = make_batch([0.0, 0.0, 0.0], [0, 0, 0])
    rows = [{"problem": "1+1", "answer": "2"}]
    score_trajectories(_Judged([True, None, False]), traj, rows)
    assert traj.reward_failed.tolist() == [False, True, False] and traj.infra_failed.tolist() == [False, True, False]
    total = WeightedReward(terms=[{"class_path": "zerotir.rewards.ToolCallCost", "init_args": {"cost": 0.1}}])
    object.__setattr__(total, "_built", [(1.0, _Judged([True, None, False])), *total._built])
    samples = [Sample("1+1", "2", "x")] * 3
    assert [s.infra_failed for s in asyncio.run(total.score(samples))] == [False, True, False]
