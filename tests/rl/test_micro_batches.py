"""Micro-batches under a token budget (zerotir.rl.micro_batches): the binning rule on constructed lengths."""

from __future__ import annotations

import pytest
import torch

from zerotir.rl.micro_batches import (
    aligned,
    iter_rows,
    micro_batches,
    padded_tokens,
    row_lengths,
    token_budget_bins,
)


def _bins(lengths: list[int], budget: int) -> list[list[int]]:
    return [rows.tolist() for rows in token_budget_bins(torch.tensor(lengths), budget)]


def test_bins_by_hand_longest_first_within_the_budget():
    # Sorted longest first: 9 (row 1), 5 (row 3), 4 (row 0), 4 (row 4), 2 (row 2), 1 (row 5).
    # Budget 10: [9] (2 x 9 > 10); [5, 4] (2 x 5 = 10; 3 x 5 > 10); [4, 2] (2 x 4 = 8; with the 1, 3 x 4 = 12 > 10);
    # [1].
    assert _bins([4, 9, 2, 5, 4, 1], 10) == [[1], [0, 3], [2, 4], [5]]
    # Budget 12: [9]; [5, 4] (3 x 5 > 12); [4, 2, 1] (3 x 4 = 12).
    assert _bins([4, 9, 2, 5, 4, 1], 12) == [[1], [0, 3], [2, 4, 5]]
    # A budget as large as the batch's padded size: one micro-batch.
    assert _bins([4, 9, 2, 5, 4, 1], 6 * 9) == [[0, 1, 2, 3, 4, 5]]


def test_a_row_over_the_budget_is_alone_and_never_cut():
    bins = token_budget_bins(torch.tensor([3, 50, 3, 40]), 8)
    assert [b.tolist() for b in bins] == [[1], [3], [0, 2]]
    lengths = torch.tensor([3, 50, 3, 40])
    assert [padded_tokens(lengths, b) for b in bins] == [50, 40, 6]  # the long rows keep their whole length


def test_ties_are_broken_by_row_index_so_the_bins_depend_on_the_lengths_only():
    assert _bins([5, 5, 5, 5], 10) == [[0, 1], [2, 3]]
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 60, (40,), generator=gen)
    first = token_budget_bins(lengths, 100)
    again = token_budget_bins(lengths.clone(), 100)
    assert [b.tolist() for b in first] == [b.tolist() for b in again]


@pytest.mark.parametrize("budget", [1, 7, 64, 300, 10_000])
def test_every_row_exactly_once_and_every_bin_within_the_budget(budget):
    gen = torch.Generator().manual_seed(budget)
    lengths = torch.randint(1, 200, (57,), generator=gen)
    bins = token_budget_bins(lengths, budget)
    assert sorted(torch.cat(bins).tolist()) == list(range(57))
    for rows in bins:
        assert rows.tolist() == sorted(rows.tolist())
        assert len(rows) == 1 or padded_tokens(lengths, rows) <= budget
    # First-fit: every bin but the last is full (one more row at its longest length would pass the budget).
    for a in bins[:-1]:
        assert (len(a) + 1) * int(lengths[a].max()) > budget


def test_empty_rows_and_an_empty_batch():
    assert _bins([0, 0, 0], 2) == [[0, 1], [2]]  # an empty row still costs one position
    assert token_budget_bins(torch.zeros(0, dtype=torch.long), 5) == []
    with pytest.raises(ValueError, match="max_tokens_per_micro_batch=0: must be >= 1"):
        token_budget_bins(torch.tensor([3]), 0)


def test_micro_batches_is_the_row_count_without_a_budget():
    lengths = torch.tensor([4, 9, 2, 5, 4])
    assert [r.tolist() for r in micro_batches(lengths, 2, None)] == [r.tolist() for r in iter_rows(5, 2)]
    assert [r.tolist() for r in micro_batches(lengths, 2, 10)] == _bins([4, 9, 2, 5, 4], 10)


def test_row_lengths_are_the_real_tokens_of_each_row():
    attn = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    assert row_lengths(attn).tolist() == [3, 4, 1]


def test_aligned_pads_a_budgeted_rank_to_the_largest_count():
    chunks = token_budget_bins(torch.tensor([9, 2, 2]), 4)  # [[0], [1, 2]]
    out = aligned(chunks, 4)
    assert [(r.tolist(), pad) for r, pad in out] == [([0], False), ([1, 2], False), ([0], True), ([0], True)]

