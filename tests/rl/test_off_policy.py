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
