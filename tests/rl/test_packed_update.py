"""Packed rows + token budget + chunked log-probs (model.rl.pack_rows, max_tokens_per_micro_batch,
logprob_chunk_tokens) train as today's padded path: the prepared batch, each optimizer step's loss and every
parameter's gradient (the critic's included) within 1e-5 in float32, for PPO, REINFORCE++ and GRPO and each loss
aggregation mode, on rows with masked tool-output spans."""

from __future__ import annotations

import pytest
import torch

from tests.rl.long_rows import long_rows, models, run_update, value_critic
from zerotir.config import RLConfig
from zerotir.rl.micro_batches import packed_bins, row_lengths

BUDGET = 24  # packed rows: 20 alone, 14 + 8, 11 + 6 + 5 (tests/rl/test_packing.py)
MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
ALGORITHMS = {  # each with the passes it needs: the critic (ppo), the reference in the reward or in the loss
    "ppo": dict(algorithm="ppo", entropy_coef=0.01),
    "reinforce_pp": dict(algorithm="reinforce_pp", kl_coef=0.05),
    "grpo": dict(algorithm="grpo", kl_coef=0.05, use_kl_loss=True, entropy_coef=0.01),
}
PACKED = dict(pack_rows=True, max_tokens_per_micro_batch=BUDGET, logprob_chunk_tokens=7)


@pytest.fixture(scope="module")
def nets():
    actor, ref, _ = models()
    return actor, ref, value_critic()


def cfg(algorithm: str, mode: str, **partition) -> RLConfig:
    # Two mini-batches: the old log-probs come from prepare_batch's passes, and each step bins its own rows.
    return RLConfig(**ALGORITHMS[algorithm], loss_agg_mode=mode, num_mini_batches=2, **partition)


def assert_same_update(want, got, real: torch.Tensor) -> None:
    """``run_update`` results ``got`` equal ``want``: batch fields on the real tokens, step losses, gradients."""
    for field in ("old_logp", "ref_logp", "old_values", "returns", "advantages"):
        a, b = getattr(want[0], field), getattr(got[0], field)
        assert (a is None) == (b is None), field
        assert a is None or torch.allclose(b[real], a[real], atol=1e-5, rtol=0), field
    assert got[1] == pytest.approx(want[1], abs=1e-5)
    for step, grads in enumerate(want[2]):
        assert grads.keys() == got[2][step].keys()
        for param, g in grads.items():
            assert torch.allclose(got[2][step][param], g, atol=1e-5, rtol=0), (step, param)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_packed_budget_chunked_update_is_the_padded_one(nets, algorithm, mode):
    actor, ref, critic = nets
    traj = long_rows()
    assert max(len(b) for b in packed_bins(row_lengths(traj.attention_mask), BUDGET)) == 3
    padded = run_update(cfg(algorithm, mode, micro_batch_size=len(traj)), traj, actor, ref, critic)
    assert len(padded[1]) == 2 and all(loss != 0 for loss in padded[1])
    if algorithm == "ppo":
        assert any(name.startswith("1.backbone.") for name in padded[2][0])  # the critic's backbone trains
    packed = run_update(cfg(algorithm, mode, **PACKED), traj, actor, ref, critic)
    assert_same_update(padded, packed, traj.attention_mask.bool())


def _record_rows(module: torch.nn.Module, seen: list[tuple[int, int]]):
    def hook(_module, args, kwargs):
        ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        seen.append(tuple(ids.shape))

    return module.register_forward_pre_hook(hook, with_kwargs=True)


def test_every_pass_runs_one_packed_row_per_bin(nets):
    actor, ref, critic = nets
    traj = long_rows()
    seen_actor, seen_critic = [], []
    hooks = [_record_rows(actor.get_decoder(), seen_actor), _record_rows(critic.backbone, seen_critic)]
    try:
        run_update(RLConfig(algorithm="ppo", ppo_epochs=2, **PACKED), traj, actor, ref, critic)
    finally:
        for h in hooks:
            h.remove()
    rows = sorted((1, int(row_lengths(traj.attention_mask)[b].sum())) for b in packed_bins(
        row_lengths(traj.attention_mask), BUDGET))
    assert rows == [(1, 20), (1, 22), (1, 22)]  # no padding: each bin's summed length
    assert sorted(seen_actor) == sorted(rows * 3)  # the old log-probs, then two epochs' update
    assert sorted(seen_critic) == sorted(rows * 3)  # the values, then two epochs' value loss
