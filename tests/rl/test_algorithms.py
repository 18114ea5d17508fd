"""Hand-worked checks of the RL math in zerotir.rl.algorithms (the arithmetic is written next to each expectation)."""

from __future__ import annotations

import math

import pytest
import torch

from zerotir.config import RLConfig
from zerotir.rl import algorithms as alg
from zerotir.rl.estimators import reinforce_pp

T = torch.tensor


def close(actual: torch.Tensor, expected, atol: float = 1e-6) -> None:
    torch.testing.assert_close(actual.double(), torch.as_tensor(expected, dtype=torch.float64), atol=atol, rtol=0)


# ---- masked statistics ---------------------------------------------------------------------------------------------


def test_masked_sum_and_mean_ignore_masked_entries_even_nan():
    x = T([[1.0, float("nan"), 3.0], [4.0, 5.0, 6.0]])
    mask = T([[1, 0, 1], [0, 0, 0]], dtype=torch.bool)
    close(alg.masked_sum(x, mask), 4.0)  # 1 + 3
    close(alg.masked_mean(x, mask), 2.0)  # (1 + 3) / 2
    close(alg.masked_mean(x, mask, dim=1), [2.0, 0.0])  # empty second row -> 0, not NaN
    close(alg.masked_sum(x, mask, dim=0), [1.0, 0.0, 3.0])


def test_masked_var_biased_and_unbiased():
    x = T([1.0, 2.0, 3.0, 4.0, 100.0])
    mask = T([1, 1, 1, 1, 0])
    # mean 2.5, squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5 -> unbiased 5 / 3, biased 5 / 4
    close(alg.masked_var(x, mask), 5 / 3)
    close(alg.masked_var(x, mask, unbiased=False), 1.25)
    # one entry: unbiased variance undefined -> 0; none: 0 either way
    close(alg.masked_var(x, T([0, 0, 1, 0, 0])), 0.0)
    close(alg.masked_var(x, torch.zeros(5), unbiased=False), 0.0)


def test_masked_whiten():
    x = T([1.0, 2.0, 3.0, 100.0])
    mask = T([1, 1, 1, 0])
    # mean 2, unbiased var (1 + 0 + 1) / 2 = 1 -> (x - 2) / 1, and 0 off the mask
    close(alg.masked_whiten(x, mask), [-1.0, 0.0, 1.0, 0.0], atol=1e-6)
    close(alg.masked_whiten(x, mask, shift_mean=False), [1.0, 2.0, 3.0, 0.0], atol=1e-6)  # mean 2 added back
    close(alg.masked_whiten(x, torch.zeros(4)), [0.0, 0.0, 0.0, 0.0])


def test_shape_mismatch_names_the_argument():
    with pytest.raises(ValueError, match="mask has shape"):
        alg.masked_mean(torch.zeros(2, 3), torch.ones(2, 4))
    with pytest.raises(ValueError, match="values has shape"):
        alg.gae_advantages(torch.zeros(1, 3), torch.zeros(1, 4), torch.ones(1, 3))


# ---- KL ------------------------------------------------------------------------------------------------------------


def test_kl_estimators_hand_worked():
    ln2 = math.log(2.0)
    logp = torch.log(T([[0.5, 0.25]]))
    ref = torch.log(T([[0.25, 0.5]]))
    # token 0: log_ratio = ln 2;  token 1: log_ratio = -ln 2
    close(alg.kl_penalty(logp, ref, "k1"), [[ln2, -ln2]])
    close(alg.kl_penalty(logp, ref, "k2"), [[0.5 * ln2**2, 0.5 * ln2**2]])  # 0.2402265 each
    # k3 = exp(ref - logp) - (ref - logp) - 1: token 0: 0.5 + ln2 - 1 = 0.1931472; token 1: 2 - ln2 - 1 = 0.3068528
    close(alg.kl_penalty(logp, ref, "k3"), [[0.5 + ln2 - 1, 2 - ln2 - 1]])
    close(alg.kl_penalty(logp, ref, "k3", mask=T([[0, 1]])), [[0.0, 2 - ln2 - 1]])
    with pytest.raises(ValueError, match="kl kind"):
        alg.kl_penalty(logp, ref, "k4")


def test_k3_clamps_its_exponent_instead_of_overflowing():
    out = alg.kl_penalty(T([[-100.0]]), T([[0.0]]), "k3")  # exponent 100 clamped to 20: exp(20) - 20 - 1
    assert out.item() == pytest.approx(math.exp(20.0) - 21.0, rel=1e-6)  # 4.85e8, float32 precision
    assert torch.isfinite(out).all()


def test_kl_clamp_caps_k2_and_k3_at_10_and_leaves_k1():
    # Token 0: ref - logp = 5: k3 = e^5 - 5 - 1 = 142.41, k2 = 25 / 2 = 12.5, k1 = -5. Token 1: ref - logp = ln 2:
    # k3 = 2 - ln 2 - 1 = 0.3069, k2 = 0.2402, k1 = -0.6931, all under 10.
    ln2 = math.log(2.0)
    logp, ref = T([[-5.0, -ln2]]), T([[0.0, 0.0]])
    close(alg.kl_penalty(logp, ref, "k3"), [[math.exp(5) - 6, 1 - ln2]], atol=1e-4)  # unclamped: 142.41
    close(alg.kl_penalty(logp, ref, "k3", kl_clamp=10.0), [[10.0, 1 - ln2]])
    close(alg.kl_penalty(logp, ref, "k2", kl_clamp=10.0), [[10.0, 0.5 * ln2**2]])
    close(alg.kl_penalty(logp, ref, "k1", kl_clamp=1.0), [[-5.0, -ln2]])  # k1 is never clamped
    # The overflow case: the exponent is clamped at 20 first (4.85e8), then the estimate at 10.
    close(alg.kl_penalty(T([[-100.0]]), T([[0.0]]), "k3", kl_clamp=10.0), [[10.0]])
    # In a KL loss a clamped token passes no gradient; the other still does: d k3 / d logp = 1 - exp(ref - logp).
    x = logp.clone().requires_grad_(True)
    alg.kl_penalty(x, ref, "k3", kl_clamp=10.0).sum().backward()
    close(x.grad, [[0.0, 1 - 2.0]])
    with pytest.raises(ValueError, match="kl_clamp=0.0: must be > 0"):
        alg.kl_penalty(logp, ref, "k3", kl_clamp=0.0)
    assert RLConfig().kl_clamp == 10.0 and RLConfig(kl_clamp=None).kl_clamp is None
    with pytest.raises(ValueError, match=r"model.rl.kl_clamp=-1.0: must be > 0"):
        RLConfig(kl_clamp=-1.0)


# ---- rewards and returns -------------------------------------------------------------------------------------------

# Row layout used below: position 0 prompt, 1-2 sampled, 3 injected tool output, 4 sampled, 5 padding.
MASK_ROW = [0, 1, 1, 0, 1, 0]


def test_token_level_rewards_places_reward_on_last_action_token():
    mask = T([MASK_ROW, [0] * 6], dtype=torch.bool)
    kl = torch.full((2, 6), 0.1)
    kl[0, 3] = 9.0  # KL on an env token must not count
    out = alg.token_level_rewards(T([1.0, 5.0]), mask, kl=kl, kl_coef=0.5)
    # -0.5 * 0.1 = -0.05 on action tokens; the last one (position 4) also gets the reward: 1 - 0.05 = 0.95.
    # The second row has no action token: all zeros, its reward has nowhere to go.
    close(out, [[0, -0.05, -0.05, 0, 0.95, 0], [0] * 6])
    close(alg.token_level_rewards(T([1.0, 5.0]), mask), [[0, 0, 0, 0, 1, 0], [0] * 6])


def test_discounted_returns_skip_env_tokens():
    mask = T([MASK_ROW])
    rewards = T([[0.0, 1.0, 2.0, 100.0, 4.0, 50.0]])  # 100 and 50 sit on non-action tokens: ignored
    # gamma 0.5: G4 = 4; G2 = 2 + 0.5 * 4 = 4 (the env token costs no discount); G1 = 1 + 0.5 * 4 = 3
    close(alg.discounted_returns(rewards, mask, gamma=0.5), [[0, 3, 4, 0, 4, 0]])
    # gamma 1: G4 = 4, G2 = 6, G1 = 7
    close(alg.discounted_returns(rewards, mask, gamma=1.0), [[0, 7, 6, 0, 4, 0]])


def test_gae_hand_worked_with_env_token():
    mask = T([MASK_ROW])
    rewards = T([[0.0, 0.0, 0.0, 0.0, 1.0, 0.0]])
    values = T([[3.0, 0.5, 0.6, 9.0, 0.8, 7.0]])  # 3 (prompt), 9 (env) and 7 (pad) must be ignored
    adv, ret = alg.gae_advantages(rewards, values, mask, gamma=0.9, lam=0.5)
    # position 4 (last): delta = 1 + 0.9 * 0 - 0.8 = 0.2;                       A = 0.2
    # position 2: next action token is 4: delta = 0 + 0.9 * 0.8 - 0.6 = 0.12;    A = 0.12 + 0.45 * 0.2 = 0.21
    # position 1: delta = 0 + 0.9 * 0.6 - 0.5 = 0.04;                           A = 0.04 + 0.45 * 0.21 = 0.1345
    close(adv, [[0, 0.1345, 0.21, 0, 0.2, 0]])
    close(ret, [[0, 0.1345 + 0.5, 0.21 + 0.6, 0, 0.2 + 0.8, 0]])  # returns = A + V


def test_gae_with_gamma_lambda_one_is_return_minus_value():
    mask = T([[0, 1, 1, 1]])
    rewards = T([[0.0, 0.5, 0.0, 1.0]])
    values = T([[0.0, 1.0, 2.0, 3.0]])
    adv, ret = alg.gae_advantages(rewards, values, mask)
    # Monte-Carlo returns: [_, 1.5, 1, 1]; A = G - V = [_, 0.5, -1, -2]
    close(ret, [[0, 1.5, 1.0, 1.0]])
    close(adv, [[0, 0.5, -1.0, -2.0]])


def test_gae_restart_at_injected_tokens_hand_worked():
    mask = T([MASK_ROW])  # prompt, a, a, INJECTED, a, pad
    rewards = T([[0.0, 0.0, 0.0, 0.0, 1.0, 0.0]])
    values = T([[3.0, 0.5, 0.6, 9.0, 0.8, 7.0]])
    adv, ret = alg.gae_advantages(rewards, values, mask, gamma=0.9, lam=0.5, injected="restart")
    # position 4 (last): delta = 1 + 0.9 * 0 - 0.8 = 0.2;                          A = 0.2
    # position 3 is injected: the episode ends there, so position 2 bootstraps from V = 0, A = 0:
    # position 2: delta = 0 + 0.9 * 0 - 0.6 = -0.6;                                A = -0.6
    # position 1: delta = 0 + 0.9 * 0.6 - 0.5 = 0.04;                              A = 0.04 + 0.45 * -0.6 = -0.23
    close(adv, [[0, -0.23, -0.6, 0, 0.2, 0]])
    close(ret, [[0, -0.23 + 0.5, 0.0, 0, 1.0, 0]])  # returns = A + V
    # gamma = lam = 1: the first turn's value targets are its own rewards (0), whatever the outcome; skip gives 1.
    _, restart = alg.gae_advantages(rewards, values, mask, injected="restart")
    _, skip = alg.gae_advantages(rewards, values, mask)
    close(restart, [[0, 0, 0, 0, 1, 0]])
    close(skip, [[0, 1, 1, 0, 1, 0]])
    with pytest.raises(ValueError, match="injected='drop'"):
        alg.gae_advantages(rewards, values, mask, injected="drop")


def _paper_gae(rewards, values, mask, gamma, lam):
    """The paper's loop, written out: masked values and rewards, next value at t + 1, ``lastgaelam *= mask``."""
    m = mask.to(rewards.dtype)
    values, rewards = values * m, rewards * m
    last = torch.zeros(rewards.shape[0])
    adv = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        nxt = values[:, t + 1] if t < rewards.shape[1] - 1 else 0.0
        last = (rewards[:, t] + gamma * nxt - values[:, t] + gamma * lam * last) * m[:, t]
        adv[:, t] = last
    return adv, (adv + values) * m


def test_gae_restart_is_the_papers_recursion_on_random_batches():
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(4, 12, generator=g) > 0.35
    mask[:, 0] = False  # prompt
    rewards, values = torch.randn(4, 12, generator=g), torch.randn(4, 12, generator=g)
    for gamma, lam in [(1.0, 1.0), (0.9, 0.7)]:
        ours = alg.gae_advantages(rewards, values, mask, gamma, lam, injected="restart")
        for a, b in zip(ours, _paper_gae(rewards, values, mask, gamma, lam)):
            close(a, b, atol=1e-5)
    # ... and it differs from the default (skip) whenever a row has an injected span between action tokens
    assert not torch.allclose(alg.gae_advantages(rewards, values, mask, 0.9, 0.7)[0], ours[0])


def _with_and_without_span():
    """The same trajectory twice: with an injected span (2 env tokens) and with the span cut out."""
    with_span = T([[0, 1, 1, 0, 0, 1, 1, 0]], dtype=torch.bool)  # prompt, a, a, env, env, a, a, pad
    without = T([[0, 1, 1, 1, 1, 0, 0, 0]], dtype=torch.bool)  # prompt, a, a, a, a, pad...
    a_with = with_span[0].nonzero().flatten()
    a_without = without[0].nonzero().flatten()
    return with_span, without, a_with, a_without


def _place(actions: list[float], mask: torch.Tensor, positions: torch.Tensor, fill: float) -> torch.Tensor:
    out = torch.full(mask.shape, fill)
    out[0, positions] = T(actions)
    return out


def test_injected_span_does_not_change_advantages_on_action_tokens():
    with_span, without, a_with, a_without = _with_and_without_span()
    action_values = [0.2, -0.3, 0.7, 0.1]
    action_kl = [0.05, 0.2, -0.1, 0.3]
    # Garbage (77) on non-action positions must not matter.
    v1, v2 = _place(action_values, with_span, a_with, 77.0), _place(action_values, without, a_without, 77.0)
    k1, k2 = _place(action_kl, with_span, a_with, 77.0), _place(action_kl, without, a_without, 77.0)
    reward = T([1.0])
    for gamma, lam in [(1.0, 1.0), (0.9, 0.8)]:
        r1 = alg.token_level_rewards(reward, with_span, k1, kl_coef=0.1)
        r2 = alg.token_level_rewards(reward, without, k2, kl_coef=0.1)
        close(r1[0, a_with], r2[0, a_without])
        ret1, ret2 = alg.discounted_returns(r1, with_span, gamma), alg.discounted_returns(r2, without, gamma)
        close(ret1[0, a_with], ret2[0, a_without])
        g1, g2 = alg.gae_advantages(r1, v1, with_span, gamma, lam), alg.gae_advantages(r2, v2, without, gamma, lam)
        close(g1[0][0, a_with], g2[0][0, a_without])
        close(g1[1][0, a_with], g2[1][0, a_without])
        cfg = RLConfig(kl_coef=0.1, gamma=gamma)
        p1 = reinforce_pp(reward, T([0]), with_span, k1, None, cfg)[0]
        p2 = reinforce_pp(reward, T([0]), without, k2, None, cfg)[0]
        close(p1[0, a_with], p2[0, a_without])
        assert (g1[0][0, ~with_span[0]] == 0).all() and (p1[0, ~with_span[0]] == 0).all()
    # The check can fail: discounting through the env tokens (treating them as steps) would change position 2.
    r = alg.token_level_rewards(reward, with_span)
    naive = alg.discounted_returns(r, torch.ones_like(with_span), gamma=0.5)
    assert not torch.allclose(naive[0, a_with], alg.discounted_returns(r, with_span, 0.5)[0, a_with])


# ---- losses --------------------------------------------------------------------------------------------------------


def _policy_case():
    # position 0 is a prompt token holding garbage log-probs (exp(100) would overflow)
    ratios = [1.5, 0.5, 0.5, 1.5]
    logp = torch.cat([T([100.0]), torch.log(T(ratios))])[None].clone().requires_grad_(True)
    old = torch.zeros(1, 5)
    adv = T([[123.0, 1.0, 1.0, -1.0, -1.0]])
    mask = T([[0, 1, 1, 1, 1]], dtype=torch.bool)
    return logp, old, adv, mask


def test_policy_loss_asymmetric_clip_hand_worked():
    logp, old, adv, mask = _policy_case()
    loss, stats = alg.policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28)
    # token 1: r 1.5, A +1: min(1.5, 1.28) = 1.28 -> -1.28 (clipped)
    # token 2: r 0.5, A +1: min(0.5, 0.8) = 0.5 -> -0.5
    # token 3: r 0.5, A -1: min(-0.5, -0.8) = -0.8 -> 0.8 (clipped)
    # token 4: r 1.5, A -1: min(-1.5, -1.28) = -1.5 -> 1.5
    close(loss, (-1.28 - 0.5 + 0.8 + 1.5) / 4)  # 0.13
    close(stats["clip_fraction"], 0.5)
    close(stats["ratio_mean"], 1.0)  # (1.5 + 0.5 + 0.5 + 1.5) / 4
    # approx_kl = mean(r - 1 - ln r): 1.5 -> 0.0945349, 0.5 -> 0.1931472
    close(stats["approx_kl"], (2 * (0.5 - math.log(1.5)) + 2 * (-0.5 + math.log(2))) / 4)
    loss.backward()
    # d/dlogp of -r A / 4 is -r A / 4 on unclipped tokens: token 2: -0.125, token 4: +0.375; clipped and prompt: 0
    close(logp.grad, [[0.0, 0.0, -0.125, 0.0, 0.375]])


def test_policy_loss_broadcasts_trajectory_advantages():
    logp, old, _, mask = _policy_case()
    per_traj, _ = alg.policy_loss(logp, old, T([2.0]), mask)
    per_token, _ = alg.policy_loss(logp, old, torch.full((1, 5), 2.0), mask)
    close(per_traj, per_token.detach())
    # r 1.5 -> 1.28 * 2; r 0.5 -> 0.5 * 2 (taken unclipped): loss = -(2 * 2.56 + 2 * 1) / 4 = -1.78
    close(per_traj, -1.78)


def test_dual_clip_caps_negative_advantage_tokens_hand_worked():
    logp = torch.log(T([[4.0, 1.5, 4.0]])).requires_grad_(True)
    old, mask = torch.zeros(1, 3), torch.ones(1, 3, dtype=torch.bool)
    adv = T([[-1.0, -1.0, 2.0]])
    # token 0: r 4, A -1: -min(-4, -1.28) = 4, above the dual bound -3 * A = 3 -> 3 (constant: no gradient)
    # token 1: r 1.5, A -1: -min(-1.5, -1.28) = 1.5 < 3 -> 1.5
    # token 2: r 4, A +2: -min(8, 2.56) = -2.56 (clipped; positive advantages are never dual-clipped)
    loss, stats = alg.policy_loss(logp, old, adv, mask, 0.2, 0.28, dual_clip=3.0)
    close(loss, (3 + 1.5 - 2.56) / 3)  # 0.6466667
    close(stats["dual_clip_fraction"], 1 / 3)
    close(stats["clip_fraction"], 1 / 3)  # token 2
    loss.backward()
    close(logp.grad, [[0.0, 1.5 / 3, 0.0]])  # d(-r A)/dlogp = -r A = 1.5 on token 1, / 3 tokens
    plain, plain_stats = alg.policy_loss(logp, old, adv, mask, 0.2, 0.28)
    close(plain, (4 + 1.5 - 2.56) / 3)  # 0.98 without the dual clip
    close(plain_stats["dual_clip_fraction"], 0.0)
    with pytest.raises(ValueError, match="dual_clip=1.0"):
        alg.policy_loss(logp, old, adv, mask, dual_clip=1.0)


AGG_MASK = T([[0, 1, 1, 0, 1], [0, 1, 0, 0, 0], [0, 0, 0, 0, 0]], dtype=torch.bool)  # row 2: no action token
AGG_LOSS = T([[9.0, 1.0, 2.0, 9.0, 3.0], [9.0, 4.0, 9.0, 9.0, 9.0], [9.0] * 5])  # 9 = off the mask


@pytest.mark.parametrize("mode,expected,units", [
    ("token-mean", (1 + 2 + 3 + 4) / 4, 4),  # 2.5: every action token weighs the same
    ("seq-mean-token-mean", (2 + 4) / 2, 2),  # row means 2 and 4 -> 3; the empty row does not count
    ("seq-mean-token-sum", (6 + 4) / 2, 2),  # row sums 6 and 4 -> 5
    ("seq-mean-token-sum-norm", (6 / 8 + 4 / 8) / 2, 2),  # row sums / max_response_tokens 8 -> 0.625
])
def test_loss_aggregation_modes_hand_worked(mode, expected, units):
    close(alg.aggregate_loss(AGG_LOSS, AGG_MASK, mode, max_response_tokens=8), expected)
    assert int(alg.loss_units(AGG_MASK, mode)) == units
    # Split in micro-batches weighted by their share of the units, the pieces sum to the whole.
    pieces = [(AGG_LOSS[r], AGG_MASK[r]) for r in ([0], [1, 2])]
    total = sum(alg.aggregate_loss(x, m, mode, 8) * alg.loss_units(m, mode) / units for x, m in pieces)
    close(total, expected)


def test_loss_aggregation_errors_and_loss_functions_use_it():
    with pytest.raises(ValueError, match="loss_agg_mode='sum'"):
        alg.aggregate_loss(AGG_LOSS, AGG_MASK, "sum")
    with pytest.raises(ValueError, match="needs max_response_tokens"):
        alg.aggregate_loss(AGG_LOSS, AGG_MASK, "seq-mean-token-sum-norm")
    close(alg.aggregate_loss(AGG_LOSS, torch.zeros_like(AGG_MASK), "seq-mean-token-mean"), 0.0)  # empty: 0, no NaN
    # The value loss 0.5 * (V - R)^2 with (V - R)^2 = AGG_LOSS: seq-mean-token-mean -> 0.5 * 3
    values = AGG_LOSS.sqrt()
    close(alg.value_loss(values, values, torch.zeros_like(values), AGG_MASK, None, "seq-mean-token-mean"), 1.5)
    # The policy loss at ratio 1 is -A per token: A = -AGG_LOSS gives the same aggregates
    zeros = torch.zeros_like(AGG_LOSS)
    loss, _ = alg.policy_loss(zeros, zeros, -AGG_LOSS, AGG_MASK, agg_mode="seq-mean-token-sum", dual_clip=None)
    close(loss, 5.0)


def test_value_loss_clipped_hand_worked():
    values = T([[9.0, 1.0, 2.0, 0.0]])
    old = T([[0.0, 0.5, 2.5, 0.1]])
    returns = T([[-9.0, 1.5, 1.0, 0.0]])
    mask = T([[0, 1, 1, 1]])
    # t1: (1 - 1.5)^2 = 0.25; clipped V = 0.5 + 0.2 = 0.7 -> (0.7 - 1.5)^2 = 0.64; max 0.64
    # t2: (2 - 1)^2 = 1;      clipped V = 2.5 - 0.2 = 2.3 -> 1.3^2 = 1.69;         max 1.69
    # t3: 0;                  clipped V = 0.1 - 0.1 = 0.0 -> 0;                    max 0
    close(alg.value_loss(values, old, returns, mask, clip=0.2), 0.5 * (0.64 + 1.69) / 3)  # 0.3883333
    close(alg.value_loss(values, old, returns, mask, clip=None), 0.5 * (0.25 + 1.0) / 3)  # 0.2083333


def test_entropy_from_logits():
    logits = T([[[0.0, 0.0, 0.0, 0.0], [0.0, -math.inf, 0.0, -math.inf], [1000.0, 1000.0, -1000.0, -1000.0]]])
    # uniform over 4 -> ln 4; uniform over 2 (the -inf are impossible) -> ln 2; huge logits, two equal -> ln 2
    close(alg.entropy_from_logits(logits), [[math.log(4), math.log(2), math.log(2)]])
    random_logits = torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(0))
    close(alg.entropy_from_logits(random_logits), torch.distributions.Categorical(logits=random_logits).entropy())


def test_logprobs_from_logits():
    logits = torch.log(T([[[1.0, 2.0, 5.0], [1.0, 2.0, 5.0]]]))  # softmax = [1, 2, 5] / 8
    close(alg.logprobs_from_logits(logits, T([[2, 0]])), [[math.log(5 / 8), math.log(1 / 8)]])  # -0.47, -2.079
    x = torch.randn(2, 4, 11, generator=torch.Generator().manual_seed(1), requires_grad=True)
    labels = torch.randint(0, 11, (2, 4), generator=torch.Generator().manual_seed(2))
    ours = alg.logprobs_from_logits(x, labels)
    ref = torch.log_softmax(x, -1).gather(-1, labels[..., None]).squeeze(-1)
    close(ours, ref.detach())
    (g1,) = torch.autograd.grad(ours.sum(), x)
    (g2,) = torch.autograd.grad(ref.sum(), x)
    close(g1, g2)
    assert alg.logprobs_from_logits(x.to(torch.bfloat16), labels).dtype == torch.float32


# ---- no NaN with empty masks ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("rows", [[[0, 1, 1], [0, 0, 0]], [[0, 0, 0], [0, 0, 0]]], ids=["one_empty_row", "all_empty"])
def test_empty_mask_rows_never_give_nan(rows):
    mask = T(rows, dtype=torch.bool)
    logp = torch.full((2, 3), -1.0, requires_grad=True)
    old = torch.full((2, 3), -1.2)
    values = torch.full((2, 3), 0.3, requires_grad=True)
    rewards = T([1.0, 1.0])
    kl = alg.kl_penalty(logp, old, "k3", mask)
    outputs = [
        alg.masked_mean(logp, mask),
        alg.masked_mean(logp, mask, dim=1),
        alg.masked_whiten(old, mask),
        kl,
        reinforce_pp(rewards, T([0, 0]), mask, kl, None, RLConfig(kl_coef=0.1, gamma=0.9))[0],
        *alg.gae_advantages(alg.token_level_rewards(rewards, mask), values, mask, 0.9, 0.9),
    ]
    ploss, stats = alg.policy_loss(logp, old, T([1.0, 1.0]), mask)
    vloss = alg.value_loss(values, values.detach() + 0.1, torch.ones(2, 3), mask)
    (ploss + vloss).backward()
    for out in [*outputs, ploss, vloss, *stats.values(), logp.grad, values.grad]:
        assert torch.isfinite(out).all()
    if not mask.any():
        assert ploss.item() == 0.0 and vloss.item() == 0.0
