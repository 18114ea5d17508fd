"""RolloutRuntime's engine calls around a rollout and a weight sync, with a fake engine in sleep mode (the real sleep
mode needs CUDA): sleep(level=2) after the rollout, then weights -> sync -> KV cache."""

from __future__ import annotations

import pytest
from torch import nn

from zerotir.config import HFRollout, SandboxConfig, ToolConfig, VLLMRollout
from zerotir.rollout import agent_loop
from zerotir.rollout import runtime as runtime_module
from zerotir.rollout.runtime import RolloutRuntime


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
