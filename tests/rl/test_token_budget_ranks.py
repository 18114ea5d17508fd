"""Two gloo ranks under a token budget, one with 1 micro-batch and one with 3: both run 3 passes (the padding passes
weigh 0), and the update's gradient, averaged over the ranks as a data-parallel backend does at every backward, is
one process's on the whole batch.

Each backward all-reduces its gradients (as DDP or ZeRO's reduction does), so ranks that ran different numbers of
passes would pair one rank's reduction with another's different one and stop at the process group's timeout.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.gloo import free_port, run_ranks
from tests.rl.long_rows import long_rows, models, run_update
from zerotir.config import RLConfig
from zerotir.rl.micro_batches import row_lengths, token_budget_bins

WORLD = 2
BUDGET = 24
LENGTHS = [5, 6, 20, 14, 11]  # rank 0: 5 + 6 (one micro-batch of 2 x 6); rank 1: 20, 14, 11 (each alone)
REWARDS = [1.0, 0.0, 1.0, 0.0, 1.0]
GROUPS = [0, 0, 1, 1, 1]
RANK_ROWS = [[0, 1], [2, 3, 4]]
SPAWN_TIMEOUT_S = 150.0


def _cfg(**partition) -> RLConfig:
    # reinforce_pp whitens over the ranks; two epochs: the old log-probs come from prepare_batch's aligned passes.
    return RLConfig(algorithm="reinforce_pp", ppo_epochs=2, **partition)


def _traj():
    return long_rows(LENGTHS, REWARDS, GROUPS, width=max(LENGTHS) + 1)


def _all_reduced_backward(calls: list[int]):
    def backward(loss: torch.Tensor, params: list[torch.nn.Parameter]) -> None:
        calls[0] += 1
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        for p, g in zip(params, grads):
            g = torch.zeros_like(p) if g is None else g.clone()
            dist.all_reduce(g)  # the backend's reduction: sum over ranks, then the mean
            g /= WORLD
            p.grad = g if p.grad is None else p.grad + g

    return backward


def _worker(rank: int, port: int, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=30))
    try:
        torch.set_num_threads(1)
        actor, ref, critic = models()
        traj = _traj().select(RANK_ROWS[rank])
        bins = token_budget_bins(row_lengths(traj.attention_mask), BUDGET)
        calls = [0]
        _, losses, grads, _ = run_update(_cfg(max_tokens_per_micro_batch=BUDGET), traj, actor, ref, critic,
                                         backward_fn=_all_reduced_backward(calls))
        torch.save({"bins": len(bins), "backward_calls": calls[0], "losses": losses, "grads": grads},
                   Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(200)
def test_ranks_with_1_and_3_micro_batches_train_as_one_process_on_both(tmp_path: Path) -> None:
    ranks = run_ranks(_worker, (free_port(), str(tmp_path)), WORLD, tmp_path, SPAWN_TIMEOUT_S)
    assert [r["bins"] for r in ranks] == [1, 3]
    assert [r["backward_calls"] for r in ranks] == [6, 6]  # 3 passes in each of the two epochs' steps, on both
    actor, ref, critic = models()
    _, want_losses, want, _ = run_update(_cfg(micro_batch_size=len(LENGTHS)), _traj(), actor, ref, critic)
    # Each rank's weights carry the world size (the backend averages), so the ranks' losses sum to world x one's.
    summed = [sum(r["losses"][step] for r in ranks) / WORLD for step in range(2)]
    assert summed == pytest.approx(want_losses, abs=1e-5)
    for rank in ranks:
        for step in range(2):
            for name, g in want[step].items():
                assert torch.allclose(rank["grads"][step][name], g, atol=1e-5, rtol=0), (step, name)
