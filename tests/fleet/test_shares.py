"""A batch cut into the fleet's calls, and the prompt groups that have ended (``zerotir.fleet.shares``): the seeds
of a share are those of its rows in the whole batch, a step takes the first ended groups in stream order, a group
over the staleness bound is dropped, and no stream row waits twice. Pure: no Ray."""

from __future__ import annotations

import pytest
import torch

from tests.test_types import batch
from zerotir.fleet.shares import Ended, EndedGroups, cut_shares, merge
from zerotir.rollout.engine import SamplingParams

N = 2  # samples per prompt


def rows(batch_index: int, positions: list[int]) -> list[dict]:
    return [{"id": f"{batch_index}-{p}", "prompt_ids": [p], "answer": str(p), "batch_index": batch_index,
             "position": p} for p in positions]


def group(batch_index: int, position: int, oldest: int) -> Ended:
    versions = torch.tensor([[oldest, oldest + 1]] * N)
    return Ended.of(rows(batch_index, [position])[0], batch(N, 2, versions))


def test_a_share_samples_with_the_seeds_of_its_rows_in_the_whole_batch():
    params = SamplingParams(n=N, seed=100)
    whole = rows(3, list(range(5)))
    contiguous = cut_shares(whole, params, engines=2, parts=2)
    assert [(s.lo, s.engine, len(s.args[0]), s.args[2].seed) for s in contiguous] == [(0, 0, 2, 100), (2, 1, 3, 104)]
    groups = cut_shares(whole, params, engines=2, parts=len(whole))
    assert [(s.lo, s.engine, s.args[2].seed) for s in groups] == [(0, 0, 100), (1, 1, 102), (2, 0, 104), (3, 1, 106),
                                                                  (4, 0, 108)]
    left = cut_shares(rows(3, [1, 4]), params, engines=2, parts=2)  # a resumed batch: rows 1 and 4 remain
    assert [s.args[2].seed for s in left] == [102, 108] and [s.args[1] for s in left] == [["1"], ["4"]]
    assert cut_shares(whole, SamplingParams(n=N, seed=None), 2, len(whole))[3].args[2].seed is None


def test_a_step_takes_the_first_ended_groups_in_stream_order():
    ended = EndedGroups()
    for key in [(2, 0), (1, 3), (1, 0), (2, 1)]:  # the order they ended in
        ended.add(group(*key, oldest=5))
    taken = ended.take(3)
    assert [g.key for g in taken] == [(1, 0), (1, 3), (2, 0)] and len(ended) == 1
    with pytest.raises(ValueError, match="only 1 groups have ended"):
        ended.take(2)


def test_groups_over_the_staleness_bound_are_dropped_and_the_others_wait():
    ended = EndedGroups()
    ended.add(group(0, 0, oldest=3))
    ended.add(group(0, 1, oldest=4))
    ended.add(group(1, 0, oldest=6))
    # step 7 trains with version 6; S = 2 keeps tokens of version 4 and newer
    assert [g.key for g in ended.stale(step=7, max_staleness=2)] == [(0, 0)]
    assert ended.stale(step=7, max_staleness=2) == [] and len(ended) == 2
    assert [g.key for g in ended.stale(step=8, max_staleness=2)] == [(0, 1)]


def test_a_group_without_a_version_or_ending_twice_is_refused():
    with pytest.raises(ValueError, match="no weight version"):
        group(0, 0, oldest=-1)
    ended = EndedGroups()
    ended.add(group(0, 2, oldest=0))
    with pytest.raises(ValueError, match=r"prompt group \(0, 2\) ended twice"):
        ended.add(group(0, 2, oldest=1))


def test_merge_shifts_group_ids_and_keeps_the_slowest_timings():
    parts = [(batch(N, 2, None), {"generation": 1.0, "sandbox": 0.5}), (batch(N, 3, None), {"generation": 2.0})]
    for traj, _ in parts:
        traj.group_ids = torch.zeros(N, dtype=torch.long)
    traj, timings = merge(parts, [0, 1], pad=0)
    assert traj.group_ids.tolist() == [0, 0, 1, 1] and traj.input_ids.shape == (4, 3)
    assert timings == {"generation": 2.0, "sandbox": 0.5}
