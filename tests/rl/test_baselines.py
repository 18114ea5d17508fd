"""Hand-worked checks of the group baselines in zerotir.rl.baselines (GRPO, REINFORCE++-baseline, RLOO)."""

from __future__ import annotations

import math

import pytest
import torch

from zerotir.rl import algorithms as alg
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


# Rows of the REINFORCE++-baseline / RLOO cases (T = 5): row 0 = prompt, action, INJECTED, action, pad.
MASK = T([[0, 1, 0, 1, 0], [0, 1, 1, 0, 0], [0, 1, 0, 0, 0], [0, 1, 1, 1, 0]], dtype=torch.bool)


def test_reinforce_baseline_hand_worked_with_an_injected_span():
    rewards, groups = T([1.0, 0.0, 1.0, 1.0]), T([0, 0, 1, 1])
    adv, ret = bl.reinforce_baseline_advantages(rewards, groups, MASK)
    # group 0: mean 0.5 -> [0.5, -0.5]; group 1: all right -> [0, 0]. Gamma 1: every action token of a row carries
    # its centred reward (the injected token at row 0, position 2 gets nothing and costs nothing).
    close(ret, [[0, 0.5, 0, 0.5, 0], [0, -0.5, -0.5, 0, 0], [0] * 5, [0] * 5])
    # 8 action tokens [0.5, 0.5, -0.5, -0.5, 0, 0, 0, 0]: mean 0, unbiased var 4 * 0.25 / 7 = 1/7 -> x * sqrt(7)
    h = 0.5 * math.sqrt(7)  # 1.3228757
    close(adv, [[0, h, 0, h, 0], [0, -h, -h, 0, 0], [0] * 5, [0] * 5], atol=1e-6)
    # GRPO would divide by the group std as well; REINFORCE++ without the baseline sees raw rewards [1, 0, 1, 1].
    plain, _ = alg.reinforce_pp_advantages(rewards, MASK)
    assert not torch.allclose(plain, adv)


def test_reinforce_baseline_folds_the_kl_in_per_token_after_the_baseline():
    rewards, groups = T([1.0, 0.0]), T([0, 0])
    kl = T([[0.0, 0.2, 9.0, 0.4, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    _, ret = bl.reinforce_baseline_advantages(rewards, groups, MASK[:2], kl, kl_coef=0.5)
    # centred rewards [0.5, -0.5]; row 0 token rewards: pos 1: -0.1, pos 3: -0.2 + 0.5 = 0.3 (the 9 is injected)
    # returns: pos 3: 0.3, pos 1: -0.1 + 0.3 = 0.2;  row 1: -0.5 on both action tokens
    close(ret, [[0, 0.2, 0, 0.3, 0], [0, -0.5, -0.5, 0, 0]])


def test_whitening_epsilon_is_a_setting():
    rewards, groups = T([1.0, 0.0]), T([0, 0])
    mask = T([[0, 1], [0, 1]], dtype=torch.bool)
    # returns [0.5, -0.5]: mean 0, unbiased var 0.5; eps 0.5 -> / sqrt(1): unchanged; eps 1e-8 -> / sqrt(0.5)
    close(bl.reinforce_baseline_advantages(rewards, groups, mask, eps=0.5)[0], [[0, 0.5], [0, -0.5]])
    s = 0.5 / math.sqrt(0.5)
    close(bl.reinforce_baseline_advantages(rewards, groups, mask)[0], [[0, s], [0, -s]], atol=1e-6)


def test_rloo_hand_worked_with_an_injected_span_is_not_whitened():
    rewards, groups = T([1.0, 0.0, 0.0, 1.0]), T([0, 0, 0, 7])
    adv, ret = bl.rloo_advantages(rewards, groups, MASK)
    # group 0: 1 - mean(0, 0) = 1; 0 - mean(1, 0) = -0.5 (twice); group 7 is a group of one -> 0
    close(ret, [[0, 1, 0, 1, 0], [0, -0.5, -0.5, 0, 0], [0, -0.5, 0, 0, 0], [0] * 5])
    close(adv, ret)  # in reward units, no whitening
    kl = torch.full((4, 5), 0.2)
    adv_kl, _ = bl.rloo_advantages(rewards, groups, MASK, kl, kl_coef=0.5)
    # row 0 with KL: token rewards -0.1 (pos 1) and 1 - 0.1 = 0.9 (pos 3) -> returns 0.8, 0.9
    close(adv_kl[0], [0, 0.8, 0, 0.9, 0])


def test_a_group_of_one_sample_gets_no_signal():
    mask = T([[0, 1, 1]], dtype=torch.bool)
    one, group = T([1.0]), T([4])
    close(bl.group_advantages(one, group), [0.0])
    close(bl.leave_one_out_advantages(one, group), [0.0])
    close(bl.rloo_advantages(one, group, mask)[0], [[0, 0, 0]])
    adv, ret = bl.reinforce_baseline_advantages(one, group, mask)
    close(ret, [[0, 0, 0]])
    close(adv, [[0, 0, 0]])  # variance 0 + eps: 0 / sqrt(eps) stays 0, no NaN


def test_injected_span_is_transparent_to_the_group_estimators():
    with_span = T([[0, 1, 1, 0, 0, 1], [0, 1, 0, 0, 0, 0]], dtype=torch.bool)  # row 0: a, a, env, env, a
    without = T([[0, 1, 1, 1, 0, 0], [0, 1, 0, 0, 0, 0]], dtype=torch.bool)  # the span cut out
    rewards, groups = T([1.0, 0.0]), T([0, 0])
    kl_with = T([[0.0, 0.1, 0.2, 7.0, 7.0, 0.3], [0.0, 0.4, 0, 0, 0, 0]])
    kl_without = T([[0.0, 0.1, 0.2, 0.3, 0.0, 0.0], [0.0, 0.4, 0, 0, 0, 0]])
    for fn in (bl.reinforce_baseline_advantages, bl.rloo_advantages):
        a1, _ = fn(rewards, groups, with_span, kl_with, 0.5)
        a2, _ = fn(rewards, groups, without, kl_without, 0.5)
        close(a1[with_span], a2[without], atol=1e-6)
        assert (a1[~with_span] == 0).all()
