"""``Trajectories``: the optional per-token weight versions follow ``select``, ``to`` and ``cat``."""

from __future__ import annotations

import pytest
import torch

from zerotir.types import Trajectories


def batch(b: int, t: int, versions: torch.Tensor | None) -> Trajectories:
    zeros = torch.zeros(b, dtype=torch.long)
    return Trajectories(
        input_ids=torch.ones(b, t, dtype=torch.long), attention_mask=torch.ones(b, t, dtype=torch.long),
        action_mask=torch.ones(b, t, dtype=torch.bool), logprobs=torch.zeros(b, t), prompt_lens=zeros,
        response_lens=zeros, group_ids=torch.arange(b), rewards=torch.zeros(b), num_calls=zeros,
        num_exec_errors=zeros, num_timeouts=zeros, num_sandbox_errors=zeros, truncated=torch.zeros(b, dtype=torch.bool),
        versions=versions, finish_reasons=["stop"] * b, response_texts=[""] * b, ground_truths=[""] * b)


def test_versions_follow_select_and_to():
    traj = batch(3, 2, torch.tensor([[0, 0], [1, 1], [2, 2]]))
    assert traj.select([2, 0]).versions.tolist() == [[2, 2], [0, 0]]
    assert traj.to("cpu").versions.tolist() == traj.versions.tolist()
    assert batch(2, 2, None).select([1]).versions is None


def test_cat_pads_versions_with_minus_one_and_refuses_a_mix():
    joined = Trajectories.cat([batch(1, 1, torch.tensor([[4]])), batch(1, 3, torch.tensor([[5, 5, 5]]))], 0)
    assert joined.versions.tolist() == [[4, -1, -1], [5, 5, 5]]
    assert Trajectories.cat([batch(1, 1, None), batch(1, 2, None)], 0).versions is None
    with pytest.raises(ValueError, match="some batches record weight versions"):
        Trajectories.cat([batch(1, 1, None), batch(1, 1, torch.tensor([[0]]))], 0)
