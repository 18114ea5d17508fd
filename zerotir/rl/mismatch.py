"""How far the engine's log-probs of the sampled tokens are from the trainer's: the mismatch diagnostics of a step.

The engine (vLLM in bfloat16, other kernels, or weights some versions old) sampled the tokens and reported their
log-probs; the trainer scores the same tokens under its own weights at the same temperature. Their gap is what the
off-policy corrections (``zerotir.rl.off_policy``) act on, and these numbers say how large it is whether a correction
is on or not. Over the action tokens of the batch (prompt, injected tool output and padding left out), with
``log rho_t = trainer_t - engine_t``:

* ``mismatch_kl``: the k3 estimate of KL(engine || trainer), the token mean of ``rho - 1 - log rho`` (>= 0 per token;
  the tokens are samples of the engine, so its mean estimates that direction), as verl's ``rollout_corr/k3_kl``;
* ``mismatch_chi2``: the token-level chi-square divergence chi2(trainer || engine) = ``E_engine[rho^2] - 1`` (the
  variance of the token importance weights), as verl's ``chi2_token``;
* ``mismatch_engine_ppl`` / ``mismatch_trainer_ppl``: ``exp(-mean log-prob)`` over the action tokens of the batch
  (a token mean; verl averages per-sequence perplexities instead, which weighs a short response as much as a long one).

``rho`` is computed from a log-ratio clamped to [-20, 20] (verl's ``SAFETY_BOUND``), so one broken token gives a large
finite number, not inf. A batch without action tokens gives 0, 0, 1, 1. Pure tensor math, without gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor

from zerotir.rl.masked import _bool_mask, _check_shape, masked_mean
from zerotir.rl.off_policy import SAFE_LOG_RATIO


@torch.no_grad()
def mismatch_stats(trainer_logp: Tensor, engine_logp: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """The mismatch diagnostics of the module doc, each a 0-dim float32 tensor keyed by its step-stat name.

    Args:
        trainer_logp: (B, T) the trainer's log-probs of the sampled tokens (its old log-probs).
        engine_logp: (B, T) the engine's log-probs of the same tokens.
        mask: (B, T) action mask.
    """
    _check_shape("engine_logp", engine_logp, "trainer_logp", trainer_logp)
    _check_shape("mask", mask, "trainer_logp", trainer_logp)
    m = _bool_mask(mask)
    zero = torch.zeros((), dtype=torch.float64, device=m.device)
    trainer = torch.where(m, trainer_logp.double(), zero)
    engine = torch.where(m, engine_logp.double(), zero)
    log_rho = (trainer - engine).clamp(-SAFE_LOG_RATIO, SAFE_LOG_RATIO)
    rho = torch.exp(log_rho)
    stats = {
        "mismatch_kl": masked_mean(rho - 1 - log_rho, m),
        "mismatch_chi2": masked_mean(rho**2, m) - 1 if m.any() else zero,
        "mismatch_engine_ppl": torch.exp(-masked_mean(engine, m)),
        "mismatch_trainer_ppl": torch.exp(-masked_mean(trainer, m)),
    }
    return {k: v.float() for k, v in stats.items()}
