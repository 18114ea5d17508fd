"""RolloutRuntime's engine calls around a rollout and a weight sync, with a fake engine in sleep mode (the real sleep
mode needs CUDA): sleep(level=2) after the rollout, then weights -> sync -> KV cache. And its start: the free-memory
check of a vLLM engine on CUDA, and a start that fails on one of two gloo ranks stopping both with one message."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from tests.gloo import free_port, run_ranks
from zerotir.config import HFRollout, SandboxConfig, ToolConfig, VLLMRollout
from zerotir.rollout import agent_loop
from zerotir.rollout import runtime as runtime_module
from zerotir.rollout.runtime import RolloutRuntime, check_engine_memory

GIB = 1 << 30


class FakeEngine:
    def __init__(self):
        self.calls: list[tuple] = []

    def sleep(self, level: int = 1) -> None:
        self.calls.append(("sleep", level))

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.calls.append(("wake_up", tuple(tags or ())))

    def update_weights(self, bucket) -> None:
        self.calls.append(("update_weights", tuple(name for name, _ in bucket)))


class Actor(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])


def make_runtime(monkeypatch, sleep_mode: bool) -> RolloutRuntime:
    def rollout_sync(engine, *args, **kwargs):
        engine.calls.append(("generate",))
        return "trajectories", {"generation": 0.0}

    monkeypatch.setattr(agent_loop, "rollout_sync", rollout_sync)
    backend = VLLMRollout(weight_sync_bucket_mb=1, enable_sleep_mode=sleep_mode)
    rt = RolloutRuntime(backend, SandboxConfig(), ToolConfig(), "unused")
    rt.sandbox = object()
    return rt


def test_sleep_mode_releases_after_rollout_and_wakes_weights_before_kv_cache(monkeypatch):
    runtime = make_runtime(monkeypatch, sleep_mode=True)
    runtime.engine = engine = FakeEngine()
    runtime.stale = False
    assert runtime.rollout(None, [[1]], ["1"], None) == ("trajectories", {"generation": 0.0})
    assert engine.calls == [("generate",), ("sleep", 2)] and runtime.asleep and runtime.stale
    with pytest.raises(RuntimeError, match="sleeps; call sync"):
        runtime.rollout(None, [[1]], ["1"], None)
    engine.calls.clear()
    runtime.sync(Actor())
    weights = ("layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias")
    assert engine.calls == [("wake_up", ("weights",)), ("update_weights", weights), ("wake_up", ("kv_cache",))]
    assert not runtime.asleep and not runtime.stale
    runtime.rollout(None, [[1]], ["1"], None)  # awake again
    assert engine.calls[-2:] == [("generate",), ("sleep", 2)]


def test_without_sleep_mode_the_engine_is_never_put_to_sleep(monkeypatch):
    runtime = make_runtime(monkeypatch, sleep_mode=False)
    runtime.engine = engine = FakeEngine()
    runtime.rollout(None, [[1]], ["1"], None)
    runtime.sync(Actor())
    assert [c[0] for c in engine.calls] == ["generate", "update_weights"] and not runtime.asleep


def test_without_tools_no_sandbox_is_started(monkeypatch):
    """``max_tool_calls: 0`` (the ZeroRL baseline) runs no code: the embedded sandbox is never started."""
    import sandbox

    def refuse(**kwargs):
        raise AssertionError("the embedded sandbox was started for a run without tools")

    monkeypatch.setattr(sandbox, "local_sandbox", refuse)
    monkeypatch.setattr(runtime_module, "create_engine", lambda *args: FakeEngine())
    rt = RolloutRuntime(HFRollout(), SandboxConfig(), ToolConfig(max_tool_calls=0), "unused")
    rt.start(Actor(), None, "cpu")
    assert rt.started and rt.sandbox is None and rt.urls == []
    rt.close()


def test_engine_memory_check_names_the_field_and_a_utilization_that_fits():
    check_engine_memory(40 * GIB, 80 * GIB, 0.5, "cuda:0")  # exactly the share: vLLM starts
    with pytest.raises(ValueError, match=r"model.rollout.init_args.gpu_memory_utilization=0.5: the vLLM engine on "
                                         r"cuda:1 needs 40.00 GiB .* only 30.00 GiB are free.*at most 0.37"):
        check_engine_memory(30 * GIB, 80 * GIB, 0.5, "cuda:1")


def test_start_checks_free_memory_before_building_a_vllm_engine_on_cuda(monkeypatch):
    built, asked = [], []
    monkeypatch.setattr(runtime_module, "create_engine", lambda *args: built.append(args[3]) or FakeEngine())
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: asked.append(device) or (10 * GIB, 80 * GIB))
    rt = RolloutRuntime(VLLMRollout(gpu_memory_utilization=0.5), SandboxConfig(), ToolConfig(max_tool_calls=0), "x")
    with pytest.raises(ValueError, match=r"gpu_memory_utilization=0.5: the vLLM engine on cuda:0 needs 40.00 GiB"):
        rt.start(Actor(), None, torch.device("cuda:0"))
    assert built == [] and not rt.started
    RolloutRuntime(VLLMRollout(gpu_memory_utilization=0.1), SandboxConfig(), ToolConfig(max_tool_calls=0),
                   "x").start(Actor(), None, torch.device("cuda:0"))  # 8 GiB of the 10 free: fits
    assert built == [torch.device("cuda:0")] and len(asked) == 2
    RolloutRuntime(HFRollout(), SandboxConfig(), ToolConfig(max_tool_calls=0), "x").start(Actor(), None, "cuda:0")
    assert len(built) == 2 and len(asked) == 2  # the transformers engine wraps the actor: no vLLM share to check


def _start_on_two_ranks(rank: int, port: int, out_dir: str) -> None:
    """Rank 1 alone has too little free GPU memory, then rank 1 alone fails to build its engine: each time both
    ranks must leave ``start`` with rank 1's error (without it rank 0 would go on into its next collective)."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=60))
    built: list[int] = []

    def create_engine(*args):
        if rank == 1:
            raise RuntimeError("rank 1 could not build its engine")
        built.append(rank)
        return FakeEngine()

    runtime_module.create_engine = create_engine
    torch.cuda.mem_get_info = lambda device: ((10 if rank == 1 else 60) * GIB, 80 * GIB)
    results = {}
    for name, backend in (("memory", VLLMRollout(gpu_memory_utilization=0.5)), ("build", HFRollout())):
        rt = RolloutRuntime(backend, SandboxConfig(), ToolConfig(max_tool_calls=0), "unused")
        try:
            rt.start(Actor(), None, torch.device("cuda:0"))
            results[name] = ("started", rt.started, list(built))
        except Exception as exc:  # noqa: BLE001 - the test compares what each rank raised
            results[name] = (type(exc).__name__, str(exc), list(built))
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.timeout(180)
def test_a_start_failing_on_one_rank_stops_both_with_its_message(tmp_path):
    ranks = run_ranks(_start_on_two_ranks, (free_port(), str(tmp_path)), 2, tmp_path, timeout_s=150)
    memory = [r["memory"] for r in ranks]
    assert memory[0] == memory[1] and memory[0][0] == "ValueError" and memory[0][2] == []  # nobody built anything
    assert "gpu_memory_utilization=0.5: the vLLM engine on cuda:0 needs 40.00 GiB" in memory[0][1]
    build = [r["build"] for r in ranks]
    assert build[0][:2] == build[1][:2] == ("RuntimeError", "rank 1 could not build its engine")
    assert build[0][2] == [0] and build[1][2] == []  # rank 0 had built its engine, and still stopped
