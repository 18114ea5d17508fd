"""Cross-rank statistics: two gloo processes must give the numbers one process computes on the whole batch.

The two ranks run every check in one spawn, the errors raised on one rank included (process start-up dominates the
cost); each rank saves its results and the test compares them with single-process computations on the concatenated
batch and with hand-worked values.
The spawned workers re-import this module, so it imports nothing heavier than torch at the top (the pass-rate filter
lives next to a Lightning callback: it is imported inside the tests that need it, and keep masks reach the workers as
arguments).
"""

from __future__ import annotations

import math
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from zerotir.rl import algorithms as A
from zerotir.parallel import distributed as D
from tests.gloo import gloo_group, run_ranks, save_rank
from tests.ports import free_port

WORLD = 2
SPAWN_TIMEOUT_S = 90.0


# ----- the per-rank data (a function of the rank only, so the parent rebuilds it for the reference numbers) -----

def hand_data(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank 0 holds 1, 2, 3 (9 is masked out); rank 1 holds 4 in a wider row (7, 8 masked out)."""
    if rank == 0:
        return torch.tensor([[1.0, 2.0], [3.0, 9.0]]), torch.tensor([[1, 1], [1, 0]], dtype=torch.bool)
    return torch.tensor([[4.0, 7.0, 8.0]]), torch.tensor([[1, 0, 0]], dtype=torch.bool)


def random_data(rank: int, empty: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Different batch sizes and widths per rank; ``empty`` gives rank 1 no masked entry at all."""
    gen = torch.Generator().manual_seed(100 + rank)
    rows, width = (3, 7) if rank == 0 else (5, 4)
    x = torch.randn(rows, width, generator=gen) * 3 + 10
    mask = torch.rand(rows, width, generator=gen) > 0.4
    if empty and rank == 1:
        mask[:] = False
    return x, mask


def filter_data(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rewards, group_ids). With [0.25, 0.75]: rank 0 keeps group 2 of {0, 1, 2}; rank 1 keeps both of its groups."""
    if rank == 0:
        return torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0]), torch.tensor([0, 0, 1, 1, 2, 2])
    return torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([0, 0, 1, 1])


def concat_masked(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch from the ranks' batches: right-pad to the widest row with masked-out zeros, stack the rows."""
    width = max(x.shape[1] for x, _ in parts)
    xs = [torch.nn.functional.pad(x, (0, width - x.shape[1])) for x, _ in parts]
    ms = [torch.nn.functional.pad(m, (0, width - m.shape[1]), value=False) for _, m in parts]
    return torch.cat(xs), torch.cat(ms)


# ----- the worker -----

def keep_masks() -> list[torch.Tensor]:
    from zerotir.filters.pass_rate import pass_rate_keep_mask

    return [pass_rate_keep_mask(*filter_data(r), 0.25, 0.75) for r in range(WORLD)]


def _worker(rank: int, port: int, out_dir: str, keeps: list[torch.Tensor]) -> None:
    with gloo_group(rank, WORLD, port, timeout_s=60):
        results = {"is_distributed": D.is_distributed(), "rank_world": D.rank_and_world_size()}
        x, m = hand_data(rank)
        results["hand"] = A.masked_whiten(x, m, all_reduce=D.all_reduce_sum)
        results["hand_stats"] = A.masked_mean_var(x, m, all_reduce=D.all_reduce_sum)
        for name, empty in (("random", False), ("random_empty", True)):
            x, m = random_data(rank, empty)
            results[name] = A.masked_whiten(x, m, all_reduce=D.all_reduce_sum)
            results[name + "_noshift"] = A.masked_whiten(x, m, shift_mean=False, all_reduce=D.all_reduce_sum)
        _, groups = filter_data(rank)
        keep = keeps[rank]
        results["kept_fraction"] = D.global_kept_fraction(keep, groups)
        results["group_counts"] = D.global_group_counts(keep, groups)
        results["mean"] = D.global_mean([1.0, 2.0, 3.0] if rank == 0 else [10.0])
        results["mean_one_empty"] = D.global_mean([] if rank == 0 else [10.0, 20.0])
        results["sum"] = D.global_sum(rank + 1)
        results["max"] = D.global_max(rank * 5)
        results["gathered"] = D.gather_objects({"rank": rank, "text": "r" * (rank + 1)})
        results["errors"] = _errors_on_one_rank(rank)  # the same ranks: one spawn (most of the tests' time)
        save_rank(results, out_dir, rank)


@pytest.fixture(scope="module")
def rank_results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("dist")
    return run_ranks(_worker, (free_port(), str(out), keep_masks()), WORLD, out, SPAWN_TIMEOUT_S)


# ----- two ranks vs one process -----

@pytest.mark.timeout(150)
def test_two_ranks_see_a_process_group(rank_results: list[dict]) -> None:
    assert [r["is_distributed"] for r in rank_results] == [True, True]
    assert [r["rank_world"] for r in rank_results] == [(0, 2), (1, 2)]


def test_hand_worked_whitening(rank_results: list[dict]) -> None:
    # Masked entries over both ranks: 1, 2, 3, 4. Mean 2.5; unbiased variance
    # ((-1.5)^2 + (-0.5)^2 + 0.5^2 + 1.5^2) / (4 - 1) = 5 / 3, std = 1.2909944.
    # Whitened: -1.5 / 1.2909944 = -1.1618950, -0.5 / 1.2909944 = -0.3872983, and +0.3872983, +1.1618950.
    mean, var, count = rank_results[0]["hand_stats"]
    assert float(mean) == pytest.approx(2.5) and float(var) == pytest.approx(5 / 3) and float(count) == 4
    assert torch.allclose(rank_results[0]["hand"], torch.tensor([[-1.1618950, -0.3872983], [0.3872983, 0.0]]))
    assert torch.allclose(rank_results[1]["hand"], torch.tensor([[1.1618950, 0.0, 0.0]]))
    # One rank alone would have whitened 1, 2, 3 to -1, 0, 1: the global statistics really were used.
    assert not torch.allclose(rank_results[0]["hand"], A.masked_whiten(*hand_data(0)))


@pytest.mark.parametrize("name,empty", [("random", False), ("random_empty", True)])
@pytest.mark.parametrize("shift_mean", [True, False])
def test_whitening_equals_one_process_on_the_whole_batch(rank_results: list[dict], name: str, empty: bool,
                                                         shift_mean: bool) -> None:
    parts = [random_data(r, empty) for r in range(WORLD)]
    x, m = concat_masked(parts)
    expected = A.masked_whiten(x, m, shift_mean=shift_mean)
    key = name if shift_mean else name + "_noshift"
    got, _ = concat_masked([(res[key], part[1]) for res, part in zip(rank_results, parts)])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    if shift_mean:  # whitened over the whole batch: mean 0 and variance 1 there (not per rank)
        assert float(A.masked_mean(got, m)) == pytest.approx(0.0, abs=1e-5)
        assert float(A.masked_var(got, m)) == pytest.approx(1.0, abs=1e-4)


def test_kept_fraction_equals_one_process_on_the_whole_batch(rank_results: list[dict]) -> None:
    # Hand-worked: rank 0 keeps 1 of 3 groups (means 1, 0, 0.5), rank 1 keeps 2 of 2 (means 0.5, 0.5): 3 / 5.
    assert [r["kept_fraction"] for r in rank_results] == [0.6, 0.6]
    assert [r["group_counts"] for r in rank_results] == [(3, 5), (3, 5)]
    # One process on the concatenated batch (rank 1's group ids shifted past rank 0's so groups stay distinct).
    from zerotir.filters.pass_rate import pass_rate_keep_mask

    (r0, g0), (r1, g1) = filter_data(0), filter_data(1)
    rewards, groups = torch.cat([r0, r1]), torch.cat([g0, g1 + 3])
    keep = pass_rate_keep_mask(rewards, groups, 0.25, 0.75)
    single = torch.unique(groups[keep]).numel() / torch.unique(groups).numel()
    assert single == pytest.approx(rank_results[0]["kept_fraction"])


def test_means_sums_and_gather(rank_results: list[dict]) -> None:
    # Element-weighted: (1 + 2 + 3 + 10) / 4 = 4 (a mean of rank means would give (2 + 10) / 2 = 6).
    assert [r["mean"] for r in rank_results] == [4.0, 4.0]
    assert [r["mean_one_empty"] for r in rank_results] == [15.0, 15.0]
    assert [r["sum"] for r in rank_results] == [3.0, 3.0]  # (0 + 1) + (1 + 1)
    assert [r["max"] for r in rank_results] == [5.0, 5.0]
    expected = [{"rank": 0, "text": "r"}, {"rank": 1, "text": "rr"}]
    assert [r["gathered"] for r in rank_results] == [expected, expected]


# ----- one process: the local fallback -----

def test_without_process_group_whitening_is_masked_whiten_exactly() -> None:
    assert not D.is_distributed() and D.rank_and_world_size() == (0, 1)
    x, m = random_data(0)
    for shift in (True, False):
        assert torch.equal(A.masked_whiten(x, m, shift_mean=shift, all_reduce=D.all_reduce_sum), A.masked_whiten(x, m, shift_mean=shift))
    mean, var, count = A.masked_mean_var(x, m, all_reduce=D.all_reduce_sum)
    assert float(mean) == pytest.approx(float(A.masked_mean(x, m)), rel=1e-6)
    assert float(var) == pytest.approx(float(A.masked_var(x, m)), rel=1e-5)
    assert float(count) == float(m.sum())
    assert D.global_mean([1.0, 2.0]) == 1.5 and D.global_mean([]) == 0.0
    assert D.global_sum(7) == 7.0 and D.global_max(3) == 3.0 and D.gather_objects("a") == ["a"]
    assert D.global_kept_fraction(torch.tensor([True, True, False]), torch.tensor([0, 0, 1])) == 0.5
    assert D.global_kept_fraction(torch.zeros(0, dtype=torch.bool), torch.zeros(0, dtype=torch.long)) == 1.0


def test_world_of_one_rank_uses_the_local_computation(tmp_path: Path) -> None:
    own = not dist.is_initialized()  # an earlier test's one-rank DeepSpeed group lives as long as the process
    if own:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1,
                                timeout=timedelta(seconds=30))
    try:
        assert dist.get_world_size() == 1
        assert not D.is_distributed() and D.rank_and_world_size() == (0, 1)
        x, m = random_data(1)
        assert torch.equal(A.masked_whiten(x, m, all_reduce=D.all_reduce_sum), A.masked_whiten(x, m))
        assert D.gather_objects(3) == [3]
    finally:
        if own:
            dist.destroy_process_group()


def test_bad_inputs_name_the_problem() -> None:
    with pytest.raises(ValueError, match="bool"):
        D.global_group_counts(torch.tensor([1, 0]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"\(B,\)"):
        D.global_group_counts(torch.ones(2, 2, dtype=torch.bool), torch.zeros(2, 2))
    with pytest.raises(ValueError, match="mask has shape"):
        A.masked_mean_var(torch.zeros(2, 3), torch.zeros(2, 2, dtype=torch.bool), all_reduce=D.all_reduce_sum)


def test_shard_prompts_gives_each_rank_a_contiguous_equal_share() -> None:
    rows = list(range(8))
    shards = [D.shard_prompts(rows, r, 4) for r in range(4)]
    assert shards == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert D.shard_prompts(rows, 0, 1) == rows
    with pytest.raises(ValueError, match="prompts_per_step"):
        D.shard_prompts(list(range(6)), 0, 4)
    with pytest.raises(ValueError, match="rank=4"):
        D.shard_prompts(rows, 4, 4)
    assert math.isclose(len(D.shard_prompts(list(range(128)), 7, 8)), 16)


def test_shard_prompts_with_tensor_parallel_engines_gives_a_group_the_same_share() -> None:
    rows = list(range(8))
    # 8 ranks, TP 4: 2 engines; ranks 0-3 roll out rows 0-3 together, ranks 4-7 rows 4-7.
    shards = [D.shard_prompts(rows, r, 8, tensor_parallel_size=4) for r in range(8)]
    assert shards == [[0, 1, 2, 3]] * 4 + [[4, 5, 6, 7]] * 4
    with pytest.raises(ValueError, match="tensor_parallel_size=3 must divide"):
        D.shard_prompts(rows, 0, 8, tensor_parallel_size=3)
    with pytest.raises(ValueError, match="multiple of devices x num_nodes / tensor_parallel_size = 2"):
        D.shard_prompts(list(range(5)), 0, 8, tensor_parallel_size=4)


def test_training_share_splits_whole_groups_between_the_ranks_of_a_tp_group() -> None:
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 5, 5])  # group positions 0, 1, 2, 3
    assert D.training_share(groups, rank=0, tensor_parallel_size=2).tolist() == [1, 1, 0, 0, 1, 1, 0, 0]
    assert D.training_share(groups, rank=3, tensor_parallel_size=2).tolist() == [0, 0, 1, 1, 0, 0, 1, 1]
    shares = torch.stack([D.training_share(groups, r, 4) for r in range(4)])
    assert shares.sum(0).tolist() == [1] * 8  # every trajectory is trained on by exactly one rank of the group
    assert D.training_share(groups, 5, 1).all()


# ----- an error on one rank stops every rank with the same message (the same 2 gloo ranks) -----


def _health_server() -> str:
    """A sandbox stand-in that answers GET /health with status ok, in a daemon thread; returns its URL."""
    import http.server
    import json
    import threading

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            body = json.dumps({"status": "ok"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"


def _outcome(fn) -> tuple[str, str] | None:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 (the test compares what each rank raised)
        return type(exc).__name__, str(exc)
    return None


def _errors_on_one_rank(rank: int) -> dict:
    """Run by ``_worker`` on each rank: an error raised on one rank, what each rank raised (or returned)."""
    from types import SimpleNamespace

    from zerotir.config import HFRollout, SamplingConfig, SandboxConfig, ToolConfig
    from zerotir.rl.guards import SandboxErrorGuard, check_finite
    from zerotir.rl.update import TrainBatch
    from zerotir.rollout.source import InlineSource

    results = {}
    # The finite-loss check: only rank 1's loss is NaN.
    mask = torch.ones(1, 3, dtype=torch.bool)
    batch = TrainBatch(torch.zeros(1, 3, dtype=torch.long), mask, mask, None, torch.ones(1, 3))
    loss = torch.tensor(float("nan") if rank == 1 else 0.5)
    results["finite"] = _outcome(lambda: check_finite(loss, {"policy_loss": loss}, 7, batch))
    # The sandbox guard: only rank 0's sandbox fails (every execution), patience 1.
    guard = SandboxErrorGuard(max_rate=0.5, patience=1)
    traj = SimpleNamespace(num_calls=torch.tensor([4]), num_sandbox_errors=torch.tensor([4 if rank == 0 else 0]),
                           num_tool_errors=torch.tensor([0]))
    results["guard"] = _outcome(lambda: guard.update(traj, 3, [f"http://sandbox-of-rank-{rank}"]))
    # The sandbox health check at start: rank 1's configured sandbox does not answer.
    url = _health_server() if rank == 0 else f"http://127.0.0.1:{free_port()}"
    source = InlineSource(HFRollout(), SandboxConfig(urls=[url]), ToolConfig(), SamplingConfig(), None, "unused", 0)
    results["health"] = _outcome(lambda: source.start(None, None, "cpu", None))
    # Nothing failed anywhere: nothing is raised, and the block's value comes back.
    guard_ok = SandboxErrorGuard(max_rate=0.5, patience=1)
    ok = SimpleNamespace(num_calls=torch.tensor([4]), num_sandbox_errors=torch.tensor([1]),
                         num_tool_errors=torch.tensor([0]))
    results["no_error"] = guard_ok.update(ok, 1, ["u"])
    return results


@pytest.mark.timeout(150)
def test_an_error_on_one_rank_stops_every_rank_with_the_same_message(rank_results: list[dict]) -> None:
    r0, r1 = (r["errors"] for r in rank_results)
    for key, kind, text in (("finite", "NonFiniteLossError", "RL step 7: the loss is nan"),
                            ("guard", "SandboxFailureError", "http://sandbox-of-rank-0"),
                            ("health", "SandboxUnavailable", "no sandbox server is healthy")):
        assert r0[key] is not None and r0[key] == r1[key], (key, r0[key], r1[key])
        assert r0[key][0] == kind and text in r0[key][1], (key, r0[key])
    assert r0["no_error"] == r1["no_error"] == 0.25
