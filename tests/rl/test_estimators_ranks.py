"""The paper's estimator (``reinforce_baseline``) on two gloo ranks whitens over the global batch: each rank's
advantages, computed as the trainer computes them (``compute_advantages``), equal one process's over the two ranks'
rows together."""

from __future__ import annotations

import pytest
import torch

from tests.gloo import gloo_group, run_ranks, save_rank
from tests.ports import free_port
from tests.callbacks.helpers import make_batch
from zerotir.config import RLConfig
from zerotir.rl.update import compute_advantages
from zerotir.types import Trajectories

# Each rank holds whole prompt groups (group ids from 0 on each). Rank 0: one group split 1/0, one all right (its
# centered rewards are 0); rank 1: two groups split 1/0. So rank 1's advantages spread more than rank 0's, and
# whitening by one rank's statistics gives other numbers than by the global batch's.
REWARDS = {0: [1.0, 0.0, 1.0, 1.0], 1: [1.0, 0.0, 0.0, 1.0]}
GROUPS = [0, 0, 1, 1]
CFG = RLConfig(algorithm="reinforce_baseline", kl_coef=0.0)


def _rank_traj(rank: int) -> Trajectories:
    return make_batch(REWARDS[rank], GROUPS)


def _worker(rank: int, port: int, out_dir: str) -> None:
    with gloo_group(rank, 2, port, timeout_s=60):
        traj = _rank_traj(rank)
        advantages, _ = compute_advantages(CFG, traj, traj.action_mask, None, None)
        save_rank(advantages, out_dir, rank)


@pytest.mark.timeout(180)
def test_reinforce_baseline_whitens_over_the_global_batch_on_two_ranks(tmp_path):
    ranks = run_ranks(_worker, (free_port(), str(tmp_path)), 2, tmp_path, timeout_s=150)
    second = _rank_traj(1)
    second.group_ids = second.group_ids + 2  # one process: the groups of both ranks, each its own
    together = Trajectories.cat([_rank_traj(0), second], pad_token_id=0)
    expected, _ = compute_advantages(CFG, together, together.action_mask, None, None)
    torch.testing.assert_close(torch.cat(ranks), expected)
    alone, _ = compute_advantages(CFG, _rank_traj(1), _rank_traj(1).action_mask, None, None)
    assert not torch.allclose(alone, expected[4:])  # the case tells global from per-rank whitening apart
