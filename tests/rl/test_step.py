"""``rl_step`` on plain torch: rollout in, ``StepResult`` out, the keep decision applied, the skip path, the step count."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.rl.update_world import make_traj
from zerotir.config import RLConfig
from zerotir.rl import algorithms as A
from zerotir.rl.step import FilterDecision, Models, StepOptimizer, rl_step
from zerotir.rl.update import prepare_batch
from zerotir.rollout.engine import SamplingParams, generate
from zerotir.rollout.hf_engine import HFEngine
from zerotir.toy.tiny_model import build_tiny_model
from zerotir.toy.tokenizer import build_byte_tokenizer
from zerotir.types import Trajectories

SAMPLING = dict(temperature=1.0, top_p=1.0)  # model.sampling's defaults


def tiny_actor():
    return build_tiny_model(build_byte_tokenizer(), hidden_size=32, num_layers=2, num_heads=2, seed=0)


class Recording:
    """An SGD optimizer behind the two callables the step takes; records every call."""

    def __init__(self, model: torch.nn.Module):
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)
        self.calls: list[bool] = []
        self.backwards = 0

    def backward(self, loss: torch.Tensor) -> None:
        self.backwards += 1
        loss.backward()

    def step(self, has_grad: bool) -> float:
        self.calls.append(has_grad)
        if has_grad:
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return 1.0

    @property
    def callables(self) -> StepOptimizer:
        return StepOptimizer(self.backward, self.step)


def test_the_step_trains_on_the_kept_rows_and_reports_them():
    actor = tiny_actor()
    before = copy.deepcopy(actor.state_dict())
    rollout = make_traj([1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1])
    keep = torch.tensor([True, True, False, False])  # group 1 is all right: dropped
    decision = FilterDecision(keep, kept_groups=1, groups=2)
    opt = Recording(actor)
    result = rl_step(RLConfig(algorithm="grpo", micro_batch_size=1, ppo_epochs=2), rollout, decision,
                     Models(actor), opt.callables, step=3, seed=0, **SAMPLING)
    assert result.rl_step == 3 and result.rollout is rollout and result.filter is decision
    assert result.kept.tolist() == [True, True, False, False] and not result.skipped
    assert opt.calls == [True, True]  # ppo_epochs x num_mini_batches optimizer steps
    assert opt.backwards == 4  # 2 kept rows x 2 epochs, one micro-batch each
    assert {"policy_loss", "entropy", "grad_norm"} <= set(result.stats) and "policy_loss" in result.losses
    assert any(not torch.equal(before[k], v) for k, v in actor.state_dict().items())


def test_nothing_kept_makes_the_same_number_of_no_op_steps():
    actor = tiny_actor()
    before = copy.deepcopy(actor.state_dict())
    rollout = make_traj([1.0, 1.0], [0, 0])
    decision = FilterDecision(torch.zeros(2, dtype=torch.bool), kept_groups=0, groups=1, skipped=True)
    opt = Recording(actor)
    result = rl_step(RLConfig(ppo_epochs=2, num_mini_batches=2), rollout, decision, Models(actor), opt.callables,
                     step=1, seed=0, **SAMPLING)
    assert result.skipped and result.stats == {} and not result.kept.any()
    assert opt.calls == [False] * 4 and opt.backwards == 0
    assert all(torch.equal(before[k], v) for k, v in actor.state_dict().items())


def test_without_a_filter_every_row_trains():
    actor = tiny_actor()
    opt = Recording(actor)
    result = rl_step(RLConfig(micro_batch_size=8), make_traj([1.0, 0.0], [0, 0]), None, Models(actor),
                     opt.callables, step=1, seed=0, **SAMPLING)
    assert result.filter is None and result.kept.all() and opt.calls == [True]


def test_the_response_budget_reaches_the_dr_grpo_loss_as_its_divisor():
    # seq-mean-token-sum-norm divides each row's token sum by max_response_tokens (model.sampling's, which the
    # module passes): one SGD step's parameter change at a budget of 4 is twice the change at a budget of 8.
    cfg = RLConfig(algorithm="grpo", loss_agg_mode="seq-mean-token-sum-norm")
    rollout = make_traj([1.0, 0.0], [0, 0])
    start = tiny_actor()
    with pytest.raises(ValueError, match="needs max_response_tokens"):
        rl_step(cfg, rollout, None, Models(copy.deepcopy(start)), Recording(start).callables, step=1, seed=0,
                **SAMPLING)
    deltas = []
    for budget in (4, 8):
        actor = copy.deepcopy(start)
        rl_step(cfg, rollout, None, Models(actor), Recording(actor).callables, step=1, seed=0,
                max_response_tokens=budget, **SAMPLING)
        deltas.append({k: v - start.state_dict()[k] for k, v in actor.state_dict().items()})
    assert max(d.abs().max() for d in deltas[1].values()) > 1e-3  # the step moved the weights
    for k, d in deltas[0].items():
        torch.testing.assert_close(d, 2 * deltas[1][k], atol=1e-6, rtol=1e-4)  # float32 rounding of w + delta


# ----- the sampling temperature: the trainer scores the engine's samples under the engine's distribution -----

def engine_rollout(actor: torch.nn.Module, temperature: float, top_p: float = 1.0) -> Trajectories:
    """Samples of the transformers engine (``HFEngine``) at ``temperature`` / ``top_p`` in the ``Trajectories`` layout:
    prompt, then the sampled tokens (all actions) with the engine's log-probs, right-padded."""
    tok = build_byte_tokenizer()
    prompts = [tok.encode(text) for text in ("What is 2+3?", "Hello")]
    params = SamplingParams(n=2, temperature=temperature, top_p=top_p, max_new_tokens=12, seed=0)
    rows = [(p, s) for p, samples in zip(prompts, generate(HFEngine(actor, tok), prompts, params)) for s in samples]
    width, b = max(len(p) + len(s.token_ids) for p, s in rows), len(rows)
    ids, attn = torch.zeros(b, width, dtype=torch.long), torch.zeros(b, width, dtype=torch.long)
    action, logprobs = torch.zeros(b, width, dtype=torch.bool), torch.zeros(b, width)
    for i, (p, s) in enumerate(rows):
        end = len(p) + len(s.token_ids)
        ids[i, :end] = torch.tensor(p + s.token_ids)
        attn[i, :end] = 1
        action[i, len(p):end] = True
        logprobs[i, len(p):end] = torch.tensor(s.logprobs)
    zeros = torch.zeros(b, dtype=torch.long)
    return Trajectories(
        input_ids=ids, attention_mask=attn, action_mask=action, logprobs=logprobs, prompt_lens=zeros,
        response_lens=zeros, group_ids=torch.tensor([0, 0, 1, 1]), rewards=torch.tensor([1.0, 0.0, 0.0, 1.0]),
        num_calls=zeros, num_exec_errors=zeros, num_timeouts=zeros, num_sandbox_errors=zeros,
        truncated=zeros.bool(), finish_reasons=["stop"] * b, response_texts=["x"] * b, ground_truths=["1"] * b)


def test_the_trainer_scores_engine_samples_at_the_sampling_temperature():
    """At T = 0.7 the old log-probs and the update's log-probs equal the engine's (same distribution), the reference
    pass uses the same temperature (reference == actor: KL 0), and the entropy is the tempered distribution's."""
    actor = tiny_actor().eval()
    traj = engine_rollout(actor, 0.7)
    mask = traj.action_mask
    cfg = RLConfig(kl_coef=0.1, kl_estimator="k1")  # KL in the rewards: a separate old log-prob pass
    batch, stats = prepare_batch(cfg, traj, actor, copy.deepcopy(actor), None, temperature=0.7, top_p=1.0)
    assert (batch.old_logp - traj.logprobs)[mask].abs().max() < 1e-5
    assert stats["engine_logprob_diff"] < 1e-5 and abs(stats["kl"]) < 1e-6
    with torch.no_grad():
        logits = actor(input_ids=traj.input_ids, attention_mask=traj.attention_mask).logits[:, :-1] / 0.7
    entropy = torch.nn.functional.pad(A.entropy_from_logits(logits), (1, 0))
    single = RLConfig(kl_coef=0.1, use_kl_loss=True, kl_estimator="k1")  # one pass: measured in the update
    result = rl_step(single, traj, None, Models(actor, reference=copy.deepcopy(actor)), Recording(actor).callables,
                     step=1, seed=0, temperature=0.7, top_p=1.0)
    assert result.stats["engine_logprob_diff"] < 1e-5 and abs(result.stats["kl"]) < 1e-6
    assert result.stats["entropy"] == pytest.approx(A.masked_mean(entropy, mask).item(), abs=1e-5)


def test_nucleus_sampling_keeps_the_engine_log_probs_out_of_the_update():
    """With top_p < 1 the engine's log-probs are of the renormalised nucleus: no engine_logprob_diff (it would
    measure the truncation), and a correction that needs them fails naming the fields."""
    actor = tiny_actor().eval()
    traj = engine_rollout(actor, 0.7, top_p=0.9)
    batch, stats = prepare_batch(RLConfig(ppo_epochs=2), traj, actor, None, None, temperature=0.7, top_p=0.9)
    assert batch.engine_logp is None and "engine_logprob_diff" not in stats
    result = rl_step(RLConfig(), traj, None, Models(actor), Recording(actor).callables, step=1, seed=0,
                     temperature=0.7, top_p=0.9)
    assert "engine_logprob_diff" not in result.stats and "policy_loss" in result.stats
    with pytest.raises(ValueError, match=r"off_policy_correction='tis'.*model.sampling.top_p < 1"):
        rl_step(RLConfig(off_policy_correction="tis"), traj, None, Models(actor), Recording(actor).callables, step=1,
                seed=0, temperature=0.7, top_p=0.9)


def test_a_greedy_training_temperature_is_refused_naming_the_field():
    actor = tiny_actor()
    with pytest.raises(ValueError, match=r"model.sampling.temperature=0.0: training needs a sampling temperature"):
        rl_step(RLConfig(), make_traj([1.0, 0.0], [0, 0]), None, Models(actor), Recording(actor).callables, step=1,
                seed=0, temperature=0.0, top_p=1.0)
