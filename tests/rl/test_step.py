"""``rl_step`` on plain torch: rollout in, ``StepResult`` out, the keep decision applied, the skip path, the step count."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.rl.test_update import make_traj
from zerotir.config import RLConfig
from zerotir.rl.step import FilterDecision, Models, StepOptimizer, rl_step
from zerotir.toy.tiny_model import build_tiny_model
from zerotir.toy.tokenizer import build_byte_tokenizer


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
                     Models(actor), opt.callables, step=3, seed=0)
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
                     step=1, seed=0)
    assert result.skipped and result.stats == {} and not result.kept.any()
    assert opt.calls == [False] * 4 and opt.backwards == 0
    assert all(torch.equal(before[k], v) for k, v in actor.state_dict().items())


def test_without_a_filter_every_row_trains():
    actor = tiny_actor()
    opt = Recording(actor)
    result = rl_step(RLConfig(micro_batch_size=8), make_traj([1.0, 0.0], [0, 0]), None, Models(actor),
                     opt.callables, step=1, seed=0)
    assert result.filter is None and result.kept.all() and opt.calls == [True]


def test_the_response_budget_reaches_the_dr_grpo_loss_as_its_divisor():
    # seq-mean-token-sum-norm divides each row's token sum by norm_tokens (model.sampling.max_response_tokens, which
    # the module passes): one SGD step's parameter change at a budget of 4 is twice the change at a budget of 8.
    cfg = RLConfig(algorithm="grpo", loss_agg_mode="seq-mean-token-sum-norm")
    rollout = make_traj([1.0, 0.0], [0, 0])
    start = tiny_actor()
    with pytest.raises(ValueError, match="needs norm_tokens"):
        rl_step(cfg, rollout, None, Models(copy.deepcopy(start)), Recording(start).callables, step=1, seed=0)
    deltas = []
    for budget in (4, 8):
        actor = copy.deepcopy(start)
        rl_step(cfg, rollout, None, Models(actor), Recording(actor).callables, step=1, seed=0, norm_tokens=budget)
        deltas.append({k: v - start.state_dict()[k] for k, v in actor.state_dict().items()})
    assert max(d.abs().max() for d in deltas[1].values()) > 1e-3  # the step moved the weights
    for k, d in deltas[0].items():
        torch.testing.assert_close(d, 2 * deltas[1][k], atol=1e-6, rtol=1e-4)  # float32 rounding of w + delta
