"""The rollout sources' calls around a step, with a fake engine: the in-line source gives the engine the actor's
weights at start, lets it rest after a training batch (not after an evaluation batch) and gives it the new weights
after each update, stamping versions; its tools are built and started once, and closed with it; its start reaches no
sandbox without the python tool (and fails fast when the python tool's sandbox does not answer) and checks a vLLM
engine's free
memory before building it, and a start that fails on one of two gloo ranks stops both with one message. The
pipeline's thread host refuses the trainers it cannot serve, naming the fix."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.gloo import gloo_group, run_ranks, save_rank
from tests.ports import free_port
from tests.rl.update_world import make_traj
from tests.scripted_source import FixedStream
from zerotir.config import (
    HFRollout, HostsConfig, SamplingConfig, SandboxConfig, ToolConfig, VLLMRollout,
)
from zerotir.fleet.source import FleetSource
from zerotir.fleet.thread_host import ThreadTransport
from zerotir.rollout import source as source_module
from zerotir.rollout.engine import SamplingParams
from zerotir.rollout.engines import check_engine_memory
from zerotir.rollout.source import InlineSource
from zerotir.sources import make_rollout_source

GIB = 1 << 30
NO_TOOLS = ToolConfig(max_tool_calls=0)
ROWS = [{"id": "a", "problem": "1+1", "answer": "2", "prompt_text": "1+1", "prompt_ids": [1, 2], "source": "s",
         "batch_index": 5, "position": 2}]
# Stream batch 5 of 4 prompts, ROWS its third: rank 2 of 4 trains it alone (its share starts at row 2).
BATCH_5 = [{**ROWS[0], "id": f"other-{p}", "position": p} for p in (0, 1, 3)]
BATCH_5.insert(2, ROWS[0])


class FakeEngine:
    """Records what the source asks of it."""

    def __init__(self):
        self.calls: list[tuple] = []

    def load_weights_from(self, actor: nn.Module) -> None:
        self.calls.append(("load_weights_from", actor))

    def rest(self) -> None:
        self.calls.append(("rest",))

    def close(self) -> None:
        self.calls.append(("close",))


class Actor(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(2, 2)


def started_source(monkeypatch, tool: ToolConfig = NO_TOOLS, toolboxes: list | None = None,
                   ) -> tuple[InlineSource, FakeEngine, Actor, list]:
    seeds: list[int] = []

    def rollout_sync(engine, tokenizer, sandbox, prompts, params, *args, tools=None, on_end=None):
        engine.calls.append(("rollout",))
        seeds.append(params.seed)
        if toolboxes is not None:
            toolboxes.append(tools)
        return make_traj([1.0, 0.0], [0, 0]), {"generation": 0.0}

    engine = FakeEngine()
    monkeypatch.setattr(source_module, "rollout_sync", rollout_sync)
    monkeypatch.setattr(source_module, "create_engine", lambda *args, **kwargs: engine)
    source = InlineSource(HFRollout(), SandboxConfig(), tool, SamplingConfig(n=2), None, "unused", seed=10)
    actor = Actor()
    source.start(actor, None, "cpu", FixedStream(lambda b: BATCH_5, 4))
    return source, engine, actor, seeds


def test_inline_source_rests_after_a_training_batch_and_loads_the_update(monkeypatch):
    source, engine, actor, seeds = started_source(monkeypatch)
    assert engine.calls == [("load_weights_from", actor)]  # at start: a resumed actor, or a separate engine
    monkeypatch.setattr(source_module, "rank_and_world_size", lambda: (2, 4))
    batch = source.batch(3)
    assert engine.calls[1:] == [("rollout",), ("rest",)]
    assert seeds == [10 + 5 + 1 + 2 * 2]  # the run's seed + the batch index + 1 + the first row's place x n
    versions = batch.trajectories.versions[batch.trajectories.action_mask]
    assert versions.numel() and bool((versions == 2).all())  # in line: the trainer's weights, 2 updates done
    assert batch.rows == ROWS and batch.sandbox == []  # no tools: no sandbox started, none named
    assert batch.taken == [(5, p) for p in range(4)]  # every rank's rows of the batch: the data position
    engine.calls.clear()
    assert source.after_update(actor, 3) >= 0.0
    source.evaluate(ROWS, SamplingParams(n=2, seed=0))
    assert engine.calls == [("load_weights_from", actor), ("rollout",)]  # evaluation leaves the engine awake
    source.close()
    source.close()  # idempotent: the engine is closed once, at once (not left to the garbage collector)
    assert engine.calls[-2:] == [("rollout",), ("close",)] and source.engine is None


def test_without_tools_no_sandbox_is_started(monkeypatch):
    """``max_tool_calls: 0`` (the ZeroRL baseline) runs no code: the embedded sandbox is never started."""
    import sandbox

    def refuse(**kwargs):
        raise AssertionError("the embedded sandbox was started for a run without tools")

    monkeypatch.setattr(sandbox, "local_sandbox", refuse)
    source, _, _, _ = started_source(monkeypatch)
    assert source.toolbox.entries == [] and source.sandbox_names == []
    source.close()


CALCULATOR = ToolConfig(format="hermes", tools=[{"class_path": "calculator"}])


def test_a_calculator_only_run_starts_no_sandbox(monkeypatch):
    """Only the python tool starts or reaches a sandbox: with the calculator alone no server starts, none is
    reached, and none is named."""
    import sandbox

    from zerotir.tools.sandbox_service import SandboxService

    def refuse(*args, **kwargs):
        raise AssertionError("a sandbox was started or reached for a run without the python tool")

    monkeypatch.setattr(sandbox, "local_sandbox", refuse)
    monkeypatch.setattr(SandboxService, "start", refuse)
    source, _, _, _ = started_source(monkeypatch, CALCULATOR)
    assert source.toolbox.names == ["calculator"]
    assert source.batch(1).sandbox == [] and source.sandbox_names == []
    source.close()


def test_the_toolbox_is_built_and_started_once_per_source_and_closed_with_it(monkeypatch):
    """Two steps and an evaluation roll out over the one toolbox the source built and started at start."""
    from zerotir.tools import Toolbox

    life: list[str] = []

    class Counted(Toolbox):
        @classmethod
        def build(cls, *args, **kwargs):
            life.append("build")
            return super().build(*args, **kwargs)

        def start(self):
            life.append("start")
            super().start()

        def close(self):
            life.append("close")
            super().close()

    monkeypatch.setattr(source_module, "Toolbox", Counted)
    used: list = []
    source, _, actor, _ = started_source(monkeypatch, CALCULATOR, used)
    source.batch(1)
    source.after_update(actor, 1)
    source.batch(2)
    source.evaluate(ROWS, SamplingParams(n=2, seed=0))
    assert life == ["build", "start"] and len(used) == 3 and all(box is source.toolbox for box in used)
    assert used[0].started and used[0].names == ["calculator"]
    source.close()
    source.close()
    assert life == ["build", "start", "close"] and not used[0].started


def test_the_python_tool_fails_fast_when_its_sandbox_does_not_answer():
    """``model.tool.sandbox.urls`` pointing nowhere: the source's start raises the sandbox's own message, naming
    the URL and the fix, before any engine is built."""
    from sandbox import SandboxUnavailable

    url = f"http://127.0.0.1:{free_port()}"
    tool = ToolConfig(sandbox=SandboxConfig(urls=[url], retries=0))
    source = InlineSource(HFRollout(), tool.sandbox, tool, SamplingConfig(), None, "unused", 0)
    with pytest.raises(SandboxUnavailable, match=rf"{url}.*python -m sandbox serve"):
        source.start(Actor(), None, "cpu", None)
    assert source.engine is None and source.toolbox is None


def test_engine_memory_check_names_the_field_and_a_utilization_that_fits():
    check_engine_memory(40 * GIB, 80 * GIB, 0.5, "cuda:0")  # exactly the share: vLLM starts
    with pytest.raises(ValueError, match=r"model.rollout.init_args.gpu_memory_utilization=0.5: the vLLM engine on "
                                         r"cuda:1 needs 40.00 GiB .* only 30.00 GiB are free.*at most 0.37"):
        check_engine_memory(30 * GIB, 80 * GIB, 0.5, "cuda:1")


def test_start_checks_free_memory_before_building_a_vllm_engine_on_cuda(monkeypatch):
    built, asked = [], []
    monkeypatch.setattr(source_module, "create_engine", lambda *args, **kw: built.append(args[3]) or FakeEngine())
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: asked.append(device) or (10 * GIB, 80 * GIB))

    def source(backend):
        return InlineSource(backend, SandboxConfig(), NO_TOOLS, SamplingConfig(), None, "x", 0)

    rt = source(VLLMRollout(gpu_memory_utilization=0.5))
    with pytest.raises(ValueError, match=r"gpu_memory_utilization=0.5: the vLLM engine on cuda:0 needs 40.00 GiB"):
        rt.start(Actor(), None, torch.device("cuda:0"), None)
    assert built == [] and rt.engine is None
    source(VLLMRollout(gpu_memory_utilization=0.1)).start(Actor(), None, torch.device("cuda:0"), None)  # 8 of 10 GiB
    assert built == [torch.device("cuda:0")] and len(asked) == 2
    source(HFRollout()).start(Actor(), None, "cuda:0", None)
    assert len(built) == 2 and len(asked) == 2  # the transformers engine wraps the actor: no vLLM share to check


def test_the_pipelines_thread_host_refuses_trainers_it_cannot_serve():
    hosts = HostsConfig(max_staleness=1)
    source = make_rollout_source(hosts, HFRollout(), SandboxConfig(), NO_TOOLS, SamplingConfig(),
                                 None, "x", 0)
    assert isinstance(source, FleetSource) and isinstance(source.transport, ThreadTransport)
    source.check_trainer(1, zero3=False)
    with pytest.raises(ValueError, match=r"max_staleness with 2 training processes.*max_staleness: null"):
        source.check_trainer(2, zero3=False)
    with pytest.raises(ValueError, match=r"ZeRO-3.*rollout fleet \(model.hosts.engines >= 1\), use ZeRO stage 1 / 2"):
        source.check_trainer(1, zero3=True)
    inline = make_rollout_source(HostsConfig(), HFRollout(), SandboxConfig(), NO_TOOLS,
                                 SamplingConfig(), None, "x", 0)
    assert isinstance(inline, InlineSource)
    streamed = make_rollout_source(HostsConfig(max_staleness=1, max_in_flight=8), HFRollout(), SandboxConfig(),
                                   NO_TOOLS, SamplingConfig(), None, "x", 0)
    assert streamed.fleet.max_in_flight == 8 and streamed.steps_take == "rows"  # the thread host streams
    with pytest.raises(ValueError, match=r"model.hosts.max_in_flight=8 with model.hosts.max_staleness: null.*set "
                                         r"model.hosts.max_staleness"):
        make_rollout_source(HostsConfig(max_in_flight=8), HFRollout(), SandboxConfig(), NO_TOOLS,
                            SamplingConfig(), None, "x", 0)
    inline.check_trainer(8, zero3=False)  # an engine of the trainer's own on every rank
    inline.check_trainer(1, zero3=True)
    with pytest.raises(ValueError, match=r"HFRollout with DeepSpeed ZeRO-3 on 8 ranks.*deadlock"):
        inline.check_trainer(8, zero3=True)  # the transformers engine decodes with the partitioned actor


def _start_on_two_ranks(rank: int, port: int, out_dir: str) -> None:
    """Rank 1 alone has too little free GPU memory, then rank 1 alone fails to build its engine: each time both
    ranks must leave ``start`` with rank 1's error (without it rank 0 would go on into its next collective)."""
    with gloo_group(rank, 2, port):
        built: list[int] = []

        def create_engine(*args, **kwargs):
            if rank == 1:
                raise RuntimeError("rank 1 could not build its engine")
            built.append(rank)
            return FakeEngine()

        source_module.create_engine = create_engine
        torch.cuda.mem_get_info = lambda device: ((10 if rank == 1 else 60) * GIB, 80 * GIB)
        results = {}
        for name, backend in (("memory", VLLMRollout(gpu_memory_utilization=0.5)), ("build", HFRollout())):
            rt = InlineSource(backend, SandboxConfig(), NO_TOOLS, SamplingConfig(), None, "unused", 0)
            try:
                rt.start(Actor(), None, torch.device("cuda:0"), None)
                results[name] = ("started", rt.engine is not None, list(built))
            except Exception as exc:  # noqa: BLE001 - the test compares what each rank raised
                results[name] = (type(exc).__name__, str(exc), list(built))
        save_rank(results, out_dir, rank)


@pytest.mark.timeout(180)
def test_a_start_failing_on_one_rank_stops_both_with_its_message(tmp_path):
    ranks = run_ranks(_start_on_two_ranks, (free_port(), str(tmp_path)), 2, tmp_path, timeout_s=150)
    memory = [r["memory"] for r in ranks]
    assert memory[0] == memory[1] and memory[0][0] == "ValueError" and memory[0][2] == []  # nobody built anything
    assert "gpu_memory_utilization=0.5: the vLLM engine on cuda:0 needs 40.00 GiB" in memory[0][1]
    build = [r["build"] for r in ranks]
    assert build[0][:2] == build[1][:2] == ("RuntimeError", "rank 1 could not build its engine")
    assert build[0][2] == [0] and build[1][2] == []  # rank 0 had built its engine, and still stopped
