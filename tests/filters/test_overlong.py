"""DAPO's soft overlong penalty at the edges of its buffer, and the truncation mask."""

from __future__ import annotations

import pytest
import torch

from tests.callbacks.helpers import make_batch
from zerotir.filters.overlong import soft_overlong_penalty, truncated_rows


def test_the_soft_penalty_at_the_edges_of_the_buffer():
    # Budget 16, buffer 4: free up to 12 tokens; then -(len - 12) / 4: 13 -> -0.25, 14 -> -0.5, 16 -> -1;
    # beyond the budget it stays at -1 (clipped).
    lengths = torch.tensor([0, 11, 12, 13, 14, 15, 16, 17])
    penalty = soft_overlong_penalty(lengths, budget=16, buffer=4, factor=1.0)
    assert penalty.tolist() == [0.0, 0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0]


def test_the_factor_scales_the_penalty_and_its_floor():
    # factor 0.5: 14 tokens -> -0.5 x (14 - 12) / 4 = -0.25; at and past the budget -0.5.
    penalty = soft_overlong_penalty(torch.tensor([12, 14, 16, 40]), budget=16, buffer=4, factor=0.5)
    assert penalty.tolist() == [0.0, -0.25, -0.5, -0.5]


def test_a_buffer_outside_the_budget_is_refused():
    with pytest.raises(ValueError, match="need 0 < buffer < budget"):
        soft_overlong_penalty(torch.tensor([1]), budget=4, buffer=4, factor=1.0)


def test_the_mask_names_the_truncated_rows():
    batch = make_batch([0.0, 1.0, 0.0], [0, 0, 0], truncated=[True, False, True])
    assert truncated_rows(batch).tolist() == [True, False, True]
