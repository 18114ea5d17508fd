"""``rl_step`` with the decision of ``model.filters``: removed rows leave the group baseline, the soft overlong
penalty shapes the trained rewards only, and the high-perplexity rule reuses the step's one reference pass."""

from __future__ import annotations

import copy

import pytest
import torch

import zerotir.rl.step as step_module
from tests.rl.test_step import SAMPLING, Recording, tiny_actor
from tests.rl.update_world import make_traj
from zerotir.config import RLConfig
from zerotir.rl.perplexity import reference_logprobs, sequence_perplexity
from zerotir.rl.step import PERPLEXITY, FilterDecision, Models, rl_step

GRPO = RLConfig(algorithm="grpo", micro_batch_size=8)


@pytest.fixture
def seen(monkeypatch):
    """What ``rl_step`` hands to ``prepare_batch``: the trajectories, the keyword arguments and the batch back."""
    record = {}
    real = step_module.prepare_batch

    def wrapper(cfg, traj, *args, **kwargs):
        batch, stats = real(cfg, traj, *args, **kwargs)
        record.update(traj=traj, kwargs=kwargs, batch=batch)
        return batch, stats

    monkeypatch.setattr(step_module, "prepare_batch", wrapper)
    return record


def row_advantages(batch) -> list[float]:
    """One GRPO advantage per row (it is spread over the row's action tokens)."""
    return [float(batch.advantages[i][batch.action_mask[i]][0]) for i in range(len(batch))]


def test_a_removed_row_leaves_its_groups_baseline(seen):
    # One group, rewards [1, 0, 1, 0]; row 2 removed (say a shortcut). GRPO over the remaining [1, 0, 0]: mean 1/3,
    # std (Bessel) sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3) = 0.5774, so the advantages are
    # (1 - 1/3) / 0.5774 = 1.1547 and (0 - 1/3) / 0.5774 = -0.5774. Kept in the baseline, row 2 would make them
    # +-0.5 / 0.5774 = +-0.866.
    actor = tiny_actor()
    rollout = make_traj([1.0, 0.0, 1.0, 0.0], [0, 0, 0, 0])
    removed = {"shortcut": torch.tensor([False, False, True, False])}
    decision = FilterDecision(torch.tensor([True, True, False, True]), 1, 1, removed=removed)
    result = rl_step(GRPO, rollout, decision, Models(actor), Recording(actor).callables, step=1, seed=0, **SAMPLING)
    assert row_advantages(seen["batch"]) == pytest.approx([1.1547, -0.57735, -0.57735], abs=1e-4)
    assert result.kept.tolist() == [True, True, False, True] and result.filter.removed is removed


def test_the_soft_penalty_shapes_the_trained_rewards_only(seen):
    # Shaping [0, -0.5, 0, -0.25] on the kept rows 0, 1, 3: rewards [1, -0.5, -0.25]. GRPO: mean 0.08333,
    # deviations 0.91667, -0.58333, -0.33333, std sqrt((0.84028 + 0.34028 + 0.11111) / 2) = 0.80364, advantages
    # 1.1406, -0.72587, -0.41478. The rollout keeps the raw rewards.
    actor = tiny_actor()
    rollout = make_traj([1.0, 0.0, 1.0, 0.0], [0, 0, 0, 0])
    decision = FilterDecision(torch.tensor([True, True, False, True]), 1, 1,
                              reward_shaping=torch.tensor([0.0, -0.5, 0.0, -0.25]))
    result = rl_step(GRPO, rollout, decision, Models(actor), Recording(actor).callables, step=1, seed=0, **SAMPLING)
    assert seen["traj"].rewards.tolist() == [1.0, -0.5, -0.25]
    assert row_advantages(seen["batch"]) == pytest.approx([1.1406, -0.72587, -0.41478], abs=1e-4)
    assert result.rollout.rewards.tolist() == [1.0, 0.0, 1.0, 0.0]


def counted(model: torch.nn.Module) -> list[int]:
    calls: list[int] = []
    model.register_forward_hook(lambda module, args, output: calls.append(1))
    return calls


def test_high_perplexity_rows_leave_the_update_in_the_one_reference_pass(seen):
    actor = tiny_actor()
    reference = copy.deepcopy(actor).eval()
    rollout = make_traj([1.0, 0.0, 1.0, 0.0], [0, 0, 1, 1], seed=3)
    cfg = RLConfig(algorithm="grpo", kl_coef=0.1, use_kl_loss=True, micro_batch_size=8)
    ppl = sequence_perplexity(reference_logprobs(cfg, rollout, reference, 1.0), rollout.action_mask)
    threshold = float(ppl.median())  # rows above the median go: here two of the four
    over = (ppl > threshold).tolist()
    assert sum(over) == 2
    calls = counted(reference)
    decision = FilterDecision(torch.ones(4, dtype=torch.bool), 2, 2, perplexity_threshold=threshold)
    result = rl_step(cfg, rollout, decision, Models(actor, reference=reference), Recording(actor).callables,
                     step=1, seed=0, **SAMPLING)
    assert result.filter.removed[PERPLEXITY].tolist() == over
    assert result.kept.tolist() == [not o for o in over] and len(seen["traj"]) == 2
    assert len(calls) == 1  # one micro-batch, one reference pass: prepare_batch reused its log-probs for the KL
    kept_rows = [i for i, o in enumerate(over) if not o]
    expected = reference_logprobs(cfg, rollout.select(kept_rows), reference, 1.0)
    assert torch.allclose(seen["kwargs"]["ref_logp"], expected, atol=1e-6)
    assert torch.allclose(seen["batch"].ref_logp, expected, atol=1e-6) and "kl_loss" in result.stats


def test_when_perplexity_removes_every_row_the_update_is_skipped():
    actor = tiny_actor()
    before = copy.deepcopy(actor.state_dict())
    rollout = make_traj([1.0, 0.0], [0, 0])
    decision = FilterDecision(torch.tensor([True, True]), 1, 1, perplexity_threshold=1.0001)  # a random model: >> 1
    opt = Recording(actor)
    result = rl_step(RLConfig(kl_coef=0.1, ppo_epochs=2), rollout, decision,
                     Models(actor, reference=copy.deepcopy(actor)), opt.callables, step=1, seed=0, **SAMPLING)
    assert result.skipped and not result.kept.any() and result.filter.removed[PERPLEXITY].all()
    assert opt.calls == [False, False] and opt.backwards == 0
    assert all(torch.equal(before[k], v) for k, v in actor.state_dict().items())


def test_the_perplexity_rule_without_a_reference_names_the_fix():
    actor = tiny_actor()
    decision = FilterDecision(torch.tensor([True, True]), 1, 1, perplexity_threshold=5.0)
    with pytest.raises(ValueError, match=r"model.filters.perplexity=true needs the reference model.*kl_coef > 0"):
        rl_step(RLConfig(), make_traj([1.0, 0.0], [0, 0]), decision, Models(actor), Recording(actor).callables,
                step=1, seed=0, **SAMPLING)


def test_refill_rounds_concatenate_their_decisions():
    first = FilterDecision(torch.tensor([True, False]), 1, 1, removed={"void_turn": torch.tensor([False, True])},
                           reward_shaping=torch.tensor([0.0, -1.0]))
    second = FilterDecision(torch.tensor([True, True]), 1, 1)  # no rule matched anything in this round
    merged = FilterDecision.cat([first, second], kept_groups=2, skipped=False)
    assert merged.keep.tolist() == [True, False, True, True] and (merged.kept_groups, merged.groups) == (2, 2)
    assert merged.removed["void_turn"].tolist() == [False, True, False, False]
    assert merged.reward_shaping.tolist() == [0.0, -1.0, 0.0, 0.0]
