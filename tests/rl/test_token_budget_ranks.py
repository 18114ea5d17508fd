"""Two gloo ranks under a token budget, one with 1 micro-batch and one with 3: both run 3 passes (the padding passes
weigh 0), and the update's gradient, averaged over the ranks as a data-parallel backend does at every backward, is
one process's on the whole batch. The same ranks with packed rows + the budget + chunked log-probs (1 and 3 packed
rows) train as one process along today's padded path, for PPO (the critic included), REINFORCE++ and GRPO and every
loss aggregation mode. One spawn of the two ranks runs every case (a spawn costs most of the test's time).

Each backward all-reduces its gradients (as DDP or ZeRO's reduction does), so ranks that ran different numbers of
passes would pair one rank's reduction with another's different one and stop at the process group's timeout.
"""

from __future__ import annotations

import pytest
import torch

from tests.gloo import gloo_group, run_ranks, save_rank
from tests.ports import free_port
from tests.rl.long_rows import all_reduced_backward, long_rows, models, run_update, value_critic
from tests.rl.test_packed_update import ALGORITHMS, MODES, PACKED
from zerotir.config import RLConfig
from zerotir.rl.micro_batches import packed_bins, row_lengths, token_budget_bins

WORLD = 2
BUDGET = 24
LENGTHS = [5, 6, 20, 14, 11]  # rank 0: 5 + 6 (one micro-batch of 2 x 6); rank 1: 20, 14, 11 (each alone)
REWARDS = [1.0, 0.0, 1.0, 0.0, 1.0]
GROUPS = [0, 0, 1, 1, 1]
RANK_ROWS = [[0, 1], [2, 3, 4]]
SPAWN_TIMEOUT_S = 150.0
# Packed: every algorithm and every loss aggregation mode in four runs (the one-rank test takes the whole product).
PACKED_CASES = [("ppo", "token-mean"), ("reinforce_pp", "seq-mean-token-mean"), ("grpo", "seq-mean-token-sum"),
                ("ppo", "seq-mean-token-sum-norm")]
assert {m for _, m in PACKED_CASES} == set(MODES) and {a for a, _ in PACKED_CASES} == set(ALGORITHMS)


def _cfg(**partition) -> RLConfig:
    # reinforce_pp whitens over the ranks; two epochs: the old log-probs come from prepare_batch's aligned passes.
    return RLConfig(algorithm="reinforce_pp", ppo_epochs=2, **partition)


def _packed_cfg(algorithm: str, mode: str, **partition) -> RLConfig:
    # One mini-batch (each step sees all of a rank's rows, as the one process sees all rows), two epochs as _cfg.
    return RLConfig(**ALGORITHMS[algorithm], loss_agg_mode=mode, ppo_epochs=2, **partition)


def _traj():
    return long_rows(LENGTHS, REWARDS, GROUPS, width=max(LENGTHS) + 1)


def _worker(rank: int, port: int, out_dir: str) -> None:
    with gloo_group(rank, WORLD, port, timeout_s=30):
        torch.set_num_threads(1)
        actor, ref, critic = models()
        traj = _traj().select(RANK_ROWS[rank])
        lengths = row_lengths(traj.attention_mask)
        calls = [0]
        _, losses, grads, _ = run_update(_cfg(max_tokens_per_micro_batch=BUDGET), traj, actor, ref, critic,
                                         backward_fn=all_reduced_backward(calls, WORLD))
        out = {"bins": len(token_budget_bins(lengths, BUDGET)), "backward_calls": calls[0], "losses": losses,
               "grads": grads, "packed_bins": len(packed_bins(lengths, PACKED["max_tokens_per_micro_batch"]))}
        value_model = value_critic()
        for algorithm, mode in PACKED_CASES:
            calls = [0]
            _, losses, grads, _ = run_update(_packed_cfg(algorithm, mode, **PACKED), traj, actor, ref, value_model,
                                             backward_fn=all_reduced_backward(calls, WORLD))
            out[algorithm, mode] = {"backward_calls": calls[0], "losses": losses, "grads": grads}
        save_rank(out, out_dir, rank)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("ranks")
    return run_ranks(_worker, (free_port(), str(out)), WORLD, out, SPAWN_TIMEOUT_S)


def _assert_ranks_train_as_one(got: list[dict], want_losses: list[float], want: list[dict], case) -> None:
    # Each rank's weights carry the world size (the backend averages), so the ranks' losses sum to world x one's.
    summed = [sum(r["losses"][step] for r in got) / WORLD for step in range(len(want_losses))]
    assert summed == pytest.approx(want_losses, abs=1e-5), case
    for rank in got:
        for step, grads in enumerate(want):
            assert grads.keys() == rank["grads"][step].keys(), case
            for name, g in grads.items():
                assert torch.allclose(rank["grads"][step][name], g, atol=1e-5, rtol=0), (case, step, name)


@pytest.mark.timeout(200)
def test_ranks_with_1_and_3_micro_batches_train_as_one_process_on_both(ranks) -> None:
    assert [r["bins"] for r in ranks] == [1, 3]
    assert [r["backward_calls"] for r in ranks] == [6, 6]  # 3 passes in each of the two epochs' steps, on both
    actor, ref, critic = models()
    _, want_losses, want, _ = run_update(_cfg(micro_batch_size=len(LENGTHS)), _traj(), actor, ref, critic)
    _assert_ranks_train_as_one(ranks, want_losses, want, "budget")


@pytest.mark.timeout(200)
@pytest.mark.parametrize("case", PACKED_CASES, ids="-".join)
def test_packed_ranks_train_as_the_padded_process(ranks, case) -> None:
    assert [r["packed_bins"] for r in ranks] == [1, 3]  # 5 + 6 in one row; 20, 14, 11 (14 + 11 > 24) alone
    got = [r[case] for r in ranks]
    assert [r["backward_calls"] for r in got] == [6, 6], case
    actor, ref, _ = models()
    _, want_losses, want, _ = run_update(_packed_cfg(*case, micro_batch_size=len(LENGTHS)), _traj(), actor, ref,
                                         value_critic())
    _assert_ranks_train_as_one(got, want_losses, want, case)
