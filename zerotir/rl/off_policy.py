"""Off-policy correction: weights of the policy loss for tokens sampled by a policy other than the one the update
clips to, per token or per sequence.

Three policies meet in one update. The *behaviour* policy sampled the tokens (the engine's log-probs,
``Trajectories.logprobs``); the *proximal* policy is what the PPO ratio is clipped against (the trainer's recomputed
old log-probs); the policy being trained carries the gradient. Synchronously they differ only by engine numerics
(vLLM in bfloat16 against the trainer in float32, other kernels); with an engine host running ahead of the
trainer the behaviour policy is up to S weight versions old. With ``rho_t = exp(proximal_t - behaviour_t)``
on the action tokens of a row (injected tool output and prompt are not in any sum or mean), each mode a function of
the row's log-ratios in the registry ``CORRECTION_WEIGHTS`` (as the estimators are in ``rl.estimators.ESTIMATORS``):

* ``none``: weight 1 (the behaviour policy is taken to be the proximal one);
* ``tis``: token-level truncated importance sampling, ``w_t = min(rho_t, cap)`` (verl ``rollout_is: token``,
  Ionides 2008): bounded variance, biased where the cap bites;
* ``decoupled``: decoupled PPO (AReaL, Hilton et al. 2021), ``w_t = rho_t`` where it is at most ``cap`` and 0 where it
  exceeds it: a token the behaviour policy was far less likely to sample than the proximal one says nothing reliable
  and is dropped rather than clipped (verl has no mode of this form);
* ``seq_tis``: sequence-level truncated importance sampling, ``w = min(exp(sum_t log rho_t), cap)`` on every action
  token of the row (verl ``rollout_is: sequence``): the unbiased sequence ratio, truncated;
* ``seq_mask``: sequence rejection, weight 1 on the row's action tokens if ``exp(sum_t log rho_t)`` lies in
  ``[is_band_low, is_band_high]``, else 0 (verl ``rollout_rs: sequence``);
* ``geo_mask``: the same rejection on the geometric-mean ratio ``exp(mean_t log rho_t)``, which does not grow with
  the response length (verl ``rollout_rs: geometric``);
* ``token_mask``: IcePop's token rejection, ``w_t = 1`` if ``rho_t`` lies in the band, else 0 (verl
  ``rollout_rs: token``).

As in verl the masking modes reject and do not reweigh (a kept sequence weighs 1; verl's IS weights are a separate
setting), their band is inclusive at both ends, and a log-ratio (a token's or a row's sum / mean) is clamped to
``[-20, 20]`` before ``exp`` (verl's ``SAFETY_BOUND``: a weight stays within ``exp(+-20)``, about ``4.9e8``). The band
and cap tests are made on the unclamped log-ratio, in float64, against ``log(bound)``. Two differences from verl:
its lower bound defaults to ``1 / upper`` where both are given here, and a rejected token keeps its place in the loss's
denominator (its weight is 0, as ``decoupled``'s drops: ``algorithms.policy_loss``'s ``weights`` leave the token
counts alone), where verl removes it from the response mask, so a batch with a share r of its tokens rejected takes a
step (1 - r) as large. The weights are known only inside a micro-batch's forward in a single pass, after its share of
the mini-batch's loss units is fixed, which is why the denominator cannot follow them here.

The weights multiply the clipped surrogate per token and are computed without gradient. Both log-probs are of the same
distribution: the trainer's are taken at the engine's sampling temperature (``zerotir.rl.update.sequence_logprobs``),
and nucleus sampling (top_p < 1), whose engine log-probs are of the truncated distribution, is refused with a
correction (``RLConfig.check_training_sampling``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch
from torch import Tensor

from zerotir.config import MASKING_CORRECTIONS
from zerotir.config import OffPolicyCorrection as Correction
from zerotir.rl.masked import _bool_mask, _check_shape, masked_mean

SAFE_LOG_RATIO = 20.0  # |log-ratio| before exp (verl's SAFETY_BOUND): weights within exp(+-20) ~ 4.9e8


@dataclass(frozen=True)
class LogRatios:
    """What a correction reads: the log-ratios ``log rho`` of a batch in float64, 0 off the action mask."""

    token: Tensor  # (B, T) each action token's
    seq: Tensor  # (B, 1) their sum over the row: the log of the sequence ratio
    geo: Tensor  # (B, 1) their mean over the row's action tokens: the log of the geometric-mean ratio


# A correction: (log-ratios, cap, band (low, high) or None) -> (weights, dropped), each (B, T) or (B, 1) to broadcast:
# the weights before the mask is applied, and which of them the mode weighs 0 on purpose (a drop or a rejection).
CorrectionWeights = Callable[[LogRatios, float, tuple[float, float] | None], tuple[Tensor, Tensor]]


def _none(r: LogRatios, cap: float, band: tuple[float, float] | None) -> tuple[Tensor, Tensor]:
    return torch.ones_like(r.token), torch.zeros_like(r.token, dtype=torch.bool)


def _tis(r: LogRatios, cap: float, band: tuple[float, float] | None) -> tuple[Tensor, Tensor]:
    return _safe_exp(r.token).clamp(max=cap), torch.zeros_like(r.token, dtype=torch.bool)


def _seq_tis(r: LogRatios, cap: float, band: tuple[float, float] | None) -> tuple[Tensor, Tensor]:
    return _safe_exp(r.seq).clamp(max=cap), torch.zeros_like(r.seq, dtype=torch.bool)


def _decoupled(r: LogRatios, cap: float, band: tuple[float, float] | None) -> tuple[Tensor, Tensor]:
    over = r.token > math.log(cap)
    return torch.where(over, torch.zeros_like(r.token), _safe_exp(r.token)), over


def _in_band(tested: Tensor, band: tuple[float, float] | None) -> tuple[Tensor, Tensor]:
    """Weight 1 where ``tested`` (a log-ratio) lies in the band, both ends inclusive, else 0 (rejected)."""
    assert band is not None  # _check_arguments: the masking modes have their band
    kept = (tested >= math.log(band[0])) & (tested <= math.log(band[1]))
    return kept.double(), ~kept


# model.rl.off_policy_correction -> its weights (see the module doc); the keys are the choices of the config Literal.
CORRECTION_WEIGHTS: Mapping[str, CorrectionWeights] = MappingProxyType({
    "none": _none,
    "tis": _tis,
    "decoupled": _decoupled,
    "seq_tis": _seq_tis,
    "seq_mask": lambda r, cap, band: _in_band(r.seq, band),
    "geo_mask": lambda r, cap, band: _in_band(r.geo, band),
    "token_mask": lambda r, cap, band: _in_band(r.token, band),
})
CORRECTIONS = tuple(CORRECTION_WEIGHTS)  # the choices of model.rl.off_policy_correction (a test: the Literal's)


@torch.no_grad()
def behaviour_weights(proximal_logp: Tensor, behaviour_logp: Tensor, mask: Tensor, correction: Correction = "none",
                      cap: float = 2.0, is_band_low: float | None = None,
                      is_band_high: float | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token weights of the policy loss for tokens sampled by the behaviour policy (see the module doc).

    Args:
        proximal_logp: (B, T) log-probs of the sampled tokens under the proximal policy (the trainer's old ones).
        behaviour_logp: (B, T) log-probs under the policy that sampled them (the engine's).
        mask: (B, T) action mask; weights are 0 off it, and only its tokens enter a row's sum or mean.
        correction: one of ``CORRECTIONS`` (its function: ``CORRECTION_WEIGHTS``).
        cap: the truncation of "tis" / "seq_tis" and the drop threshold of "decoupled" (> 1).
        is_band_low, is_band_high: the kept band of the masking modes ("seq_mask", "geo_mask", "token_mask"),
            0 < low < 1 < high; both given for those modes, neither for the others.

    Returns:
        (weights, stats): weights (B, T) float32, detached. Stats, every one whatever the mode: ``is_ratio_mean``
        (mean token ratio on the mask, clamped as above, before any cap), ``is_capped_fraction`` (share of action
        tokens whose ratio exceeds the cap), ``is_seq_capped_fraction`` (share of rows with an action token whose
        sequence ratio exceeds it), ``is_masked_fraction`` (share of action tokens the mode weighs 0: decoupled's
        drops, the masks' rejections), ``is_seq_masked_fraction`` (share of rows with an action token that have
        at least one such token) and ``is_weight_mean`` (mean weight on the mask).
    """
    _check_arguments(proximal_logp, behaviour_logp, mask, correction, cap, is_band_low, is_band_high)
    m = _bool_mask(mask)
    zero = torch.zeros((), dtype=torch.float64, device=m.device)
    # Off the mask the log-probs can hold anything (prompt positions): zero the log-ratio before any sum or exp.
    log_ratio = torch.where(m, proximal_logp.double() - behaviour_logp.double(), zero)
    seq_log = log_ratio.sum(dim=1, keepdim=True)  # (B, 1): log of the product of the row's token ratios
    geo_log = seq_log / m.sum(dim=1, keepdim=True).clamp(min=1)  # (B, 1): log of their geometric mean
    band = None if is_band_low is None or is_band_high is None else (is_band_low, is_band_high)
    weights, dropped = CORRECTION_WEIGHTS[correction](LogRatios(log_ratio, seq_log, geo_log), cap, band)
    weights = torch.where(m, weights.expand_as(log_ratio), zero).float()
    dropped = dropped.expand_as(m) & m
    rows = m.any(dim=1)
    log_cap = math.log(cap)
    stats = {
        "is_ratio_mean": masked_mean(_safe_exp(log_ratio), m).float(),
        "is_capped_fraction": masked_mean((log_ratio > log_cap).float(), m),
        "is_seq_capped_fraction": masked_mean((seq_log[:, 0] > log_cap).float(), rows),
        "is_masked_fraction": masked_mean(dropped.float(), m),
        "is_seq_masked_fraction": masked_mean(dropped.any(dim=1).float(), rows),
        "is_weight_mean": masked_mean(weights, m),
    }
    return weights, stats


def _safe_exp(log_ratio: Tensor) -> Tensor:
    """exp of a log-ratio clamped to [-SAFE_LOG_RATIO, SAFE_LOG_RATIO]: finite for any finite input."""
    return torch.exp(log_ratio.clamp(-SAFE_LOG_RATIO, SAFE_LOG_RATIO))


def _check_arguments(proximal_logp: Tensor, behaviour_logp: Tensor, mask: Tensor, correction: str, cap: float,
                     low: float | None, high: float | None) -> None:
    """Shapes, the mode, the cap and the band, each error naming the argument."""
    _check_shape("behaviour_logp", behaviour_logp, "proximal_logp", proximal_logp)
    _check_shape("mask", mask, "proximal_logp", proximal_logp)
    if correction not in CORRECTION_WEIGHTS:
        raise ValueError(f"correction={correction!r}: choose one of {CORRECTIONS}")
    if not cap > 1.0:
        raise ValueError(f"cap={cap}: must be > 1 (1 would weigh every token at most as the proximal policy does)")
    banded = correction in MASKING_CORRECTIONS
    if banded and (low is None or high is None):
        raise ValueError(f"correction={correction!r} needs is_band_low and is_band_high (e.g. 0.5 and 2.0), got "
                         f"{low} and {high}")
    if not banded and (low is not None or high is not None):
        raise ValueError(f"is_band_low={low}, is_band_high={high} with correction={correction!r}: the band is used "
                         f"only by {MASKING_CORRECTIONS}")
    if banded and not 0 < low < 1 < high:
        raise ValueError(f"is_band_low={low}, is_band_high={high}: need 0 < is_band_low < 1 < is_band_high")
