"""The update under a token budget (model.rl.max_tokens_per_micro_batch), with and without chunked log-probs
(model.rl.logprob_chunk_tokens), is the same function of the batch as with micro_batch_size rows: the prepared
batch, each optimizer step's loss and every parameter's gradient, for each algorithm and loss aggregation mode."""

from __future__ import annotations

import pytest
import torch

from zerotir.config import RLConfig
from zerotir.rl.micro_batches import padded_tokens, row_lengths, token_budget_bins
from tests.rl.long_rows import LENGTHS, long_rows, models, run_update

BUDGET = 24  # rows of 20 and 14 tokens alone, the short ones two or three together
MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
ALGORITHMS = {  # each with the passes it needs: the critic (ppo), the reference in the reward or in the loss
    "ppo": dict(algorithm="ppo", entropy_coef=0.01),
    "reinforce_pp": dict(algorithm="reinforce_pp", kl_coef=0.05),
    "grpo": dict(algorithm="grpo", kl_coef=0.05, use_kl_loss=True, entropy_coef=0.01),
}
PARTITIONS = {
    "one row": dict(micro_batch_size=1),
    "budget": dict(max_tokens_per_micro_batch=BUDGET),
    "budget, chunked log-probs": dict(max_tokens_per_micro_batch=BUDGET, logprob_chunk_tokens=7),
}


@pytest.fixture(scope="module")
def nets():
    return models()


def _cfg(algorithm: str, mode: str, **partition) -> RLConfig:
    # Two mini-batches: the old log-probs come from prepare_batch's passes, and each step bins its own rows.
    return RLConfig(**ALGORITHMS[algorithm], loss_agg_mode=mode, num_mini_batches=2, **partition)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_budget_and_chunks_give_the_whole_batch_update(nets, algorithm, mode):
    actor, ref, critic = nets
    traj = long_rows()
    whole = run_update(_cfg(algorithm, mode, micro_batch_size=len(traj)), traj, actor, ref, critic)
    assert len(whole[1]) == 2 and all(loss != 0 for loss in whole[1])
    for name, partition in PARTITIONS.items():
        batch, losses, grads, _ = run_update(_cfg(algorithm, mode, **partition), traj, actor, ref, critic)
        real = traj.attention_mask.bool()  # a row's padding columns are scored only when its micro-batch has them
        for field in ("old_logp", "ref_logp", "old_values", "returns", "advantages"):
            want, got = getattr(whole[0], field), getattr(batch, field)
            assert (want is None) == (got is None), field
            assert want is None or torch.allclose(got[real], want[real], atol=1e-5, rtol=0), (name, field)
        assert losses == pytest.approx(whole[1], abs=1e-5), name
        for step, want in enumerate(whole[2]):
            assert want.keys() == grads[step].keys(), name
            for param, g in want.items():
                assert torch.allclose(grads[step][param], g, atol=1e-5, rtol=0), (name, step, param)


def _record_passes(module: torch.nn.Module, seen: list[tuple[int, int]]):
    """Record the (rows, width) of every call of ``module`` (the decoder or the critic)."""

    def hook(_module, args, kwargs):
        ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        seen.append(tuple(ids.shape))

    return module.register_forward_pre_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("chunk_tokens", [None, 7])
def test_every_pass_runs_the_budgets_bins(nets, chunk_tokens):
    actor, ref, critic = nets
    traj = long_rows()
    cfg = RLConfig(algorithm="ppo", kl_coef=0.05, ppo_epochs=2, max_tokens_per_micro_batch=BUDGET,
                   logprob_chunk_tokens=chunk_tokens)
    lengths = row_lengths(traj.attention_mask)
    bins = token_budget_bins(lengths, BUDGET)
    # By hand: 20 alone, 14 alone, then 11 + 8 (2 x 11 = 22), then 6 + 5 (2 x 6 = 12; 3 x 6 > 24 has no third row).
    assert [b.tolist() for b in bins] == [[3], [1], [2, 4], [0, 5]]
    expected = sorted((len(b), int(lengths[b].max())) for b in bins)
    seen_actor, seen_ref, seen_critic = [], [], []
    hooks = [_record_passes(actor.get_decoder(), seen_actor), _record_passes(ref.get_decoder(), seen_ref),
             _record_passes(critic, seen_critic)]
    try:
        run_update(cfg, traj, actor, ref, critic)
    finally:
        for h in hooks:
            h.remove()
    # The old log-probs, then two epochs of one mini-batch each: the actor runs the bins three times.
    assert sorted(seen_actor) == sorted(expected * 3)
    assert sorted(seen_ref) == expected  # the reference once
    assert sorted(seen_critic) == sorted(expected * 3)  # the values, then the value loss of each epoch
    assert all(rows == 1 or rows * width <= BUDGET for rows, width in seen_actor + seen_ref + seen_critic)
    assert max(width for _, width in seen_actor) == max(LENGTHS)  # the longest row is not cut
    assert [padded_tokens(lengths, b) for b in bins] == [20, 14, 22, 12]


def test_an_oversized_row_trains_whole(nets):
    actor, ref, critic = nets
    traj = long_rows()
    small = RLConfig(algorithm="grpo", max_tokens_per_micro_batch=3)  # below every row: one row per micro-batch
    one_row = RLConfig(algorithm="grpo", micro_batch_size=1)
    _, losses, grads, _ = run_update(small, traj, actor, ref, critic)
    _, want_losses, want, _ = run_update(one_row, traj, actor, ref, critic)
    assert losses == pytest.approx(want_losses, abs=1e-6)
    for name, g in want[0].items():
        assert torch.allclose(grads[0][name], g, atol=1e-6, rtol=0), name
