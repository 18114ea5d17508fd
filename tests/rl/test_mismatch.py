"""The engine-vs-trainer mismatch diagnostics (``zerotir.rl.mismatch``), worked by hand."""

from __future__ import annotations

import math

import pytest
import torch

from zerotir.rl.mismatch import mismatch_stats

L2 = math.log(2.0)
# Two rows of 5 positions: 0 prompt, row 0 samples 1, 2 and 4 (3 is an injected tool output), row 1 samples 1 only.
MASK = torch.tensor([[0, 1, 1, 0, 1], [0, 1, 0, 0, 0]])
# Probabilities of the sampled tokens (trainer / engine) on the action tokens; the rest is garbage that must not count.
TRAINER = torch.log(torch.tensor([[1e-30, 0.5, 0.25, 1e-30, 0.5], [1.0, 0.5, 1e-30, 1.0, 1.0]]))
ENGINE = torch.log(torch.tensor([[1.0, 0.25, 0.25, 1.0, 1.0], [1e-30, 0.25, 1.0, 1e-30, 1e-30]]))
TRAINER[0, 3] = 500.0


def test_diagnostics_by_hand():
    # rho = trainer / engine on the 4 action tokens: 2, 1, 1/2, 2.
    stats = mismatch_stats(TRAINER, ENGINE, MASK)
    # k3 per token, rho - 1 - ln rho: 1 - ln 2, 0, ln 2 - 1/2, 1 - ln 2; sum 3/2 - ln 2, over 4 tokens.
    assert stats["mismatch_kl"].item() == pytest.approx((1.5 - L2) / 4, abs=1e-6)  # 0.2017
    # chi-square E[rho^2] - 1 = (4 + 1 + 1/4 + 4) / 4 - 1.
    assert stats["mismatch_chi2"].item() == pytest.approx(9.25 / 4 - 1, abs=1e-6)  # 1.3125
    # Token-mean perplexities: trainer log-probs -ln2, -2 ln2, -ln2, -ln2 (mean -5/4 ln2): 2^(5/4);
    # engine -2 ln2, -2 ln2, 0, -2 ln2 (mean -3/2 ln2): 2^(3/2).
    assert stats["mismatch_trainer_ppl"].item() == pytest.approx(2**1.25, abs=1e-5)  # 2.3784
    assert stats["mismatch_engine_ppl"].item() == pytest.approx(2**1.5, abs=1e-5)  # 2.8284
    assert all(v.dtype == torch.float32 and v.dim() == 0 for v in stats.values())


def test_equal_log_probs_give_no_mismatch_and_an_empty_mask_neutral_values():
    stats = mismatch_stats(TRAINER, TRAINER.clone(), MASK)
    assert stats["mismatch_kl"].item() == 0.0 and stats["mismatch_chi2"].item() == pytest.approx(0.0, abs=1e-7)
    assert stats["mismatch_trainer_ppl"].item() == pytest.approx(stats["mismatch_engine_ppl"].item())
    empty = mismatch_stats(TRAINER, ENGINE, torch.zeros_like(MASK))
    assert {k: v.item() for k, v in empty.items()} == {"mismatch_kl": 0.0, "mismatch_chi2": 0.0,
                                                       "mismatch_engine_ppl": 1.0, "mismatch_trainer_ppl": 1.0}


def test_a_broken_token_gives_a_large_finite_number():
    # log rho = 100 is clamped to 20 before exp: k3 = e^20 - 21, chi2 = e^40 - 1 (one token).
    stats = mismatch_stats(torch.tensor([[100.0]]), torch.zeros(1, 1), torch.ones(1, 1))
    assert stats["mismatch_kl"].item() == pytest.approx(math.exp(20) - 21, rel=1e-6)
    assert stats["mismatch_chi2"].item() == pytest.approx(math.exp(40) - 1, rel=1e-6)
    assert all(torch.isfinite(v) for v in stats.values())


def test_shapes_are_checked():
    with pytest.raises(ValueError, match="engine_logp"):
        mismatch_stats(TRAINER, ENGINE[:, :3], MASK)
