"""Baselines of the outcome reward from the other samples of the same prompt, as pure tensor functions.

The group estimators (``zerotir.rl.estimators``) sample ``n`` trajectories per prompt (``Trajectories.group_ids``)
and use the group as its own baseline instead of a critic; these are their baselines:

    * ``group_advantages``: (r - group mean) / (group std + eps), one advantage per trajectory (GRPO), or r - group
      mean without the std (REINFORCE++-baseline, the paper's estimator: the std is not needed for variance
      reduction and inflates the advantages of nearly-solved and nearly-failed prompts).
    * ``leave_one_out_advantages``: r - mean of the *other* samples of the group, an unbiased baseline (RLOO).
    * ``kl_penalized_rewards``: the reward minus the trajectory's summed KL (GRPO's KL in the reward).

A group of one sample has no other sample to compare with: its baseline is its own reward and its advantage 0 (for
every estimator), so it gives no learning signal; configs with these estimators need ``model.sampling.n >= 2``
(``RLConfig.check_training_sampling``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from zerotir.rl.masked import group_stats, masked_sum


def group_advantages(
    rewards: Tensor, group_ids: Tensor, scale_by_std: bool = True, eps: float = 1e-6
) -> Tensor:
    """GRPO baseline: each reward minus the mean of its prompt group, divided by the group std.

    Args:
        rewards: (B,) outcome rewards.
        group_ids: (B,) prompt index of each trajectory (any integers; groups need not be contiguous).
        scale_by_std: divide by (group std + eps); the std is unbiased (Bessel), as in GRPO's reference code. A group
            of one sample has std 0 and advantage 0. False gives the plain group-centred reward (Dr. GRPO).
        eps: added to the std (``grpo_std_eps``): an all-equal group has std 0, and eps bounds the division.

    Returns:
        (B,) advantages (broadcast them over the action tokens for the policy loss).
    """
    mean, count, inverse = group_stats(rewards, group_ids)
    centered = rewards.to(torch.float64) - mean
    if scale_by_std:
        num_groups = int(inverse.max().item()) + 1 if inverse.numel() else 0
        sq = torch.zeros(num_groups, dtype=torch.float64, device=centered.device).index_add_(0, inverse, centered**2)
        std = torch.sqrt(sq[inverse] / (count - 1).clamp(min=1))
        centered = centered / (std + eps)
    return centered.to(rewards.dtype)


def leave_one_out_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """RLOO: each reward minus the mean reward of the other samples of its group, (B,) -> (B,).

    r_i - (sum_group - r_i) / (n - 1), which equals (r_i - group mean) * n / (n - 1). A group of one: 0.
    """
    mean, n, _ = group_stats(rewards, group_ids)
    r = rewards.to(torch.float64)
    others_mean = (mean * n - r) / (n - 1).clamp(min=1)
    return torch.where(n > 1, r - others_mean, torch.zeros_like(r)).to(rewards.dtype)


def kl_penalized_rewards(rewards: Tensor, mask: Tensor, kl: Tensor | None, kl_coef: float) -> Tensor:
    """The outcome reward minus ``kl_coef`` times the trajectory's summed per-token KL, (B,) -> (B,).

    GRPO with the KL folded into the rewards (``grpo_kl_in_reward``, verl's ``use_kl_in_reward``): the token
    rewards of ``token_level_rewards`` summed over the response, before the group baseline.
    """
    if kl is None or kl_coef == 0.0:
        return rewards
    return rewards - kl_coef * masked_sum(kl.to(rewards.dtype), mask, dim=1)
