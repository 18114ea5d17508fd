"""Off-policy weights (``zerotir.rl.off_policy``) and the weighted policy loss, worked by hand."""

from __future__ import annotations

import math

import pytest
import torch

from zerotir.config import RLConfig
from zerotir.rl.algorithms import policy_loss
from zerotir.rl.off_policy import behaviour_weights

# Three action tokens and one prompt position holding garbage: proximal / behaviour probabilities 0.5 / 0.25 (ratio
# 2), 0.5 / 0.5 (ratio 1), 0.2 / 0.8 (ratio 0.25).
PROX = torch.log(torch.tensor([[0.5, 0.5, 0.2, 1e-30]]))
BEHAV = torch.log(torch.tensor([[0.25, 0.5, 0.8, 1.0]]))
PROX[0, 3] = 500.0  # off the mask: exp would overflow if it were not zeroed first
MASK = torch.tensor([[1, 1, 1, 0]])


@pytest.mark.parametrize("correction, want", [
    ("none", [1.0, 1.0, 1.0, 0.0]),
    ("tis", [1.5, 1.0, 0.25, 0.0]),  # the ratio 2 truncated at the cap
    ("decoupled", [0.0, 1.0, 0.25, 0.0]),  # the ratio 2 is above the cap: that token is dropped
])
def test_weights_by_hand(correction, want):
    weights, stats = behaviour_weights(PROX, BEHAV, MASK, correction, cap=1.5)
    assert weights[0].tolist() == pytest.approx(want, abs=1e-6)
    assert stats["is_ratio_mean"].item() == pytest.approx((2 + 1 + 0.25) / 3, abs=1e-6)
    assert stats["is_capped_fraction"].item() == pytest.approx(1 / 3)
    assert stats["is_weight_mean"].item() == pytest.approx(sum(want) / 3, abs=1e-6)
    assert torch.isfinite(weights).all() and not weights.requires_grad


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="correction='is'"):
        behaviour_weights(PROX, BEHAV, MASK, "is")
    with pytest.raises(ValueError, match="cap=1.0: must be > 1"):
        behaviour_weights(PROX, BEHAV, MASK, "tis", cap=1.0)
    with pytest.raises(ValueError, match="behaviour_logp"):
        behaviour_weights(PROX, BEHAV[:, :2], MASK, "tis")
    with pytest.raises(ValueError, match="model.rl.off_policy_correction='is'"):
        RLConfig(off_policy_correction="is")
    with pytest.raises(ValueError, match="model.rl.is_cap=1"):
        RLConfig(is_cap=1)


def test_weights_scale_each_tokens_surrogate():
    # The policy equals the old policy (ratio 1, nothing clipped): per-token loss -A x weight, token mean over 3.
    logp = torch.zeros(1, 4, requires_grad=True)
    adv = torch.tensor([[1.0, -1.0, 2.0, 7.0]])
    weights, _ = behaviour_weights(PROX, BEHAV, MASK, "tis", cap=1.5)
    loss, _ = policy_loss(logp, logp.detach(), adv, MASK, weights=weights)
    assert loss.item() == pytest.approx(-(1.5 * 1 - 1.0 * 1 + 0.25 * 2) / 3)
    loss.backward()  # d loss / d logp = -A x w / 3 on the action tokens (ratio 1: d ratio / d logp = 1)
    assert logp.grad[0].tolist() == pytest.approx([-0.5, 1 / 3, -0.5 / 3, 0.0])
    plain, _ = policy_loss(logp, logp.detach(), adv, MASK)
    assert plain.item() == pytest.approx(-(1 - 1 + 2) / 3)


def test_the_same_engine_and_trainer_log_probs_leave_the_loss_unchanged():
    logp = torch.randn(2, 5)
    adv = torch.randn(2, 5)
    mask = torch.ones(2, 5)
    for correction in ("tis", "decoupled"):
        weights, stats = behaviour_weights(logp, logp.clone(), mask, correction, cap=2.0)
        assert torch.equal(weights, mask) and math.isclose(stats["is_capped_fraction"].item(), 0.0)
        new = logp + 0.1 * torch.randn(2, 5)
        assert torch.allclose(policy_loss(new, logp, adv, mask, weights=weights)[0], policy_loss(new, logp, adv, mask)[0])


# ---- Sequence-level corrections and the masking modes ----------------------------------------------------------------
# Three rows of 6 positions: 0 prompt (garbage log-ratio 500), 1-2 sampled, 3 injected tool output (garbage 50: it must
# enter no sum or mean), 4-5 sampled. Token ratios rho on the 12 action tokens, and each row's product / geometric mean:
#   row 0: 2, 2, 1, 1/4   product 1 (log 0)        geometric mean 1
#   row 1: 2, 2, 2, 1     product 8 (log 3 ln 2)    geometric mean 8^(1/4) = 1.682
#   row 2: 1/3, 1, 1, 1   product 1/3              geometric mean 3^(-1/4) = 0.760
# cap 1.5, band [0.8, 3].
L2, L3 = math.log(2.0), math.log(3.0)
SEQ_MASK = torch.tensor([[0, 1, 1, 0, 1, 1]] * 3)
SEQ_LOG_RATIO = torch.tensor([[500.0, L2, L2, 50.0, 0.0, -2 * L2],
                              [500.0, L2, L2, 50.0, L2, 0.0],
                              [500.0, -L3, 0.0, 50.0, 0.0, 0.0]])
SEQ_BEHAV = torch.full((3, 6), -1.0)
SEQ_PROX = SEQ_BEHAV + SEQ_LOG_RATIO
BAND = {"is_band_low": 0.8, "is_band_high": 3.0}


def _rows(*rows):
    """Per-row weights on the action tokens (positions 1, 2, 4, 5), 0 on the prompt and the injected position."""
    return [[0.0, r[0], r[1], 0.0, r[2], r[3]] for r in rows]


@pytest.mark.parametrize("correction, want, masked, seq_masked", [
    ("none", _rows([1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]), 0, 0),
    ("tis", _rows([1.5, 1.5, 1, 0.25], [1.5, 1.5, 1.5, 1], [1 / 3, 1, 1, 1]), 0, 0),
    ("decoupled", _rows([0, 0, 1, 0.25], [0, 0, 0, 1], [1 / 3, 1, 1, 1]), 5 / 12, 2 / 3),  # rho 2 > 1.5 dropped
    ("seq_tis", _rows([1] * 4, [1.5] * 4, [1 / 3] * 4), 0, 0),  # min(product, 1.5) on the whole row
    ("seq_mask", _rows([1] * 4, [0] * 4, [0] * 4), 8 / 12, 2 / 3),  # products 8 and 1/3 leave [0.8, 3]
    ("geo_mask", _rows([1] * 4, [1] * 4, [0] * 4), 4 / 12, 1 / 3),  # 0.760 < 0.8
    ("token_mask", _rows([1, 1, 1, 0], [1, 1, 1, 1], [0, 1, 1, 1]), 2 / 12, 2 / 3),  # 1/4 and 1/3 < 0.8
])
def test_every_mode_by_hand_on_three_rows_with_a_tool_span(correction, want, masked, seq_masked):
    band = BAND if correction in ("seq_mask", "geo_mask", "token_mask") else {}
    weights, stats = behaviour_weights(SEQ_PROX, SEQ_BEHAV, SEQ_MASK, correction, cap=1.5, **band)
    assert weights.dtype == torch.float32 and not weights.requires_grad
    assert weights.tolist() == [pytest.approx(row, abs=1e-6) for row in want]
    # The same statistics whatever the mode, but for what the mode drops and the weights it gives.
    assert stats["is_ratio_mean"].item() == pytest.approx((2 + 2 + 1 + 0.25 + 2 + 2 + 2 + 1 + 1 / 3 + 3) / 12, abs=1e-6)
    assert stats["is_capped_fraction"].item() == pytest.approx(5 / 12)  # the five rho = 2
    assert stats["is_seq_capped_fraction"].item() == pytest.approx(1 / 3)  # row 1's product 8
    assert stats["is_masked_fraction"].item() == pytest.approx(masked)
    assert stats["is_seq_masked_fraction"].item() == pytest.approx(seq_masked)
    assert stats["is_weight_mean"].item() == pytest.approx(sum(map(sum, want)) / 12, abs=1e-6)


def test_the_band_is_inclusive_at_both_ends():
    # log(exp(-0.25)) and log(exp(0.5)) are exactly -0.25 and 0.5 in float64, and so are these float32 log-ratios:
    # a ratio on an end is kept, one 2^-10 beyond it in log is dropped.
    low, high, eps = math.exp(-0.25), math.exp(0.5), 2.0**-10
    band = {"is_band_low": low, "is_band_high": high}
    tokens = torch.tensor([[-0.25, 0.5, -0.25 - eps, 0.5 + eps]])
    weights, _ = behaviour_weights(tokens, torch.zeros_like(tokens), torch.ones_like(tokens), "token_mask", **band)
    assert weights.tolist() == [[1.0, 1.0, 0.0, 0.0]]
    # Sequences (two tokens each): products exp(0.5) and exp(-0.25) kept, one 2^-10 beyond dropped.
    rows = torch.tensor([[0.25, 0.25], [-0.125, -0.125], [0.25, 0.25 + eps], [-0.125, -0.125 - eps]])
    weights, _ = behaviour_weights(rows, torch.zeros_like(rows), torch.ones_like(rows), "seq_mask", **band)
    assert weights.tolist() == [[1.0, 1.0], [1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]
    # Geometric means: (1 + 0) / 2 = 0.5 and (-0.5 + 0) / 2 = -0.25 kept; 2 eps over two tokens beyond dropped.
    rows = torch.tensor([[1.0, 0.0], [-0.5, 0.0], [1.0, 2 * eps], [-0.5, -2 * eps]])
    weights, _ = behaviour_weights(rows, torch.zeros_like(rows), torch.ones_like(rows), "geo_mask", **band)
    assert weights.tolist() == [[1.0, 1.0], [1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]


def test_a_log_ratio_of_100_stays_finite():
    # Row 0: one token at log-ratio +100 (exp overflows float32), row 1: -100. The log is clamped to +-20 before exp.
    prox = torch.tensor([[100.0, 0.0], [-100.0, 0.0]])
    behav, mask = torch.zeros(2, 2), torch.ones(2, 2)
    for correction, want in (("tis", [[2.0, 1.0], [math.exp(-20), 1.0]]),
                             ("seq_tis", [[2.0, 2.0], [math.exp(-20), math.exp(-20)]]),
                             ("decoupled", [[0.0, 1.0], [math.exp(-20), 1.0]])):
        weights, stats = behaviour_weights(prox, behav, mask, correction, cap=2.0)
        assert weights.tolist() == [pytest.approx(row, rel=1e-5) for row in want], correction
        assert all(torch.isfinite(v).all() for v in [weights, *stats.values()])
        assert stats["is_ratio_mean"].item() == pytest.approx((math.exp(20) + 1 + math.exp(-20) + 1) / 4, rel=1e-5)
    weights, _ = behaviour_weights(prox, behav, mask, "geo_mask", is_band_low=0.5, is_band_high=2.0)
    assert weights.tolist() == [[0.0, 0.0], [0.0, 0.0]]  # geometric means exp(+-50)


def test_a_row_without_action_tokens_weighs_nothing_and_counts_in_no_row_share():
    mask = SEQ_MASK.clone()
    mask[1] = 0
    weights, stats = behaviour_weights(SEQ_PROX, SEQ_BEHAV, mask, "seq_mask", **BAND)
    assert weights[1].abs().sum() == 0
    assert stats["is_seq_masked_fraction"].item() == pytest.approx(1 / 2)  # rows 0 (kept) and 2 (rejected)


@pytest.mark.parametrize("kwargs, message", [
    ({"correction": "seq_mask"}, "correction='seq_mask' needs is_band_low and is_band_high"),
    ({"correction": "tis", "is_band_low": 0.5, "is_band_high": 2.0}, r"with correction='tis': the band is used only"),
    ({"correction": "token_mask", "is_band_low": 1.0, "is_band_high": 2.0}, "need 0 < is_band_low < 1 < is_band_high"),
    ({"correction": "geo_mask", "is_band_low": 0.5, "is_band_high": 1.0}, "need 0 < is_band_low < 1 < is_band_high"),
])
def test_the_band_is_checked_in_the_function(kwargs, message):
    with pytest.raises(ValueError, match=message):
        behaviour_weights(PROX, BEHAV, MASK, **kwargs)


@pytest.mark.parametrize("kwargs, message", [
    ({"off_policy_correction": "seq_mask"},
     r"model.rl.off_policy_correction='seq_mask' with is_band_low=None.*set both"),
    ({"off_policy_correction": "token_mask", "is_band_low": 0.5}, r"is_band_high=None.*set both"),
    ({"off_policy_correction": "geo_mask", "is_band_low": 0.0, "is_band_high": 2.0},
     r"model.rl.is_band_low=0.0, is_band_high=2.0: need 0 < is_band_low < 1 < is_band_high"),
    ({"off_policy_correction": "seq_mask", "is_band_low": 0.5, "is_band_high": 0.9}, "need 0 < is_band_low < 1"),
    ({"off_policy_correction": "seq_tis", "is_band_high": 2.0},
     r"model.rl.is_band_low=None, is_band_high=2.0 with off_policy_correction='seq_tis'.*remove is_band_low"),
    ({"is_band_low": 0.5, "is_band_high": 2.0}, r"off_policy_correction='none': the band is used only by seq_mask"),
])
def test_config_checks_of_the_band(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RLConfig(**kwargs)


def test_config_accepts_each_mode_with_its_settings():
    for correction in ("none", "tis", "decoupled", "seq_tis"):
        assert RLConfig(off_policy_correction=correction).is_band_low is None
    for correction in ("seq_mask", "geo_mask", "token_mask"):
        cfg = RLConfig(off_policy_correction=correction, is_band_low=0.5, is_band_high=2.0)
        behaviour_weights(PROX, BEHAV, MASK, cfg.off_policy_correction, cfg.is_cap, cfg.is_band_low, cfg.is_band_high)
