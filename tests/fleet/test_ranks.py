"""The training ranks' side of the fleet (``zerotir.fleet.ranks``): a global batch split into each rank's part, and
rank 0 leading the other ranks through pushes, a hand-out and a failure over a real gloo group."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.gloo import run_ranks
from tests.ports import free_port
from tests.rl.update_world import make_traj
from zerotir.fleet.ranks import TrainerRanks, split_batch
from zerotir.rollout.source import RolloutBatch


def _batch(prompts: int, n: int) -> RolloutBatch:
    rows = [{"id": f"p{i}", "batch_index": 7} for i in range(prompts)]
    traj = make_traj([float(i) for i in range(prompts * n)], [i // n for i in range(prompts * n)])
    return RolloutBatch(rows, traj, {"generation": 1.5}, ["http://sandbox"], [(7, i) for i in range(prompts)])


def test_a_global_batch_splits_into_each_ranks_rows_and_their_trajectories():
    whole = _batch(prompts=5, n=2)
    parts = split_batch(whole, [2, 3], n=2)
    assert [[r["id"] for r in p.rows] for p in parts] == [["p0", "p1"], ["p2", "p3", "p4"]]
    assert parts[0].trajectories.rewards.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert parts[1].trajectories.rewards.tolist() == [4.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    assert parts[1].trajectories.group_ids.tolist() == [0, 0, 1, 1, 2, 2]  # from the part's first row, as in line
    assert torch.equal(parts[1].trajectories.input_ids, whole.trajectories.input_ids[4:])
    assert parts[0].timings == {"generation": 1.5} and parts[1].sandbox == ["http://sandbox"]
    parts[0].timings["wait_for_rollout"] = 2.0
    assert parts[1].timings == {"generation": 1.5}  # each part has timings of its own
    assert parts[0].taken == parts[1].taken == [(7, i) for i in range(5)]  # every rank's rows: the data position


@pytest.mark.parametrize("counts", [[2, 2], [5, 1]])
def test_a_split_that_does_not_cover_the_batch_is_refused(counts):
    with pytest.raises(ValueError, match=r"5 rows with 10 trajectories cannot be split into"):
        split_batch(_batch(prompts=5, n=2), counts, n=2)


def test_one_process_leads_itself():
    ranks = TrainerRanks()
    assert ranks.lead and not ranks.several
    with ranks.leading():
        ranks.announce_push(1)  # nobody to tell
    assert ranks.scatter(["mine"]) == "mine" and ranks.gather("x") == ["x"]


def _worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    ranks, record = TrainerRanks(), {}
    try:
        record["gathered"] = ranks.gather(f"rows of {rank}")
        if ranks.lead:
            with ranks.leading():
                ranks.announce_push(3)
                ranks.announce_push(4)
            record["part"] = ranks.scatter(["part 0", "part 1"])
            with pytest.raises(ValueError, match="boom"), ranks.leading():
                raise ValueError("boom")
        else:
            pushes = []
            ranks.follow(pushes.append)
            record["pushes"], record["part"] = pushes, ranks.scatter(None)
            with pytest.raises(RuntimeError, match=r"rank 1: the rollout fleet failed on rank 0: ValueError: boom"):
                ranks.follow(pushes.append)
        torch.save(record, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_rank_0_leads_the_other_ranks_through_pushes_a_hand_out_and_a_failure(tmp_path):
    lead, follower = run_ranks(_worker, (free_port(), str(tmp_path)), 2, tmp_path, timeout_s=120)
    assert lead["gathered"] == follower["gathered"] == ["rows of 0", "rows of 1"]
    assert follower["pushes"] == [3, 4]  # joined each push rank 0 announced, in order
    assert (lead["part"], follower["part"]) == ("part 0", "part 1")
