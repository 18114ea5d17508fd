"""Packed rows (zerotir.rl.packing): the packing function and its way back, the block-diagonal causal mask, the bins
of packed rows, and the actor's log-probs / entropy and the critic's values through one packed row equal to the
padded rows' under sdpa and eager attention; an attention implementation without a packed path is refused."""

from __future__ import annotations

import pytest
import torch

from tests.rl.long_rows import LENGTHS, long_rows, models, value_critic
from zerotir.rl.micro_batches import micro_batches, packed_bins, row_lengths
from zerotir.rl.packing import block_causal_mask, pack, packed_inputs, unpack
from zerotir.rl.update import sequence_logprobs, sequence_values


@pytest.fixture(scope="module")
def nets():
    actor, _, _ = models()
    return actor, value_critic()


def test_pack_concatenates_real_tokens_and_restarts_positions():
    ids = torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0], [1, 2, 3, 4]])
    attn = (ids != 0).long()
    row = pack(ids, attn)
    assert row.input_ids.tolist() == [[5, 6, 7, 8, 9, 1, 2, 3, 4]]
    assert row.position_ids.tolist() == [[0, 1, 2, 0, 1, 0, 1, 2, 3]]
    assert row.segment_ids.tolist() == [0, 0, 0, 1, 1, 2, 2, 2, 2]
    back = unpack(row, row.input_ids.float())
    # Column 0 is 0 (its shifted value would come from the previous trajectory), and so is padding.
    assert back.tolist() == [[0, 6, 7, 0], [0, 9, 0, 0], [0, 2, 3, 4]]


def test_pack_refuses_left_padding():
    ids = torch.tensor([[0, 5, 6]])
    with pytest.raises(ValueError, match="right-padded"):
        pack(ids, (ids != 0).long())


def test_block_causal_mask_keeps_each_segment_to_itself():
    mask = block_causal_mask(torch.tensor([0, 0, 1, 1, 1]))[0, 0].int()
    assert mask.tolist() == [[1, 0, 0, 0, 0],
                             [1, 1, 0, 0, 0],
                             [0, 0, 1, 0, 0],
                             [0, 0, 1, 1, 0],
                             [0, 0, 1, 1, 1]]


def test_packed_bins_are_first_fit_decreasing_on_summed_length():
    lengths = torch.tensor(LENGTHS)  # 5, 14, 8, 20, 11, 6
    # By hand at 24: 20 opens bin 0, 14 bin 1, 11 fits neither (31, 25) and opens bin 2, 8 joins 14 (22),
    # 6 joins 11 (17), 5 joins them (22); 30 would put 20 + 8 and 14 + 11 + 5 together.
    assert [b.tolist() for b in packed_bins(lengths, 24)] == [[3], [1, 2], [0, 4, 5]]
    assert [b.tolist() for b in packed_bins(lengths, 30)] == [[2, 3], [0, 1, 4], [5]]
    assert [b.tolist() for b in packed_bins(lengths, 3)] == [[3], [1], [4], [2], [5], [0]]  # each alone
    for budget in (3, 24, 30, 64):
        bins = packed_bins(lengths, budget)
        assert sorted(torch.cat(bins).tolist()) == list(range(len(LENGTHS)))
        assert all(len(b) == 1 or int(lengths[b].sum()) <= budget for b in bins)
    assert [b.tolist() for b in micro_batches(lengths, 4, None, packed=True)] == [[0, 1, 2, 3], [4, 5]]


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("chunk_tokens", [None, 7])
def test_packed_logprobs_and_values_are_the_padded_ones(nets, implementation, chunk_tokens):
    actor, critic = nets
    traj = long_rows()
    ids, attn = traj.input_ids, traj.attention_mask
    scored = attn.bool().clone()
    scored[:, 0] = False  # position 0 is a prompt token: 0 on both paths
    for model in (actor, critic.backbone):
        model.config._attn_implementation = implementation
    try:
        for grad in (False, True):
            with torch.set_grad_enabled(grad):
                padded = sequence_logprobs(actor, ids, attn, temperature=0.8, with_entropy=True,
                                           chunk_tokens=chunk_tokens)
                packed = sequence_logprobs(actor, ids, attn, temperature=0.8, with_entropy=True,
                                           chunk_tokens=chunk_tokens, packed=True)
            for want, got in zip(padded, packed):
                assert torch.allclose(got[scored], want[scored], atol=1e-5, rtol=0)
                assert got[~scored].abs().sum() == 0
        values = sequence_values(critic, ids, attn), sequence_values(critic, ids, attn, packed=True)
        assert torch.allclose(values[1][scored], values[0][scored], atol=1e-5, rtol=0)
    finally:
        for model in (actor, critic.backbone):
            model.config._attn_implementation = "sdpa"


def test_packed_rows_refuse_an_attention_without_a_packed_path(nets):
    actor, _ = nets
    traj = long_rows()
    row = pack(traj.input_ids, traj.attention_mask)
    actor.config._attn_implementation = "flex_attention"
    try:
        with pytest.raises(ValueError, match="model.rl.pack_rows=true.*'flex_attention'.*attend across"):
            packed_inputs(actor, row)
    finally:
        actor.config._attn_implementation = "sdpa"
    for name in ("flash_attention_2", "flash_attention_3"):
        actor.config._attn_implementation = name
        try:
            inputs = packed_inputs(actor, row)  # the varlen path: no mask, positions restarting in one row
        finally:
            actor.config._attn_implementation = "sdpa"
        assert inputs["attention_mask"] is None and inputs["position_ids"].shape == (1, int(row_lengths(
            traj.attention_mask).sum()))


def test_packed_positions_alone_mark_the_trajectories(nets):
    """The flash-attention path has no mask: the restarting positions are the only sign of where a trajectory
    starts. transformers reads them the same way for sdpa when there is no mask and no cache
    (``find_packed_sequence_indices``), which checks them on CPU: the packed row's log-probs are the padded rows'."""
    actor, _ = nets
    traj = long_rows()
    ids, attn = traj.input_ids, traj.attention_mask
    row = pack(ids, attn)

    def logprobs(logits, tokens):
        return torch.nn.functional.pad(logits[:, :-1].log_softmax(-1).gather(-1, tokens[:, 1:, None])[..., 0], (1, 0))

    with torch.no_grad():
        logits = actor(input_ids=row.input_ids, position_ids=row.position_ids, use_cache=False).logits
        packed = unpack(row, logprobs(logits, row.input_ids))
        padded = logprobs(actor(input_ids=ids, attention_mask=attn, use_cache=False).logits, ids)
    scored = attn.bool()
    assert torch.allclose(packed[scored], padded[scored], atol=1e-5, rtol=0)
