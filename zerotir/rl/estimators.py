"""The advantage estimators of ``model.rl.algorithm``, one function each with one signature, and their registry.

Every estimator takes plain tensors and the ``model.rl`` group and returns ``(advantages, value_targets)``:

    estimator(rewards, group_ids, mask, kl, values, cfg, all_reduce=None) -> (advantages (B, T), targets | None)

    * ``rewards`` (B,) outcome rewards; ``group_ids`` (B,) the prompt of each trajectory (the group baselines'
      groups); ``mask`` (B, T) the action mask.
    * ``kl`` (B, T) the per-token KL estimate to fold into the rewards with ``cfg.kl_coef``, or None when the KL is
      not in the rewards (``kl_coef`` 0, or ``use_kl_loss``: ``zerotir.rl.update.compute_advantages`` decides).
    * ``values`` (B, T) critic values (PPO only; the others ignore them).
    * ``all_reduce`` sums a small float64 vector over the data-parallel ranks, so that whitening uses the global
      batch (``zerotir.parallel.distributed.all_reduce_sum``); None: this process's batch only.
    * The advantages are 0 off the mask; ``value_targets`` are the critic's targets (PPO), None for the estimators
      without a critic.

``ESTIMATORS`` maps each ``model.rl.algorithm`` name (``zerotir.config.Algorithm``) to its function; the trainer
and the tests call the same functions. The building blocks are in ``zerotir.rl.algorithms`` (token returns, GAE,
whitening) and ``zerotir.rl.baselines`` (the group baselines).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

import torch
from torch import Tensor

from zerotir.config import RLConfig
from zerotir.rl.algorithms import discounted_returns, gae_advantages, masked_whiten, token_level_rewards
from zerotir.rl.baselines import group_advantages, kl_penalized_rewards, leave_one_out_advantages

AllReduce = Callable[[Tensor], Tensor]
Estimator = Callable[[Tensor, Tensor, Tensor, Tensor | None, Tensor | None, RLConfig, AllReduce | None],
                     tuple[Tensor, Tensor | None]]


def _kl_coef(kl: Tensor | None, cfg: RLConfig) -> float:
    return cfg.kl_coef if kl is not None else 0.0


def _token_returns(rewards: Tensor, mask: Tensor, kl: Tensor | None, cfg: RLConfig) -> Tensor:
    """REINFORCE++'s returns: the KL folded into the token rewards, discounted over the action tokens."""
    return discounted_returns(token_level_rewards(rewards, mask, kl, _kl_coef(kl, cfg)), mask, cfg.gamma)


def reinforce_pp(rewards: Tensor, group_ids: Tensor, mask: Tensor, kl: Tensor | None, values: Tensor | None,
                 cfg: RLConfig, all_reduce: AllReduce | None = None) -> tuple[Tensor, Tensor | None]:
    """REINFORCE++: the KL folded into the token rewards, discounted returns, whitened over the (global) batch
    with ``cfg.whiten_eps``. No baseline: ``group_ids`` is unused."""
    returns = _token_returns(rewards, mask, kl, cfg)
    return masked_whiten(returns, mask, eps=cfg.whiten_eps, all_reduce=all_reduce), None


def reinforce_baseline(rewards: Tensor, group_ids: Tensor, mask: Tensor, kl: Tensor | None, values: Tensor | None,
                       cfg: RLConfig, all_reduce: AllReduce | None = None) -> tuple[Tensor, Tensor | None]:
    """REINFORCE++-baseline (the paper's estimator, OpenRLHF's ``reinforce_baseline``): the reward minus its group's
    mean (no division by the group std), then REINFORCE++'s token returns with the KL folded in per token, then
    whitening over the batch."""
    centered = group_advantages(rewards, group_ids, scale_by_std=False)
    returns = _token_returns(centered, mask, kl, cfg)
    return masked_whiten(returns, mask, eps=cfg.whiten_eps, all_reduce=all_reduce), None


def rloo(rewards: Tensor, group_ids: Tensor, mask: Tensor, kl: Tensor | None, values: Tensor | None,
         cfg: RLConfig, all_reduce: AllReduce | None = None) -> tuple[Tensor, Tensor | None]:
    """RLOO (as OpenRLHF's ``rloo``): the reward minus the mean of the *other* samples of its group, then the token
    returns with the KL folded in; not whitened, so the advantages stay in reward units."""
    return _token_returns(leave_one_out_advantages(rewards, group_ids), mask, kl, cfg), None


def grpo(rewards: Tensor, group_ids: Tensor, mask: Tensor, kl: Tensor | None, values: Tensor | None,
         cfg: RLConfig, all_reduce: AllReduce | None = None) -> tuple[Tensor, Tensor | None]:
    """GRPO: the trajectory's summed KL subtracted from its reward (``grpo_kl_in_reward``), then (r - group mean) /
    (group std + ``grpo_std_eps``) (without the std with ``grpo_scale_by_std`` false: Dr. GRPO), one advantage per
    trajectory spread over its action tokens."""
    penalized = kl_penalized_rewards(rewards, mask, kl, _kl_coef(kl, cfg))
    per_traj = group_advantages(penalized, group_ids, cfg.grpo_scale_by_std, cfg.grpo_std_eps)
    return torch.where(mask, per_traj[:, None].expand_as(mask), torch.zeros_like(mask, dtype=torch.float32)), None


def ppo(rewards: Tensor, group_ids: Tensor, mask: Tensor, kl: Tensor | None, values: Tensor | None,
        cfg: RLConfig, all_reduce: AllReduce | None = None) -> tuple[Tensor, Tensor | None]:
    """PPO: the KL folded into the token rewards, GAE over the action tokens (``gamma``, ``gae_lambda``,
    ``gae_injected``) against the critic's ``values``, whitened over the batch when ``whiten_ppo_advantages``; the
    GAE returns are the critic's targets.

    Raises:
        ValueError: ``values`` is None (PPO needs the critic).
    """
    if values is None:
        raise ValueError("model.rl.algorithm=ppo needs critic values (the module builds the critic for ppo); pass "
                         "the critic's values of the batch")
    token_rewards = token_level_rewards(rewards, mask, kl, _kl_coef(kl, cfg))
    adv, returns = gae_advantages(token_rewards, values, mask, cfg.gamma, cfg.gae_lambda, cfg.gae_injected)
    if cfg.whiten_ppo_advantages:
        adv = masked_whiten(adv, mask, eps=cfg.whiten_eps, all_reduce=all_reduce)
    return adv, returns


ESTIMATORS: Mapping[str, Estimator] = MappingProxyType({
    "reinforce_pp": reinforce_pp,
    "reinforce_baseline": reinforce_baseline,
    "rloo": rloo,
    "grpo": grpo,
    "ppo": ppo,
})
