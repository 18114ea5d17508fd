"""The update's corrections on a tiny random model: the entropy bonus, off-policy correction by the engine's
log-probs (token and sequence level), the mismatch diagnostics and the k2 / k3 clamp."""

from __future__ import annotations

import math

import pytest
import torch

from tests.rl.update_world import make_traj, prepared, run_update
from zerotir.rl import algorithms as A
from zerotir.rl.update import (
    RLConfig,
    micro_batch_loss,
    prepare_batch,
    sequence_logprobs,
)


def test_entropy_bonus_reaches_the_gradient_only_when_asked(tiny):
    traj = make_traj([1.0, 0.0], [0, 0])
    plain_cfg, bonus_cfg = RLConfig(algorithm="grpo"), RLConfig(algorithm="grpo", entropy_coef=0.5)
    plain, _, stats = run_update(tiny, prepared(tiny, traj, plain_cfg), plain_cfg)
    bonus, _, _ = run_update(tiny, prepared(tiny, traj, bonus_cfg), bonus_cfg)
    name = "lm_head.weight"
    assert not torch.allclose(plain[0][name], bonus[0][name])
    assert stats["entropy"] > 0


@pytest.mark.parametrize("entropy_coef,with_grad", [(0.0, False), (0.5, True)])
def test_entropy_keeps_no_graph_unless_it_is_in_the_loss(tiny, monkeypatch, entropy_coef, with_grad):
    # A graph through a (T, V) float32 softmax per row costs ~16 GiB for a 9k-token sequence with a 152k vocabulary.
    seen = []
    original = A.entropy_from_logits

    def spy(logits):
        out = original(logits)
        seen.append((logits.requires_grad, out.requires_grad))
        return out

    monkeypatch.setattr(A, "entropy_from_logits", spy)
    cfg = RLConfig(algorithm="grpo", entropy_coef=entropy_coef)
    batch = prepared(tiny, make_traj([1.0, 0.0], [0, 0]), cfg)
    loss, stats = micro_batch_loss(cfg, batch, tiny, None, temperature=1.0)
    assert len(seen) == 2 and all(logits_grad for logits_grad, _ in seen)  # one call per row, inside the graph
    assert all(out_grad is with_grad for _, out_grad in seen)
    assert loss.requires_grad and stats["entropy"] > 0


@pytest.mark.parametrize("correction", ["tis", "decoupled"])
def test_off_policy_correction_reweights_the_update_by_the_engine_log_probs(tiny, correction):
    """The engine's log-probs equal to the trainer's: the correction changes nothing. Made 1.5x likelier under the
    trainer (the engine gave the sampled tokens less probability) on row 0 only: with a cap of 2 that row's tokens
    weigh 1.5 in either correction, which is the gradient of the uncorrected loss with row 0's advantage x 1.5."""
    traj = make_traj([1.0, 0.0, 1.0, 0.0], [0, 0, 1, 1])
    cfg = RLConfig(algorithm="grpo", micro_batch_size=4, off_policy_correction=correction, is_cap=2.0)
    plain_cfg = RLConfig(algorithm="grpo", micro_batch_size=4)
    batch = prepared(tiny, traj, cfg)  # a single pass: the trainer's log-probs are those of the update's forward
    with torch.no_grad():
        batch.engine_logp = sequence_logprobs(tiny, batch.input_ids, batch.attention_mask,
                                              temperature=1.0)[0].clone()
    same, _, stats = run_update(tiny, batch, cfg)
    plain, _, _ = run_update(tiny, batch, plain_cfg)
    for name, g in same[0].items():
        assert torch.allclose(g, plain[0][name], atol=1e-6), name
    assert stats["is_weight_mean"] == pytest.approx(1.0) and stats["is_capped_fraction"] == 0.0
    batch.engine_logp[0] -= math.log(1.5)
    weighted, _, stats = run_update(tiny, batch, cfg)
    scaled = prepared(tiny, traj, plain_cfg)
    scaled.advantages = scaled.advantages.clone()
    scaled.advantages[0] *= 1.5
    want, _, _ = run_update(tiny, scaled, plain_cfg)
    for name, g in weighted[0].items():
        assert torch.allclose(g, want[0][name], atol=1e-6), name
    assert stats["is_ratio_mean"] > 1.0


@pytest.mark.parametrize("correction", ["seq_mask", "geo_mask", "token_mask"])
def test_a_rejected_sequence_contributes_no_gradient(tiny, correction):
    """Row 0's engine log-probs are ln 4 below the trainer's on each of its 4 action tokens: token ratios 4, product
    256, geometric mean 4, all outside [0.5, 2]; the other rows' engine log-probs are the trainer's (ratio 1, kept,
    weight 1). The update's gradient is then the uncorrected one with row 0's advantages zeroed (its tokens still
    count in the token mean: the weights leave the denominator alone)."""
    traj = make_traj([1.0, 0.0, 1.0, 0.0], [0, 0, 1, 1])
    cfg = RLConfig(algorithm="grpo", micro_batch_size=2, off_policy_correction=correction, is_band_low=0.5,
                   is_band_high=2.0)
    plain_cfg = RLConfig(algorithm="grpo", micro_batch_size=2)
    batch = prepared(tiny, traj, cfg)
    with torch.no_grad():
        batch.engine_logp = sequence_logprobs(tiny, batch.input_ids, batch.attention_mask,
                                              temperature=1.0)[0].clone()
    batch.engine_logp[0] -= math.log(4.0)
    masked, _, stats = run_update(tiny, batch, cfg)
    without_row0 = prepared(tiny, traj, plain_cfg)
    without_row0.advantages = without_row0.advantages.clone()
    assert without_row0.advantages[0].abs().sum() > 0  # the row had a gradient to lose
    without_row0.advantages[0] = 0.0
    want, _, _ = run_update(tiny, without_row0, plain_cfg)
    plain, _, _ = run_update(tiny, batch, plain_cfg)
    for name, g in masked[0].items():
        assert torch.allclose(g, want[0][name], atol=1e-6), name
    assert any(not torch.allclose(g, plain[0][name], atol=1e-6) for name, g in masked[0].items())
    assert stats["is_masked_fraction"] == pytest.approx(0.25)  # 4 of the 16 action tokens, in a micro-batch of 2
    assert stats["is_weight_mean"] == pytest.approx(0.75)


def test_mismatch_diagnostics_are_reported_with_and_without_the_recompute_pass(tiny):
    """Engine log-probs 0.25 above the trainer's on every action token: log rho = -0.25, so k3 = e^-0.25 - 1 + 0.25
    = 0.02880, chi2 = e^-0.5 - 1 = -0.39347, and the engine's perplexity is the trainer's x e^-0.25."""
    traj = make_traj([1.0, 0.0], [0, 0])
    tiny.eval()
    truth = sequence_logprobs(tiny, traj.input_ids, traj.attention_mask, temperature=1.0)[0]
    traj.logprobs = torch.where(traj.action_mask, truth + 0.25, torch.zeros_like(truth))
    trainer_ppl = math.exp(-A.masked_mean(truth, traj.action_mask).item())
    want = {"mismatch_kl": math.exp(-0.25) - 0.75, "mismatch_chi2": math.exp(-0.5) - 1,
            "mismatch_trainer_ppl": trainer_ppl, "mismatch_engine_ppl": trainer_ppl * math.exp(-0.25)}
    _, stats = prepare_batch(RLConfig(algorithm="grpo", ppo_epochs=2), traj, tiny, None, None, temperature=1.0,
                             top_p=1.0)
    single = RLConfig(algorithm="grpo", micro_batch_size=2)  # one micro-batch: its perplexities are the batch's
    batch, none = prepare_batch(single, traj, tiny, None, None, temperature=1.0, top_p=1.0)
    _, _, upd = run_update(tiny, batch, single)
    assert none == {}
    for name, value in want.items():
        assert stats[name] == pytest.approx(value, rel=1e-4), name
        assert upd[name] == pytest.approx(value, rel=1e-4), name
    batch, stats = prepare_batch(RLConfig(algorithm="grpo", ppo_epochs=2), traj, tiny, None, None, temperature=1.0,
                                 top_p=0.9)
    assert not any(k.startswith("mismatch_") for k in stats)  # nucleus log-probs are not the trainer's distribution


def test_kl_clamp_reaches_the_rewards_and_the_kl_loss(tiny):
    """A reference that puts nearly all its mass elsewhere (its head x 200): k3 per token far above 10 unclamped."""
    import copy

    ref = copy.deepcopy(tiny)
    with torch.no_grad():
        ref.lm_head.weight.mul_(200.0)
    traj = make_traj([1.0, 0.0], [0, 0])
    unclamped = RLConfig(algorithm="reinforce_pp", kl_coef=0.1, kl_clamp=None)
    _, stats = prepare_batch(unclamped, traj, tiny, ref, None, temperature=1.0, top_p=1.0)
    assert stats["kl"] > 10.0
    _, stats = prepare_batch(RLConfig(algorithm="reinforce_pp", kl_coef=0.1), traj, tiny, ref, None, temperature=1.0,
                             top_p=1.0)
    assert 0.0 < stats["kl"] <= 10.0
    for kl_clamp, in_range in ((None, lambda kl: kl > 10.0), (10.0, lambda kl: 0.0 < kl <= 10.0)):
        as_loss = RLConfig(algorithm="grpo", kl_coef=0.1, use_kl_loss=True, kl_clamp=kl_clamp)
        batch, _ = prepare_batch(as_loss, traj, tiny, ref, None, temperature=1.0, top_p=1.0)
        _, _, upd = run_update(tiny, batch, as_loss)
        assert in_range(upd["kl_loss"]), (kl_clamp, upd["kl_loss"])
