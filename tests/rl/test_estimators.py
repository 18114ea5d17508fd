"""The estimator registry (zerotir.rl.estimators): its keys are the config's algorithms, and hand-worked checks of
each estimator through the one signature the trainer calls."""

from __future__ import annotations

import math
from typing import get_args

import pytest
import torch

from zerotir.config import Algorithm, RLConfig
from zerotir.rl import algorithms as alg
from zerotir.rl import estimators as E

T = torch.tensor


def close(actual: torch.Tensor, expected, atol: float = 1e-6) -> None:
    torch.testing.assert_close(actual.double(), torch.as_tensor(expected, dtype=torch.float64), atol=atol, rtol=0)


def run(name: str, rewards, groups, mask, kl=None, values=None, **settings):
    """``ESTIMATORS[name]`` with a ``model.rl`` group of ``settings``: the trainer's call."""
    return E.ESTIMATORS[name](rewards, groups, mask, kl, values, RLConfig(algorithm=name, **settings))


def test_the_registry_has_one_estimator_per_configured_algorithm():
    assert sorted(E.ESTIMATORS) == sorted(get_args(Algorithm))
    # the registry holds the named functions the docs and the tests call
    assert dict(E.ESTIMATORS) == {"reinforce_pp": E.reinforce_pp, "reinforce_baseline": E.reinforce_baseline,
                                  "rloo": E.rloo, "grpo": E.grpo, "ppo": E.ppo}


def test_choice_lists_are_the_config_literals():
    from zerotir.config import GAEInjected, KLEstimator, LossAggMode, OffPolicyCorrection
    from zerotir.rl.off_policy import CORRECTIONS

    assert alg.KL_KINDS == get_args(KLEstimator)
    assert alg.GAE_INJECTED_MODES == get_args(GAEInjected)
    assert alg.LOSS_AGG_MODES == get_args(LossAggMode)
    assert CORRECTIONS == get_args(OffPolicyCorrection)


# ---- REINFORCE++ ---------------------------------------------------------------------------------------------------


def test_reinforce_pp_whitens_over_the_batch():
    mask = T([[0, 1, 1, 0], [0, 1, 1, 1]], dtype=torch.bool)
    adv, targets = run("reinforce_pp", T([1.0, 0.0]), T([0, 1]), mask)
    assert targets is None  # no critic
    # gamma 1, reward on the last action token, summed backwards: returns [[0, 1, 1, 0], [0, 0, 0, 0]]
    # action-token returns [1, 1, 0, 0, 0]: mean 0.4, unbiased var (2 * 0.36 + 3 * 0.16) / 4 = 0.3, std 0.5477226
    hi, lo = 0.6 / math.sqrt(0.3), -0.4 / math.sqrt(0.3)  # 1.0954451, -0.7302967
    close(adv, [[0, hi, hi, 0], [0, lo, lo, lo]], atol=1e-5)


def test_reinforce_pp_folds_kl_into_rewards():
    mask = T([[0, 1, 1], [0, 1, 1]], dtype=torch.bool)
    kl = T([[0.0, 0.2, 0.4], [0.0, 0.0, 0.0]])
    adv, _ = run("reinforce_pp", T([1.0, 0.0]), T([0, 1]), mask, kl, kl_coef=0.5)
    # row 0 token rewards [0, -0.1, -0.2 + 1 = 0.8] -> returns [0, 0.7, 0.8]; row 1: 0
    # action returns [0.7, 0.8, 0, 0]: mean 0.375, unbiased var (0.325^2 + 0.425^2 + 2 * 0.375^2) / 3 = 0.5675 / 3
    s = math.sqrt(0.5675 / 3)
    close(adv, [[0, 0.325 / s, 0.425 / s], [0, -0.375 / s, -0.375 / s]], atol=1e-5)
    # without the KL the two action tokens of row 0 would carry the same return
    plain, _ = run("reinforce_pp", T([1.0, 0.0]), T([0, 1]), mask)
    assert plain[0, 1] == plain[0, 2]


# ---- the group estimators ------------------------------------------------------------------------------------------

# Rows of the REINFORCE++-baseline / RLOO cases (T = 5): row 0 = prompt, action, INJECTED, action, pad.
MASK = T([[0, 1, 0, 1, 0], [0, 1, 1, 0, 0], [0, 1, 0, 0, 0], [0, 1, 1, 1, 0]], dtype=torch.bool)


def test_reinforce_baseline_hand_worked_with_an_injected_span():
    rewards, groups = T([1.0, 0.0, 1.0, 1.0]), T([0, 0, 1, 1])
    adv, targets = run("reinforce_baseline", rewards, groups, MASK)
    assert targets is None
    # group 0: mean 0.5 -> [0.5, -0.5]; group 1: all right -> [0, 0]. Gamma 1: every action token of a row carries
    # its centred reward (the injected token at row 0, position 2 gets nothing and costs nothing).
    # 8 action tokens [0.5, 0.5, -0.5, -0.5, 0, 0, 0, 0]: mean 0, unbiased var 4 * 0.25 / 7 = 1/7 -> x * sqrt(7)
    h = 0.5 * math.sqrt(7)  # 1.3228757
    close(adv, [[0, h, 0, h, 0], [0, -h, -h, 0, 0], [0] * 5, [0] * 5], atol=1e-6)
    # GRPO would divide by the group std as well; REINFORCE++ without the baseline sees raw rewards [1, 0, 1, 1].
    plain, _ = run("reinforce_pp", rewards, groups, MASK)
    assert not torch.allclose(plain, adv)


def test_reinforce_baseline_folds_the_kl_in_per_token_after_the_baseline():
    rewards, groups = T([1.0, 0.0]), T([0, 0])
    kl = T([[0.0, 0.2, 9.0, 0.4, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
    adv, _ = run("reinforce_baseline", rewards, groups, MASK[:2], kl, kl_coef=0.5)
    # centred rewards [0.5, -0.5]; row 0 token rewards: pos 1: -0.1, pos 3: -0.2 + 0.5 = 0.3 (the 9 is injected)
    # returns: pos 3: 0.3, pos 1: -0.1 + 0.3 = 0.2;  row 1: -0.5 on both action tokens
    returns = T([[0, 0.2, 0, 0.3, 0], [0, -0.5, -0.5, 0, 0]])
    close(adv, alg.masked_whiten(returns, MASK[:2]))
    # action returns [0.2, 0.3, -0.5, -0.5]: mean -0.125, unbiased var (0.325^2 + 0.425^2 + 2 * 0.375^2) / 3
    s = math.sqrt(0.5675 / 3)
    close(adv[0, [1, 3]], [0.325 / s, 0.425 / s], atol=1e-5)


def test_whitening_epsilon_is_a_setting():
    rewards, groups = T([1.0, 0.0]), T([0, 0])
    mask = T([[0, 1], [0, 1]], dtype=torch.bool)
    # returns [0.5, -0.5]: mean 0, unbiased var 0.5; eps 0.5 -> / sqrt(1): unchanged; eps 1e-8 -> / sqrt(0.5)
    close(run("reinforce_baseline", rewards, groups, mask, whiten_eps=0.5)[0], [[0, 0.5], [0, -0.5]])
    s = 0.5 / math.sqrt(0.5)
    close(run("reinforce_baseline", rewards, groups, mask)[0], [[0, s], [0, -s]], atol=1e-6)


def test_rloo_hand_worked_with_an_injected_span_is_not_whitened():
    rewards, groups = T([1.0, 0.0, 0.0, 1.0]), T([0, 0, 0, 7])
    adv, targets = run("rloo", rewards, groups, MASK)
    assert targets is None
    # group 0: 1 - mean(0, 0) = 1; 0 - mean(1, 0) = -0.5 (twice); group 7 is a group of one -> 0. In reward units,
    # no whitening: the advantages are the returns.
    close(adv, [[0, 1, 0, 1, 0], [0, -0.5, -0.5, 0, 0], [0, -0.5, 0, 0, 0], [0] * 5])
    kl = torch.full((4, 5), 0.2)
    adv_kl, _ = run("rloo", rewards, groups, MASK, kl, kl_coef=0.5)
    # row 0 with KL: token rewards -0.1 (pos 1) and 1 - 0.1 = 0.9 (pos 3) -> returns 0.8, 0.9
    close(adv_kl[0], [0, 0.8, 0, 0.9, 0])


def test_grpo_hand_worked_with_the_kl_summed_into_the_reward():
    rewards, groups = T([1.0, 0.0, 1.0, 1.0]), T([0, 0, 1, 1])
    adv, targets = run("grpo", rewards, groups, MASK)
    assert targets is None
    # group 0: mean 0.5, unbiased std sqrt(0.5) -> +-0.7071068 on every action token; group 1 all right -> 0
    s = 0.5 / math.sqrt(0.5)
    close(adv, MASK.double() * T([s, -s, 0.0, 0.0], dtype=torch.float64)[:, None], atol=1e-5)
    kl = torch.full((4, 5), 0.25)
    adv_kl, _ = run("grpo", rewards, groups, MASK, kl, kl_coef=0.5, grpo_kl_in_reward=True, grpo_scale_by_std=False)
    # summed KL per row 0.5, 0.5, 0.25, 0.75 (action tokens 2, 2, 1, 3) -> rewards 0.75, -0.25, 0.875, 0.625
    # group means 0.25 and 0.75 -> 0.5, -0.5, 0.125, -0.125
    close(adv_kl, MASK.double() * T([0.5, -0.5, 0.125, -0.125], dtype=torch.float64)[:, None])


def test_a_group_of_one_sample_gets_no_signal():
    mask = T([[0, 1, 1]], dtype=torch.bool)
    one, group = T([1.0]), T([4])
    for name in ("rloo", "reinforce_baseline", "grpo"):
        close(run(name, one, group, mask)[0], [[0, 0, 0]])  # variance 0 + eps: 0 / sqrt(eps) stays 0, no NaN


def test_injected_span_is_transparent_to_the_group_estimators():
    with_span = T([[0, 1, 1, 0, 0, 1], [0, 1, 0, 0, 0, 0]], dtype=torch.bool)  # row 0: a, a, env, env, a
    without = T([[0, 1, 1, 1, 0, 0], [0, 1, 0, 0, 0, 0]], dtype=torch.bool)  # the span cut out
    rewards, groups = T([1.0, 0.0]), T([0, 0])
    kl_with = T([[0.0, 0.1, 0.2, 7.0, 7.0, 0.3], [0.0, 0.4, 0, 0, 0, 0]])
    kl_without = T([[0.0, 0.1, 0.2, 0.3, 0.0, 0.0], [0.0, 0.4, 0, 0, 0, 0]])
    for name in ("reinforce_baseline", "rloo"):
        a1, _ = run(name, rewards, groups, with_span, kl_with, kl_coef=0.5)
        a2, _ = run(name, rewards, groups, without, kl_without, kl_coef=0.5)
        close(a1[with_span], a2[without], atol=1e-6)
        assert (a1[~with_span] == 0).all()


# ---- PPO -----------------------------------------------------------------------------------------------------------


def test_ppo_is_gae_with_optional_whitening_and_needs_values():
    mask = T([[0, 1, 1, 0, 1]], dtype=torch.bool)
    values = T([[9.0, 0.5, 0.5, 9.0, 0.5]])  # 9 sits off the mask: ignored
    adv, targets = run("ppo", T([1.0]), T([0]), mask, None, values, whiten_ppo_advantages=False)
    # gamma = lambda = 1: A_t = R - V_t = 0.5 on every action token; the critic's targets are the returns, 1
    close(adv, [[0, 0.5, 0.5, 0, 0.5]])
    close(targets, [[0, 1, 1, 0, 1]])
    whitened, _ = run("ppo", T([1.0]), T([0]), mask, None, values)
    close(whitened, [[0, 0, 0, 0, 0]])  # three equal advantages whiten to 0
    with pytest.raises(ValueError, match="model.rl.algorithm=ppo needs critic values"):
        run("ppo", T([1.0]), T([0]), mask)
