"""Hand-worked checks of the group baselines in zerotir.rl.baselines (the estimators built on them:
tests/rl/test_estimators.py)."""

from __future__ import annotations

import math

import pytest
import torch

from zerotir.rl import baselines as bl

T = torch.tensor


def close(actual: torch.Tensor, expected, atol: float = 1e-6) -> None:
    torch.testing.assert_close(actual.double(), torch.as_tensor(expected, dtype=torch.float64), atol=atol, rtol=0)


# Rewards of 7 trajectories in 3 groups, not contiguous: group 3 = [1, 0, 0, 1], group 9 = [1, 1], group 5 = [5].
REWARDS = T([1.0, 1.0, 0.0, 5.0, 0.0, 1.0, 1.0])
GROUPS = T([3, 9, 3, 5, 3, 9, 3])


def test_group_advantages_hand_worked():
    # group 3: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.5773503 -> +-0.5 / 0.5773503 = +-0.8660254
    # group 9: [1, 1], std 0 -> 0 / (0 + eps) = 0;  group 5: one sample -> 0
    a = 0.5 / math.sqrt(1 / 3)
    close(bl.group_advantages(REWARDS, GROUPS, eps=1e-12), [a, 0, -a, 0, -a, 0, a], atol=1e-5)
    close(bl.group_advantages(REWARDS, GROUPS, scale_by_std=False), [0.5, 0, -0.5, 0, -0.5, 0, 0.5])
    # The std epsilon is a setting: group 3 with eps 0.4226497 = 1 - 0.5773503 -> +-0.5 / 1
    close(bl.group_advantages(REWARDS, GROUPS, eps=1 - math.sqrt(1 / 3)), [0.5, 0, -0.5, 0, -0.5, 0, 0.5])


def test_leave_one_out_hand_worked():
    rewards = T([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 5.0])
    groups = T([0, 0, 0, 0, 9, 9, 4])
    # group 0: the 1 against the mean of [0, 0, 0] = 0 -> 1; a 0 against the mean of [1, 0, 0] = 1/3 -> -1/3
    #   (equivalently (r - 0.25) * 4 / 3: 0.75 * 4/3 = 1, -0.25 * 4/3 = -1/3; the group sums to 0)
    # group 9: [1, 1] -> 1 - 1 = 0 each;  group 4: a group of one has no other sample -> 0
    third = 1 / 3
    close(bl.leave_one_out_advantages(rewards, groups), [1, -third, -third, -third, 0, 0, 0])
    with pytest.raises(ValueError, match="group_ids must both be"):
        bl.leave_one_out_advantages(rewards, groups[:3])


def test_kl_penalized_rewards_sum_the_kl_of_action_tokens():
    mask = T([[0, 1, 1, 0], [0, 1, 0, 0]], dtype=torch.bool)
    kl = T([[9.0, 0.2, 0.4, 9.0], [9.0, 0.5, 9.0, 9.0]])  # 9 sits on non-action tokens: ignored
    # row 0: 1 - 0.5 * (0.2 + 0.4) = 0.7;  row 1: 0 - 0.5 * 0.5 = -0.25
    close(bl.kl_penalized_rewards(T([1.0, 0.0]), mask, kl, 0.5), [0.7, -0.25])
    close(bl.kl_penalized_rewards(T([1.0, 0.0]), mask, None, 0.5), [1.0, 0.0])


def test_a_group_of_one_sample_gets_no_signal():
    one, group = T([1.0]), T([4])
    close(bl.group_advantages(one, group), [0.0])
    close(bl.leave_one_out_advantages(one, group), [0.0])
