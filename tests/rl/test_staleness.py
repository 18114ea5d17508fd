"""The capacity rule and the staleness statistics, worked by hand."""

from __future__ import annotations

import pytest
import torch

from zerotir.rl.staleness import StreamCursor, check_staleness, may_start, staleness_stats, trainer_version


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
    with pytest.raises(RuntimeError, match="version 1, 2 updates old, over model.hosts.max_staleness=1"):
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


def test_the_stream_cursor_hands_out_batches_in_order_and_counts_refills():
    cursor = StreamCursor(first_step=5, first_batch=10)  # a resume at step 5, batch 10 the first unconsumed
    assert cursor.latest_step(10) == 5 and cursor.latest_step(13) == 8  # one batch per later step at the most
    with pytest.raises(ValueError, match=r"step 6 asked for a batch: steps take their batches in order; the next "
                                         r"one is 5$"):
        cursor.take(6)
    with pytest.raises(ValueError, match=r"the next one is 5$"):
        cursor.take(4)  # no step taken yet: nothing to refill
    assert cursor.take(5) == (10, False)
    cursor.handed(5)
    assert cursor.take(5) == (11, True)  # step 5 again: a refill batch, counted at once
    assert cursor.latest_step(12) == 6  # batch 11 trains at step 5, not 6: every later batch one step earlier
    cursor.handed(5)
    with pytest.raises(ValueError, match=r"the next one is 6 \(or 5 again, a refill batch\)"):
        cursor.take(7)
    assert cursor.take(6) == (12, False)
    cursor.handed(6)
    assert (cursor.taken, cursor.next_take, cursor.refills) == (6, 13, 1)


@pytest.mark.parametrize(("version", "s", "expected"), [(5, 0, False), (6, 0, True), (5, 1, True), (4, 1, False)])
def test_the_stream_cursor_gates_a_batch_on_the_latest_step_that_can_train_it(version, s, expected):
    cursor = StreamCursor(first_step=1, first_batch=0)
    # batch 6 trains at step 7 at the latest, which needs weights of version >= 6 - S
    assert cursor.may_start(6, version, s) is expected
