"""Off-policy correction: per-token weights for tokens sampled by a policy other than the one the update clips to.

Three policies meet in one update. The *behaviour* policy sampled the tokens (the engine's log-probs,
``Trajectories.logprobs``); the *proximal* policy is what the PPO ratio is clipped against (the trainer's recomputed
old log-probs); the policy being trained carries the gradient. Synchronously they differ only by engine numerics
(vLLM in bfloat16 against the trainer in float32, other kernels); with a rollout producer running ahead of the
trainer (issue #16) the behaviour policy is up to S weight versions old. The weight corrects the surrogate for it:

* ``none``: weight 1 (the behaviour policy is taken to be the proximal one);
* ``tis``: token-level truncated importance sampling, ``w = min(exp(proximal - behaviour), cap)`` (verl's rollout
  IS correction, Ionides 2008): bounded variance, biased where the cap bites;
* ``decoupled``: decoupled PPO (AReaL, Hilton et al. 2021), ``w = exp(proximal - behaviour)`` where it is at most
  ``cap`` and 0 where it exceeds it: a token the behaviour policy was far less likely to sample than the proximal one
  says nothing reliable and is dropped rather than clipped.

The weights multiply the clipped surrogate per token (``algorithms.policy_loss``'s ``weights``); they are computed
without gradient. Both log-probs are of the same distribution: the trainer's are taken at the engine's sampling
temperature (``zerotir.rl.update.sequence_logprobs``), and nucleus sampling (top_p < 1), whose engine log-probs are of
the truncated distribution, is refused with a correction (``RLConfig.check_training_sampling``).
"""

from __future__ import annotations

from typing import get_args

import torch
from torch import Tensor

from zerotir.config import OffPolicyCorrection as Correction
from zerotir.rl.masked import _bool_mask, _check_shape, masked_mean

CORRECTIONS = get_args(Correction)  # the choices of model.rl.off_policy_correction


@torch.no_grad()
def behaviour_weights(proximal_logp: Tensor, behaviour_logp: Tensor, mask: Tensor, correction: Correction = "none",
                      cap: float = 2.0) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token weights of the policy loss for tokens sampled by the behaviour policy (see the module doc).

    Args:
        proximal_logp: (B, T) log-probs of the sampled tokens under the proximal policy (the trainer's old ones).
        behaviour_logp: (B, T) log-probs under the policy that sampled them (the engine's).
        mask: (B, T) action mask; weights are 0 off it.
        correction: "none", "tis" or "decoupled".
        cap: the truncation of "tis" and the drop threshold of "decoupled" (> 1).

    Returns:
        (weights, stats): weights (B, T), detached; stats ``is_ratio_mean`` (mean exp(proximal - behaviour) on the
        mask, before the cap), ``is_capped_fraction`` (share of action tokens whose ratio exceeds the cap: truncated by
        "tis", dropped by "decoupled", untouched by "none") and ``is_weight_mean``.
    """
    _check_shape("behaviour_logp", behaviour_logp, "proximal_logp", proximal_logp)
    _check_shape("mask", mask, "proximal_logp", proximal_logp)
    if correction not in CORRECTIONS:
        raise ValueError(f"correction={correction!r}: choose one of {CORRECTIONS}")
    if not cap > 1.0:
        raise ValueError(f"cap={cap}: must be > 1 (1 would weigh every token at most as the proximal policy does)")
    m = _bool_mask(mask)
    # Off the mask the log-probs can hold anything (prompt positions): zero the log-ratio before exp.
    log_ratio = torch.where(m, proximal_logp.float() - behaviour_logp.float(), torch.zeros_like(proximal_logp.float()))
    ratio = torch.exp(log_ratio)
    over = m & (ratio > cap)
    if correction == "none":
        weights = m.float()
    elif correction == "tis":
        weights = torch.where(m, ratio.clamp(max=cap), torch.zeros_like(ratio))
    else:
        weights = torch.where(m & ~over, ratio, torch.zeros_like(ratio))
    stats = {"is_ratio_mean": masked_mean(ratio, m), "is_capped_fraction": masked_mean(over.float(), m),
             "is_weight_mean": masked_mean(weights, m)}
    return weights, stats
