"""The RL math of ZeroTIR as pure tensor functions: masked statistics, KL estimators, token returns, GAE, losses.

No Lightning, vLLM or transformers import: everything here takes and returns plain tensors, so it is tested with
hand-worked numbers and shared by every estimator. The per-prompt-group baselines of the outcome reward (GRPO,
REINFORCE++-baseline, RLOO) are in ``zerotir.rl.baselines``; the estimators built from both, one per
``model.rl.algorithm``, in ``zerotir.rl.estimators``.

Conventions (see ``zerotir.types``):
    * Per-token tensors are ``(B, T)`` and aligned with ``input_ids``: ``logp[b, t]`` is log p(token t | tokens < t),
      and ``values[b, t]`` is the critic's estimate of the state in which token t is about to be sampled.
    * ``mask`` is the ``action_mask``: nonzero only on tokens the policy sampled. Prompt, injected tool output and
      padding are 0 and are left out of every loss, every KL and every mean (ZeroTIR's env-token masking).

How env tokens are skipped in returns and GAE (value function masking):
    The recursions run over the *action* tokens of a row only. For an action token t, "the next step" is the next
    action token t' > t of the same row, however many injected tokens lie between them: the injected tool output is
    not a decision of the policy, so it neither adds reward nor costs a discount step (gamma and lambda are applied
    once per action-to-action hop). The value at t' already sees the injected tokens, since they precede t' in the
    context. Consequently a trajectory with an injected span gets exactly the same returns and advantages on its
    action tokens as the same trajectory with the span cut out; non-action positions get 0. (``gae_advantages``
    also offers the paper's alternative, ``injected="restart"``: each turn is its own episode.)
"""

from __future__ import annotations

from typing import get_args

import torch
from torch import Tensor

from zerotir.config import GAEInjected, KLEstimator, LossAggMode

from zerotir.rl.masked import (  # noqa: F401  (re-exported: the statistics the estimators share)
    _bool_mask, _check_shape, group_stats, masked_mean, masked_mean_var, masked_sum, masked_var, masked_whiten,
)

# The choices of model.rl.kl_estimator, gae_injected and loss_agg_mode, read from the config's Literals.
KL_KINDS = get_args(KLEstimator)
GAE_INJECTED_MODES = get_args(GAEInjected)
LOSS_AGG_MODES = get_args(LossAggMode)
# exp() of a larger exponent overflows quickly in low precision; k3 clamps its exponent here (exp(20) ~ 4.9e8).
_K3_MAX_LOG_RATIO = 20.0


# ---- KL estimators ---------------------------------------------------------------------------------------------------


def kl_penalty(logp: Tensor, ref_logp: Tensor, kind: str = "k3", mask: Tensor | None = None,
               kl_clamp: float | None = None) -> Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from the log-probs of the sampled tokens (Schulman's k1/k2/k3).

    With ``log_ratio = logp - ref_logp``:
        k1 = log_ratio (unbiased, can be negative);
        k2 = 0.5 * log_ratio^2;
        k3 = exp(-log_ratio) + log_ratio - 1 = exp(ref - logp) - (ref - logp) - 1 (unbiased, >= 0). Its exponent
            ref - logp is clamped at 20 so a token the policy finds far less likely than the reference gives a large
            finite penalty (~4.9e8) rather than inf.

    ``kl_clamp`` (``model.rl.kl_clamp``) clamps k2 and k3 to [-kl_clamp, kl_clamp] afterwards, as verl clamps k3
    (``low_var_kl``) and OpenRLHF every estimator at 10: one token's penalty cannot outweigh the outcome reward of
    the whole trajectory, and a clamped token passes no gradient in a KL loss. k1 stays unclamped (signed, its mean
    is the plain KL estimate; verl leaves it so too).

    Args:
        logp: (B, T) log-probs under the current policy.
        ref_logp: (B, T) log-probs under the frozen reference.
        kind: "k1", "k2" or "k3".
        mask: optional (B, T) action mask; positions outside it are set to 0.
        kl_clamp: the clamp of k2 and k3 (> 0); None = unclamped.
    """
    _check_shape("ref_logp", ref_logp, "logp", logp)
    log_ratio = logp - ref_logp
    if mask is not None:
        _check_shape("mask", mask, "logp", logp)
        # Zero the ratio before any exp so garbage outside the mask never makes inf (nor NaN gradients).
        log_ratio = torch.where(_bool_mask(mask), log_ratio, torch.zeros_like(log_ratio))
    if kl_clamp is not None and not kl_clamp > 0:
        raise ValueError(f"kl_clamp={kl_clamp}: must be > 0, or None (no clamp)")
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        kl = 0.5 * log_ratio**2
    elif kind == "k3":
        neg = (-log_ratio).clamp(max=_K3_MAX_LOG_RATIO)
        kl = torch.exp(neg) - neg - 1
    else:
        raise ValueError(f"kl kind must be one of {KL_KINDS}, got {kind!r}")
    return kl if kl_clamp is None else kl.clamp(-kl_clamp, kl_clamp)


# ---- Rewards, returns and advantages ---------------------------------------------------------------------------------


def last_action_index(mask: Tensor) -> Tensor:
    """(B,) index of the last action token of each row; -1 for a row without any."""
    m = _bool_mask(mask)
    positions = torch.arange(m.shape[1], device=m.device).expand_as(m)
    return torch.where(m, positions, torch.full_like(positions, -1)).max(dim=1).values


def token_level_rewards(
    rewards: Tensor, mask: Tensor, kl: Tensor | None = None, kl_coef: float = 0.0
) -> Tensor:
    """Spread an outcome reward over the tokens: REINFORCE++ / PPO reward shaping with a per-token KL penalty.

    Args:
        rewards: (B,) outcome reward of each trajectory.
        mask: (B, T) action mask.
        kl: optional (B, T) per-token KL estimate (see ``kl_penalty``).
        kl_coef: the KL coefficient beta.

    Returns:
        (B, T): ``-kl_coef * kl`` on every action token, plus the outcome reward on the last action token of each row,
        0 elsewhere. A row without action tokens gets all zeros (its reward has no token to land on).
    """
    if rewards.dim() != 1 or rewards.shape[0] != mask.shape[0]:
        raise ValueError(f"rewards must be (B,) = ({mask.shape[0]},), got {tuple(rewards.shape)}")
    m = _bool_mask(mask)
    out = torch.zeros(mask.shape, dtype=rewards.dtype, device=mask.device)
    if kl is not None and kl_coef != 0.0:
        _check_shape("kl", kl, "mask", mask)
        out = torch.where(m, -kl_coef * kl.to(out.dtype), out)
    last = last_action_index(m)
    rows = torch.nonzero(last >= 0, as_tuple=True)[0]
    out[rows, last[rows]] += rewards[rows]
    return out


def discounted_returns(token_rewards: Tensor, mask: Tensor, gamma: float = 1.0) -> Tensor:
    """REINFORCE++ returns G_t = r_t + gamma * G_next over the action tokens of each row.

    ``next`` is the next action token of the row (env tokens are skipped: they neither add reward nor discount, see
    the module docstring). Rewards placed on non-action tokens are ignored.

    Args:
        token_rewards: (B, T) per-token rewards (see ``token_level_rewards``).
        mask: (B, T) action mask.
        gamma: discount per action token.

    Returns:
        (B, T) returns on action tokens, 0 elsewhere.
    """
    _check_shape("token_rewards", token_rewards, "mask", mask)
    m = _bool_mask(mask)
    r = torch.where(m, token_rewards, torch.zeros_like(token_rewards))
    if gamma == 1.0:
        # Undiscounted: a reverse cumulative sum over the row (non-action tokens add 0).
        returns = r.flip(1).cumsum(1).flip(1)
        return torch.where(m, returns, torch.zeros_like(returns))
    returns = torch.zeros_like(r)
    running = torch.zeros_like(r[:, 0])
    for t in range(r.shape[1] - 1, -1, -1):
        # The running return only moves on action tokens, so env tokens are transparent.
        running = torch.where(m[:, t], r[:, t] + gamma * running, running)
        returns[:, t] = running
    return torch.where(m, returns, torch.zeros_like(returns))


def gae_advantages(
    token_rewards: Tensor, values: Tensor, mask: Tensor, gamma: float = 1.0, lam: float = 1.0,
    injected: str = "skip",
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over the action tokens (PPO).

    For action token t with next action token t' (none after the last one: V = 0, A = 0 there):
        delta_t = r_t + gamma * V_t' - V_t;    A_t = delta_t + gamma * lam * A_t';    returns_t = A_t + V_t.

    Args:
        token_rewards: (B, T) per-token rewards.
        values: (B, T) critic values (values outside the mask are ignored).
        mask: (B, T) action mask.
        gamma: discount per action token.
        lam: GAE lambda.
        injected: what an injected (non-action) token inside a row does. "skip" (default, as verl): t' is the next
            action token however many injected tokens lie between (see the module docstring). "restart" (the
            paper's code, ``lastgaelam *= action_mask``): t' must be t + 1; an injected token ends the episode, so
            the last action token before a tool output bootstraps from V = 0 and A = 0, and each turn is its own
            episode (at gamma = lam = 1 its value target is its own rewards, ~0 before the final answer).

    Returns:
        (advantages, returns), both (B, T) and 0 off the mask. Advantages are not whitened here.
    """
    _check_shape("token_rewards", token_rewards, "mask", mask)
    _check_shape("values", values, "mask", mask)
    if injected not in GAE_INJECTED_MODES:
        raise ValueError(f"injected={injected!r}: choose one of {GAE_INJECTED_MODES}")
    m = _bool_mask(mask)
    values = values.detach().to(token_rewards.dtype)
    advantages = torch.zeros_like(token_rewards)
    next_value = torch.zeros_like(token_rewards[:, 0])
    next_adv = torch.zeros_like(next_value)
    zero = torch.zeros_like(next_value)
    for t in range(token_rewards.shape[1] - 1, -1, -1):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        # Only action tokens carry state on; an env token leaves it as it was (skip) or resets it to 0 (restart).
        next_adv = torch.where(m[:, t], adv, next_adv if injected == "skip" else zero)
        next_value = torch.where(m[:, t], values[:, t], next_value if injected == "skip" else zero)
        advantages[:, t] = next_adv
    zeros = torch.zeros_like(advantages)
    advantages = torch.where(m, advantages, zeros)
    returns = torch.where(m, advantages + values, zeros)
    return advantages, returns


# ---- Losses ----------------------------------------------------------------------------------------------------------


def aggregate_loss(
    per_token: Tensor, mask: Tensor, agg_mode: str = "token-mean", max_response_tokens: int | None = None
) -> Tensor:
    """Reduce a (B, T) per-token loss to a scalar (verl's ``loss_agg_mode``). Rows without action tokens never count.

    Modes (``agg_mode``):
        "token-mean": every action token of the batch weighs the same (sum / token count); long responses weigh more.
        "seq-mean-token-mean": mean over the rows of each row's token mean; every response weighs the same.
        "seq-mean-token-sum": mean over the rows of each row's token sum.
        "seq-mean-token-sum-norm": mean over the rows of each row's token sum / ``max_response_tokens``, a constant
            (Dr. GRPO: the response budget), so neither the response length nor the batch's lengths rescale a token's
            gradient.

    The batch's weight in a larger batch is ``loss_units(mask, agg_mode)``: tokens for token-mean, rows otherwise.
    """
    _check_shape("mask", mask, "per_token", per_token)
    if agg_mode == "token-mean":
        return masked_mean(per_token, mask)
    if agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"loss_agg_mode={agg_mode!r}: choose one of {LOSS_AGG_MODES}")
    row_sums = masked_sum(per_token, mask, dim=1)
    row_tokens = masked_sum(torch.ones_like(per_token), mask, dim=1)
    if agg_mode == "seq-mean-token-mean":
        per_row = row_sums / row_tokens.clamp(min=1)
    elif agg_mode == "seq-mean-token-sum":
        per_row = row_sums
    else:
        if max_response_tokens is None or max_response_tokens < 1:
            raise ValueError(f"loss_agg_mode={agg_mode!r} needs max_response_tokens >= 1 (the response budget, "
                             f"model.sampling.max_response_tokens): {max_response_tokens}")
        per_row = row_sums / max_response_tokens
    return masked_mean(per_row, row_tokens > 0)


def loss_units(mask: Tensor, agg_mode: str = "token-mean") -> Tensor:
    """What ``aggregate_loss`` averages over: action tokens (token-mean) or rows with an action token (the others).

    A micro-batch's loss weighed by its share of the mini-batch's units sums to the mini-batch's aggregate loss.
    """
    m = _bool_mask(mask)
    return m.sum() if agg_mode == "token-mean" else m.any(dim=1).sum()


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = None,
    agg_mode: str = "token-mean",
    max_response_tokens: int | None = None,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate with an asymmetric clip range [1 - clip_low, 1 + clip_high], optionally dual-clipped.

    Per action token: ratio = exp(logp - old_logp); loss = -min(ratio * A, clip(ratio) * A). Dual clip (Ye et al.
    2020, verl's ``clip_ratio_c``): for A < 0 the loss is also capped at -A * dual_clip, so a token whose ratio has
    run far above 1 while its advantage is negative (the clipped objective is unbounded there) stops pushing.

    Args:
        logp: (B, T) log-probs under the policy being trained (carries the gradient).
        old_logp: (B, T) log-probs under the policy that sampled the batch.
        advantages: (B, T) per-token advantages, or (B,) per-trajectory ones (GRPO), broadcast over tokens.
        mask: (B, T) action mask.
        clip_low: lower clip epsilon (ratio floor 1 - clip_low).
        clip_high: upper clip epsilon (ratio ceiling 1 + clip_high); the paper's code uses 0.28 ("clip higher").
        dual_clip: the lower bound c (> 1) of the dual clip; None: no dual clip.
        agg_mode, max_response_tokens: how the per-token losses become a scalar (see ``aggregate_loss``).
        weights: (B, T) per-token factors of the loss, without gradient (the off-policy correction:
            ``off_policy.behaviour_weights``); None = 1. The aggregation's token counts are unchanged.

    Returns:
        (loss, stats): a scalar loss (0 with an empty mask), and detached token means ``clip_fraction`` (the clipped
        term is the one taken), ``dual_clip_fraction`` (the dual bound is), ``approx_kl`` (k3 estimate of
        KL(old || new): ratio - 1 - log ratio) and ``ratio_mean``.
    """
    _check_shape("old_logp", old_logp, "logp", logp)
    _check_shape("mask", mask, "logp", logp)
    if advantages.dim() == 1:
        if advantages.shape[0] != logp.shape[0]:
            raise ValueError(f"advantages (B,) must have B = {logp.shape[0]}, got {advantages.shape[0]}")
        advantages = advantages[:, None].expand_as(logp)
    _check_shape("advantages", advantages, "logp", logp)
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip={dual_clip}: the lower bound c must be > 1 (verl and the paper use 3), or None")
    m = _bool_mask(mask)
    # Zero the log-ratio off the mask before exp: prompt positions can hold garbage that would overflow to inf,
    # and inf * 0 in the backward pass would poison the gradient with NaN.
    log_ratio = torch.where(m, logp - old_logp.detach(), torch.zeros_like(logp))
    ratio = torch.exp(log_ratio)
    advantages = advantages.detach().to(ratio.dtype)
    surr = ratio * advantages
    surr_clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * advantages
    per_token = -torch.minimum(surr, surr_clipped)
    dual = torch.zeros_like(m)
    if dual_clip is not None:
        bound = -dual_clip * advantages
        dual = (advantages < 0) & (per_token > bound)
        per_token = torch.where(dual, bound, per_token)
    if weights is not None:
        _check_shape("weights", weights, "logp", logp)
        per_token = per_token * weights.detach().to(per_token.dtype)
    loss = aggregate_loss(per_token, m, agg_mode, max_response_tokens)
    with torch.no_grad():
        stats = {
            "clip_fraction": masked_mean((surr_clipped < surr).to(ratio.dtype), m),
            "dual_clip_fraction": masked_mean(dual.to(ratio.dtype), m),
            "approx_kl": masked_mean(ratio - 1 - log_ratio, m),
            "ratio_mean": masked_mean(ratio, m),
        }
    return loss, stats


def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, clip: float | None = 0.2,
    agg_mode: str = "token-mean", max_response_tokens: int | None = None,
) -> Tensor:
    """Clipped value loss: 0.5 * max((V - R)^2, (V_clipped - R)^2) per action token, aggregated by ``agg_mode``.

    ``V_clipped = old_values + clamp(values - old_values, -clip, clip)``; ``clip=None`` gives the plain 0.5 * (V - R)^2.
    The mask is the action mask, so the critic trains only on tokens the policy produced (value function masking).
    """
    _check_shape("old_values", old_values, "values", values)
    _check_shape("returns", returns, "values", values)
    _check_shape("mask", mask, "values", values)
    returns = returns.detach()
    sq = (values - returns) ** 2
    if clip is not None:
        old = old_values.detach()
        clipped = old + (values - old).clamp(-clip, clip)
        sq = torch.maximum(sq, (clipped - returns) ** 2)
    return 0.5 * aggregate_loss(sq, mask, agg_mode, max_response_tokens)


# ---- From logits -----------------------------------------------------------------------------------------------------


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of the softmax over the last dimension, (B, T, V) -> (B, T).

    H = logsumexp(z) - sum softmax(z) * z, computed from the shifted log-probs so large logits do not overflow;
    tokens with probability 0 (logit -inf) contribute 0, not NaN.
    """
    logp = torch.log_softmax(logits.float(), dim=-1)
    p = logp.exp()
    plogp = torch.where(p > 0, p * logp, torch.zeros_like(p))
    return -plogp.sum(dim=-1)


def logprobs_from_logits(logits: Tensor, labels: Tensor) -> Tensor:
    """Log-softmax of ``logits`` gathered at ``labels``, (B, T, V), (B, T) -> (B, T), in float32.

    Memory-lean: log p(label) = z[label] - logsumexp(z), computed one row at a time, so no full (B, T, V) log-softmax
    is materialised (or kept for backward). Align before calling: Trajectories log-probs at position t score token t,
    which the model predicts from position t - 1.
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} must be labels {tuple(labels.shape)} plus a vocabulary dimension"
        )
    rows = []
    for row_logits, row_labels in zip(logits, labels):
        row_logits = row_logits.float()  # logsumexp in bf16/fp16 loses too much precision
        picked = row_logits.gather(-1, row_labels.long().unsqueeze(-1)).squeeze(-1)
        rows.append(picked - torch.logsumexp(row_logits, dim=-1))
    if not rows:
        return torch.zeros(labels.shape, dtype=torch.float32, device=logits.device)
    return torch.stack(rows)
