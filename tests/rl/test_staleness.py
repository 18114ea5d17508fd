"""The capacity rule and the staleness statistics, worked by hand."""

from __future__ import annotations

import pytest
import torch

from zerotir.rl.staleness import check_staleness, may_start, staleness_stats, trainer_version


def test_trainer_version_counts_the_updates_before_a_step():
    assert [trainer_version(k) for k in (1, 2, 7)] == [0, 1, 6]
    with pytest.raises(ValueError, match="count from 1"):
        trainer_version(0)


@pytest.mark.parametrize(("step", "version", "s", "expected"), [
    (1, 0, 0, True),  # the first batch needs no update
    (2, 0, 0, False),  # S = 0: batch 2 waits for update 1
    (2, 1, 0, True),
    (2, 0, 1, True),  # S = 1: batch 2 may be generated while update 1 runs
    (3, 0, 1, False),  # ... but not batch 3
    (5, 2, 2, True),  # step 5 trains with weights 4; version 2 is 2 old
    (5, 1, 2, False),
])
def test_may_start(step, version, s, expected):
    assert may_start(step, version, s) is expected


def test_may_start_rejects_a_negative_bound():
    with pytest.raises(ValueError, match="max_staleness=-1"):
        may_start(1, 0, -1)


def test_staleness_of_sampled_tokens_only():
    # Step 4 trains with weights of version 3. Sampled tokens: versions 3, 2, 2 and 1 -> ages 0, 1, 1, 2.
    versions = torch.tensor([[-1, 3, 2, -1], [-1, 2, 1, 0]])
    mask = torch.tensor([[0, 1, 1, 0], [0, 1, 1, 0]], dtype=torch.bool)  # the 0 at [1, 3] is off the mask
    stats = staleness_stats(versions, mask, step=4)
    assert stats == {"staleness_mean": 1.0, "staleness_max": 2.0, "oldest_version": 1.0}
    check_staleness(stats, 4, max_staleness=2)
    with pytest.raises(RuntimeError, match="version 1, 2 updates old, over model.pipeline.max_staleness=1"):
        check_staleness(stats, 4, max_staleness=1)


def test_staleness_of_a_batch_without_sampled_tokens():
    stats = staleness_stats(torch.full((2, 3), -1), torch.zeros(2, 3, dtype=torch.bool), step=3)
    assert stats == {"staleness_mean": 0.0, "staleness_max": 0.0, "oldest_version": 2.0}


def test_unstamped_or_future_versions_are_errors():
    mask = torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="no weight version"):
        staleness_stats(torch.tensor([[0, -1]]), mask, step=1)
    with pytest.raises(ValueError, match="newer than the trainer's weights at step 2"):
        staleness_stats(torch.tensor([[1, 2]]), mask, step=2)
    with pytest.raises(ValueError, match="same shape"):
        staleness_stats(torch.zeros(1, 3, dtype=torch.long), mask, step=1)
