"""The RL step as plain functions (zerotir.rl.update) and the run guards (zerotir.rl.guards), on a tiny random model."""

from __future__ import annotations

import math

import pytest
import torch

from tests.rl.update_world import ROW_MASK, grads, make_traj, prepared, run_update
from zerotir.rl import algorithms as A
from zerotir.rl.estimators import ESTIMATORS
from zerotir.rl.guards import NonFiniteLossError, SandboxErrorGuard, SandboxFailureError
from zerotir.rl.micro_batches import aligned, iter_rows
from zerotir.rl.update import (
    RLConfig,
    TrainBatch,
    compute_advantages,
    forward_in_chunks,
    micro_batch_loss,
    prepare_batch,
    sequence_logprobs,
)
from zerotir.types import Trajectories


def test_sequence_logprobs_are_aligned_with_input_ids(tiny):
    traj = make_traj([1.0, 0.0], [0, 0])
    logp, entropy = sequence_logprobs(tiny, traj.input_ids, traj.attention_mask, temperature=1.0, with_entropy=True)
    logits = tiny(input_ids=traj.input_ids, attention_mask=traj.attention_mask).logits
    # Token t is scored by the logits at t - 1; position 0 is a prompt token and gets 0.
    expected = torch.log_softmax(logits[1, 4], -1)[traj.input_ids[1, 5]]
    assert logp[1, 5].item() == pytest.approx(expected.item(), abs=1e-5)
    assert logp[:, 0].abs().sum() == 0 and entropy[:, 0].abs().sum() == 0
    assert entropy[0, 3].item() == pytest.approx(A.entropy_from_logits(logits[0, 2]).item(), abs=1e-5)


def test_chunked_forward_matches_a_full_forward(tiny):
    traj = make_traj([1.0, 0.0, 1.0], [0, 0, 1])
    traj.attention_mask[2, 6:] = 0  # a shorter row: its chunk is trimmed to 6 columns
    fn = lambda i, m: sequence_logprobs(tiny, i, m, temperature=1.0)[0]
    full = fn(traj.input_ids, traj.attention_mask)
    chunked = forward_in_chunks(fn, traj.input_ids, traj.attention_mask, iter_rows(3, 2), total_chunks=2)
    assert torch.allclose(chunked[:2, :9], full[:2, :9], atol=1e-5)  # padding columns are cut, left 0
    assert torch.allclose(chunked[2, :6], full[2, :6], atol=1e-5) and chunked[2, 6:].abs().sum() == 0
    padded = forward_in_chunks(fn, traj.input_ids, traj.attention_mask, iter_rows(3, 2), total_chunks=4)
    assert torch.equal(padded, chunked)  # another rank's larger count: extra passes that write nothing


def test_aligned_pads_to_the_given_count_and_runs_no_collective(monkeypatch):
    # The count over the ranks is the caller's (an explicit global_max): aligned itself is pure.
    import zerotir.rl.update as U

    monkeypatch.setattr(U, "global_max", lambda value: pytest.fail("aligned ran a collective"))
    assert len(iter_rows(5, 2)) == 3 and iter_rows(0, 2) == []
    chunks = aligned(iter_rows(5, 2), total=4)
    assert [(r.tolist(), pad) for r, pad in chunks] == [([0, 1], False), ([2, 3], False), ([4], False), ([0], True)]
    assert [pad for _, pad in aligned(iter_rows(0, 2), total=1)] == [True]  # a rank with no rows joins the pass
    with pytest.raises(ValueError, match="total=2 is below this rank's 3 micro-batches"):
        aligned(iter_rows(5, 2), total=2)


def test_grpo_advantages_by_hand():
    traj = make_traj([1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1])
    adv, returns = compute_advantages(RLConfig(algorithm="grpo"), traj, traj.action_mask, None, None)
    # Group 0: mean 0.5, unbiased std sqrt(0.5) -> +-0.5 / 0.7071 = +-0.7071; group 1 is all right -> 0.
    s = 0.5 / math.sqrt(0.5)
    assert returns is None
    assert torch.allclose(adv[0], torch.tensor(ROW_MASK) * s, atol=1e-4)
    assert torch.allclose(adv[1], -torch.tensor(ROW_MASK) * s, atol=1e-4)
    assert adv[2:].abs().sum() == 0


def test_reinforce_pp_kl_goes_into_reward_unless_it_is_a_loss():
    traj = make_traj([1.0, 0.0], [0, 1])
    kl = torch.tensor([ROW_MASK, ROW_MASK], dtype=torch.float32) * 0.5
    mask = traj.action_mask
    shaped, _ = compute_advantages(RLConfig(kl_coef=0.1), traj, mask, kl, None)
    # Returns with gamma 1: row 0 = 1 - 0.05 * (actions from t on) -> [0.8, 0.85, 0.9, 0.95]; row 1 = -[0.2 .. 0.05].
    returns = torch.tensor([[0.8, 0.85, 0.9, 0.95], [-0.2, -0.15, -0.1, -0.05]])
    full = torch.zeros(2, 10)
    full[:, [3, 4, 7, 8]] = returns
    assert torch.allclose(shaped, A.masked_whiten(full, mask), atol=1e-5)
    as_loss, _ = compute_advantages(RLConfig(kl_coef=0.1, use_kl_loss=True), traj, mask, kl, None)
    plain = torch.zeros(2, 10)
    plain[0, [3, 4, 7, 8]] = 1.0
    assert torch.allclose(as_loss, A.masked_whiten(plain, mask), atol=1e-5)


def test_ppo_advantages_use_gae_over_action_tokens_only():
    traj = make_traj([1.0], [0])
    values = torch.zeros(1, 10)
    values[0, [3, 4, 7, 8]] = torch.tensor([0.5, 0.5, 0.5, 0.5])
    cfg = RLConfig(algorithm="ppo", gae_lambda=1.0, whiten_ppo_advantages=False)
    adv, returns = compute_advantages(cfg, traj, traj.action_mask, None, values)
    # lambda = gamma = 1: A_t = R - V_t = 0.5 on every action token; returns = 1; injected tokens get 0.
    assert torch.allclose(adv[0], torch.tensor(ROW_MASK) * 0.5)
    assert torch.allclose(returns[0], torch.tensor(ROW_MASK, dtype=torch.float32))


@pytest.mark.parametrize("algo", ["reinforce_pp", "reinforce_baseline", "rloo", "grpo", "ppo"])
@pytest.mark.parametrize("use_kl_loss", [False, True])
def test_compute_advantages_is_the_registry_estimator_with_the_kl_only_when_it_is_in_the_reward(algo, use_kl_loss):
    traj = make_traj([1.0, 0.0, 0.0, 1.0, 1.0], [0, 0, 0, 1, 1])
    mask = traj.action_mask
    kl = torch.tensor([ROW_MASK] * 5, dtype=torch.float32) * torch.tensor([[0.3], [0.1], [0.2], [0.4], [0.0]])
    values = torch.tensor([ROW_MASK] * 5, dtype=torch.float32) * 0.25
    grpo_kl = {"grpo_kl_in_reward": True} if algo == "grpo" and not use_kl_loss else {}
    cfg = RLConfig(algorithm=algo, kl_coef=0.1, use_kl_loss=use_kl_loss, **grpo_kl)
    adv, targets = compute_advantages(cfg, traj, mask, kl, values)
    estimator = ESTIMATORS[algo]
    expected, expected_targets = estimator(traj.rewards, traj.group_ids, mask, None if use_kl_loss else kl, values,
                                           cfg)
    assert torch.equal(adv, expected)
    assert (targets is None) == (algo != "ppo") and (targets is None or torch.equal(targets, expected_targets))
    # the KL changes the advantages exactly when it is folded into the rewards
    without_kl, _ = estimator(traj.rewards, traj.group_ids, mask, None, values, cfg)
    assert torch.equal(adv, without_kl) == use_kl_loss


def test_rloo_advantages_by_hand():
    traj = make_traj([1.0, 0.0, 0.0, 1.0, 1.0], [0, 0, 0, 1, 1])
    # group 0 = [1, 0, 0] -> 1 - 0 = 1, 0 - 0.5 = -0.5; group 1 all right -> 0
    adv, returns = compute_advantages(RLConfig(algorithm="rloo"), traj, traj.action_mask, None, None)
    assert returns is None
    row = torch.tensor(ROW_MASK, dtype=torch.float32)
    assert torch.allclose(adv, torch.stack([row, -0.5 * row, -0.5 * row, 0 * row, 0 * row]))


def test_grpo_kl_in_reward_is_summed_before_the_group_baseline():
    traj = make_traj([1.0, 1.0], [0, 0])
    kl = torch.zeros(2, 10)
    kl[0, [3, 4, 7, 8]] = 0.5  # row 0 drifted from the reference: summed KL 2
    cfg = RLConfig(algorithm="grpo", kl_coef=0.1, grpo_kl_in_reward=True, grpo_scale_by_std=False)
    adv, _ = compute_advantages(cfg, traj, traj.action_mask, kl, None)
    # rewards 1 - 0.1 * 2 = 0.8 and 1: group mean 0.9 -> -0.1 and +0.1 on every action token
    row = torch.tensor(ROW_MASK, dtype=torch.float32)
    assert torch.allclose(adv, torch.stack([-0.1 * row, 0.1 * row]), atol=1e-6)
    as_loss = RLConfig(algorithm="grpo", kl_coef=0.1, use_kl_loss=True, grpo_scale_by_std=False)
    assert compute_advantages(as_loss, traj, traj.action_mask, kl, None)[0].abs().sum() == 0  # all right: 0


def test_ppo_gae_restart_at_injected_tokens_through_the_config():
    traj = make_traj([1.0], [0])
    values = torch.zeros(1, 10)
    values[0, [3, 4, 7, 8]] = 0.5
    cfg = RLConfig(algorithm="ppo", whiten_ppo_advantages=False, gae_injected="restart")
    adv, returns = compute_advantages(cfg, traj, traj.action_mask, None, values)
    # gamma = lambda = 1: the turn before the tool output (3, 4) ends at V = 0 with no reward: A = -V = -0.5,
    # target 0; the last turn (7, 8) sees the reward 1: A = 0.5, target 1.
    assert torch.allclose(adv[0, [3, 4, 7, 8]], torch.tensor([-0.5, -0.5, 0.5, 0.5]))
    assert torch.allclose(returns[0, [3, 4, 7, 8]], torch.tensor([0.0, 0.0, 1.0, 1.0]))




def test_accumulated_gradient_is_the_token_mean_over_the_batch_whatever_the_micro_batch(tiny):
    traj = make_traj([1.0, 0.0, 1.0, 0.0], [0, 0, 1, 1])
    traj.action_mask[0, 7:9] = False  # rows with different action counts make the weighting matter
    base = RLConfig(algorithm="grpo", micro_batch_size=4)
    batch = prepared(tiny, traj, base)
    whole, calls, _ = run_update(tiny, batch, base)
    pieces, _, _ = run_update(tiny, batch, RLConfig(algorithm="grpo", micro_batch_size=1))
    assert calls == [True]
    for name, g in whole[0].items():
        assert torch.allclose(g, pieces[0][name], atol=1e-6), name


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_sequence_mean_modes_are_independent_of_the_micro_batch_too(tiny, mode):
    traj = make_traj([1.0, 0.0, 1.0, 0.0], [0, 0, 1, 1])
    traj.action_mask[0, 4:9] = False  # row 0 has one action token, the others four
    cfg = RLConfig(algorithm="grpo", micro_batch_size=4, loss_agg_mode=mode)
    batch = prepared(tiny, traj, cfg)
    whole, _, _ = run_update(tiny, batch, cfg, max_response_tokens=6)  # the response budget, model.sampling's
    pieces, _, _ = run_update(tiny, batch, RLConfig(algorithm="grpo", micro_batch_size=1, loss_agg_mode=mode),
                               max_response_tokens=6)
    token_mean, _, _ = run_update(tiny, batch, RLConfig(algorithm="grpo", micro_batch_size=4))
    for name, g in whole[0].items():
        assert torch.allclose(g, pieces[0][name], atol=1e-6), name
    assert any(not torch.allclose(g, token_mean[0][name], atol=1e-6) for name, g in whole[0].items())


def test_injected_tokens_do_not_reach_the_gradient(tiny):
    cfg = RLConfig(algorithm="grpo", ppo_epochs=2)  # two epochs: the old log-probs are a separate tensor
    traj = make_traj([1.0, 0.0], [0, 0])
    batch = prepared(tiny, traj, cfg)
    ref, _, _ = run_update(tiny, batch, cfg)
    # Garbage in old log-probs and advantages at prompt / injected positions changes nothing.
    off = ~batch.action_mask
    batch.old_logp = torch.where(off, torch.full_like(batch.old_logp, -50.0), batch.old_logp)
    batch.advantages = torch.where(off, torch.full_like(batch.advantages, 99.0), batch.advantages)
    other, _, _ = run_update(tiny, batch, cfg)
    for name, g in ref[0].items():
        assert torch.allclose(g, other[0][name], atol=1e-7), name


class TinyCritic(torch.nn.Module):
    """A critic with the ``critic(input_ids, attention_mask) -> (B, T)`` interface of ``zerotir.models.ValueModel``."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(260, 8)
        self.head = torch.nn.Linear(8, 1)

    def forward(self, input_ids, attention_mask):
        return self.head(torch.tanh(self.embed(input_ids))).squeeze(-1)


def test_ppo_value_loss_ignores_prompt_and_injected_positions(tiny):
    # The training step's value loss must be a mean over the ACTION tokens (3, 4, 7, 8 of ROW_MASK): garbage critic
    # targets at prompt (0..2), injected (5, 6) and padding (9) positions change neither the loss nor any gradient.
    torch.manual_seed(1)
    critic = TinyCritic()
    cfg = RLConfig(algorithm="ppo", value_clip=0.2, ppo_epochs=2)
    tiny.eval()
    batch, _ = prepare_batch(cfg, make_traj([1.0, 0.0], [0, 0]), tiny, None, critic, temperature=1.0, top_p=1.0)

    def value_loss_and_grads(b):
        tiny.zero_grad(set_to_none=True)
        critic.zero_grad(set_to_none=True)
        loss, stats = micro_batch_loss(cfg, b, tiny, critic, temperature=1.0)
        loss.backward()
        return float(stats["value_loss"]), float(loss), grads(critic), grads(tiny)

    ref = value_loss_and_grads(batch)
    off = ~batch.action_mask
    batch.old_values = torch.where(off, torch.full_like(batch.old_values, 77.0), batch.old_values)
    batch.returns = torch.where(off, torch.full_like(batch.returns, -55.0), batch.returns)
    other = value_loss_and_grads(batch)
    assert ref[0] > 0 and other[0] == pytest.approx(ref[0], abs=1e-7) and other[1] == pytest.approx(ref[1], abs=1e-7)
    assert ref[2].keys() == other[2].keys() == {"embed.weight", "head.weight", "head.bias"}
    for grads_ref, grads_other in ((ref[2], other[2]), (ref[3], other[3])):
        for name, g in grads_ref.items():
            assert torch.allclose(g, grads_other[name], atol=1e-7), name


def test_optimizer_step_count_is_epochs_times_mini_batches(tiny):
    cfg = RLConfig(algorithm="grpo", ppo_epochs=2, num_mini_batches=3)
    assert cfg.optimizer_steps_per_rl_step == 6
    batch = prepared(tiny, make_traj([1.0, 0.0], [0, 0]), cfg)
    _, calls, stats = run_update(tiny, batch, cfg)
    # Two rows in three mini-batches: one of them is empty in each epoch and makes a no-op step.
    assert len(calls) == 6 and calls.count(False) == 2
    assert stats["grad_norm"] == 1.0 and 0.0 <= stats["clip_fraction"] <= 1.0


def test_engine_logprob_diff_is_reported_with_and_without_the_recompute_pass(tiny):
    traj = make_traj([1.0, 0.0], [0, 0])
    tiny.eval()
    truth = sequence_logprobs(tiny, traj.input_ids, traj.attention_mask, temperature=1.0)[0]
    traj.logprobs = torch.where(traj.action_mask, truth + 0.25, torch.zeros_like(truth))
    two_epochs = RLConfig(algorithm="grpo", ppo_epochs=2)
    batch, stats = prepare_batch(two_epochs, traj, tiny, None, None, temperature=1.0, top_p=1.0)
    assert not two_epochs.single_pass and batch.old_logp is not None
    assert stats["engine_logprob_diff"] == pytest.approx(0.25, abs=1e-4)
    assert "kl" not in stats and batch.ref_logp is None  # kl_coef 0: no reference forward
    single = RLConfig(algorithm="grpo")
    batch, stats = prepare_batch(single, traj, tiny, None, None, temperature=1.0, top_p=1.0)
    assert single.single_pass and batch.old_logp is None and stats == {}
    _, _, upd = run_update(tiny, batch, single)
    assert upd["engine_logprob_diff"] == pytest.approx(0.25, abs=1e-4) and upd["clip_fraction"] == 0.0


def test_single_pass_gradient_equals_the_recomputed_old_logprobs_one(tiny):
    cfg = RLConfig(algorithm="reinforce_pp")
    traj = make_traj([1.0, 0.0, 0.0], [0, 0, 1])
    batch = prepared(tiny, traj, cfg)
    assert batch.old_logp is None
    fast, _, _ = run_update(tiny, batch, cfg)
    tiny.eval()
    batch.old_logp = sequence_logprobs(tiny, traj.input_ids, traj.attention_mask, temperature=1.0)[0].detach()
    slow, _, _ = run_update(tiny, batch, cfg)
    for name, g in fast[0].items():
        assert torch.allclose(g, slow[0][name], atol=1e-6), name


def test_kl_in_the_reward_needs_the_recompute_pass():
    assert not RLConfig(algorithm="reinforce_pp", kl_coef=0.01).single_pass
    assert RLConfig(algorithm="reinforce_pp", kl_coef=0.01, use_kl_loss=True).single_pass
    assert RLConfig(algorithm="grpo", kl_coef=0.01, use_kl_loss=True).single_pass
    assert not RLConfig(algorithm="grpo", kl_coef=0.01, grpo_kl_in_reward=True).single_pass
    assert not RLConfig(algorithm="rloo", kl_coef=0.01).single_pass
    assert not RLConfig(num_mini_batches=2).single_pass


def test_kl_against_reference_is_computed_and_kept_for_the_loss(tiny):
    cfg = RLConfig(algorithm="reinforce_pp", kl_coef=0.1, kl_estimator="k1")
    traj = make_traj([1.0, 0.0], [0, 0])
    # reference == actor: KL 0, folded into the reward
    batch, stats = prepare_batch(cfg, traj, tiny, tiny, None, temperature=1.0, top_p=1.0)
    assert stats["kl"] == pytest.approx(0.0, abs=1e-6) and batch.ref_logp is None
    as_loss = RLConfig(algorithm="grpo", kl_coef=0.1, use_kl_loss=True, kl_estimator="k1")
    batch, stats = prepare_batch(as_loss, traj, tiny, tiny, None, temperature=1.0, top_p=1.0)
    assert batch.ref_logp is not None and "kl" not in stats  # measured in the update's forward pass
    _, _, upd = run_update(tiny, batch, as_loss)
    assert upd["kl"] == pytest.approx(0.0, abs=1e-5) and upd["kl_loss"] == upd["kl"]


def test_nan_loss_stops_naming_step_and_batch(tiny):
    cfg = RLConfig(algorithm="grpo")
    batch = prepared(tiny, make_traj([1.0, 0.0], [0, 0]), cfg)
    batch.advantages[0, 3] = float("nan")
    with pytest.raises(NonFiniteLossError, match=r"RL step 3: the loss is nan.*2 trajectories.*advantages"):
        run_update(tiny, batch, cfg)


def test_train_batch_select_trims_padding():
    t = torch.zeros(2, 6)
    attn = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0]])
    b = TrainBatch(t.long(), attn, t.bool(), t, t)
    assert b.select(torch.tensor([0])).input_ids.shape == (1, 3)
    assert b.select(torch.tensor([0, 1])).attention_mask.shape == (2, 4)


def _with_errors(calls: int, errors: int) -> Trajectories:
    traj = make_traj([0.0], [0])
    traj.num_calls = torch.tensor([calls])
    traj.num_sandbox_errors = torch.tensor([errors])
    return traj


def test_sandbox_guard_stops_after_patience_consecutive_bad_steps():
    guard, urls = SandboxErrorGuard(max_rate=0.5, patience=2), ["http://127.0.0.1:9"]
    assert guard.update(_with_errors(4, 4), 1, urls) == 1.0
    assert guard.update(_with_errors(0, 0), 2, urls) is None  # nothing executed: says nothing, keeps the count
    assert guard.bad_steps == 1
    guard.update(_with_errors(4, 1), 3, urls)  # a good step resets
    assert guard.bad_steps == 0
    guard.update(_with_errors(2, 2), 4, urls)
    with pytest.raises(SandboxFailureError, match=r"RL step 5.*http://127.0.0.1:9.*python -m sandbox serve"):
        guard.update(_with_errors(3, 3), 5, urls)
    restored = SandboxErrorGuard(0.5, 2)
    restored.load_state_dict({"bad_steps": 1})
    assert restored.bad_steps == 1
