"""An engine host without Ray: an ``EngineHost`` in a spawned process joins a weight group whose sender is this test
process, receives one push and then decodes greedily exactly as the sender's model does.

The host loads the tiny model of ``tiny_dir`` (the conftest's folder); the sender loads the same folder and moves
every parameter, so the host's greedy rollout changes with the push (checked against its rollout before it). Bad
settings and calls out of order are refused in this process, naming the setting or the call to make first.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.gloo import spawned
from tests.ports import free_port

from zerotir.config import HFRollout, ToolConfig
from zerotir.fleet.engine_host import EngineHost, HostSettings, JobsLost, combine_occupancy, stream_occupancy
from zerotir.fleet.stream import GroupStream, StreamStats
from zerotir.fleet.weight_group import GroupAddress, form_weight_group
from zerotir.fleet.weight_push import WeightSender
from zerotir.models import freeze, load_causal_lm, load_tokenizer
from zerotir.rollout.agent_loop import rollout_sync
from zerotir.rollout.engine import SamplingParams
from zerotir.rollout.engines import _hf_engine, create_engine
from zerotir.rollout.hf_engine import HFEngine
from zerotir.parallel.weight_sync import sync_weights
from zerotir.types import Trajectories

PROMPTS = ["Hello", "2+3="]
GREEDY = SamplingParams(n=1, temperature=0.0, max_new_tokens=12, seed=0)
NO_TOOL = ToolConfig(max_tool_calls=0)  # no sandbox: nothing to start or reach
GROUP_TIMEOUT_S = 240.0  # hang guards: the spawned host imports torch and builds its engine first
SPAWN_TIMEOUT_S = 300.0
VERSION = 7


@dataclass(frozen=True)
class SeedRecordingRollout(HFRollout):
    """The transformers engine, recording the prompt and the seed of every request it gets."""


class SeedRecordingEngine:
    def __init__(self, engine: Any):
        self._engine = engine
        self.seeds: dict[tuple[int, ...], set[int]] = {}  # prompt ids -> the seeds of its requests

    def submit(self, key: Any, ids: list[int], params: SamplingParams) -> None:
        self.seeds.setdefault(tuple(ids), set()).add(params.seed)
        self._engine.submit(key, ids, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


@create_engine.register
def _seed_recording_engine(backend: SeedRecordingRollout, *args: Any, **kwargs: Any) -> SeedRecordingEngine:
    return SeedRecordingEngine(_hf_engine(backend, *args, **kwargs))


def host_settings(folder: Path | str) -> HostSettings:
    return HostSettings(str(folder), HFRollout(), NO_TOOL, seed=0, threads=1)


def prompt_ids(folder: Path | str) -> list[list[int]]:
    tok = load_tokenizer(folder)
    return [tok.encode(p) for p in PROMPTS]


def sender_model(folder: Path | str, seed: int) -> torch.nn.Module:
    """The folder's model with every parameter moved, as an update would."""
    model = freeze(load_causal_lm(folder))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return model


def sampled_ids(traj: Trajectories) -> list[list[int]]:
    """The ids the engine sampled, row by row."""
    return [ids[mask].tolist() for ids, mask in zip(traj.input_ids, traj.action_mask)]


def local_greedy(model: torch.nn.Module, folder: Path | str) -> list[list[int]]:
    """The sender's model through the same tool loop, in this process."""
    tok = load_tokenizer(folder)
    traj, _ = rollout_sync(HFEngine(model, tok, num_threads=1), tok, None, prompt_ids(folder), GREEDY, NO_TOOL, None)
    return sampled_ids(traj)


def _host(rank: int, port: int, folder: str, out: str) -> None:
    host = EngineHost(host_settings(folder))
    before, _ = host.roll_out(prompt_ids(folder), None, GREEDY)
    host.join_weights(GroupAddress("127.0.0.1", port), 1, 2, GROUP_TIMEOUT_S)
    version = host.receive_weights()
    after, timings = host.roll_out(prompt_ids(folder), ["5", "5"], GREEDY)
    params = {name: p.detach().clone() for name, p in host.engine.model.named_parameters()}
    stopped = host.receive_weights()
    host.close()
    torch.save({"before": before, "version": version, "after": after, "timings": timings, "params": params,
                "stopped": stopped, "group_after_stop": host.group}, Path(out) / "host.pt")


@pytest.fixture(scope="module")
def pushed(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, torch.nn.Module]:
    """The host's results after one push (version 7) from this process, and the model pushed."""
    out, port = tmp_path_factory.mktemp("host"), free_port()
    with spawned(_host, (port, str(tiny_dir), str(out)), 1, SPAWN_TIMEOUT_S):  # a host failure raises here
        model = sender_model(tiny_dir, seed=3)
        sender = WeightSender(form_weight_group(GroupAddress("127.0.0.1", port), 0, 2, "cpu", GROUP_TIMEOUT_S))
        with sender.push(VERSION):
            sync_weights(model, sender, bucket_bytes=1)  # a bucket per layer
        sender.stop()
    return torch.load(out / "host.pt", weights_only=False), model


@pytest.mark.timeout(600)
def test_a_host_decodes_as_the_sender_after_a_push(pushed: tuple[dict, torch.nn.Module], tiny_dir: Path) -> None:
    got, model = pushed
    want = local_greedy(model, tiny_dir)
    assert [len(ids) for ids in want] == [12, 12]
    assert got["version"] == VERSION
    assert sampled_ids(got["after"]) == want
    assert sampled_ids(got["before"]) != want  # the folder's weights decode otherwise: the push made the difference
    sender = dict(model.named_parameters())
    assert got["params"].keys() == sender.keys()
    assert all(torch.equal(got["params"][name], sender[name]) for name in sender)


def test_tokens_after_a_push_carry_its_version(pushed: tuple[dict, torch.nn.Module]) -> None:
    got, _ = pushed
    after, before = got["after"], got["before"]
    assert before.versions is None  # the folder's weights: no push yet
    assert torch.equal(after.versions, torch.where(after.action_mask, VERSION, -1))
    assert after.input_ids.device.type == "cpu" and after.ground_truths == ["5", "5"]
    assert float(after.rewards.abs().sum()) == 0.0  # the trainer scores them
    assert set(got["timings"]) >= {"generation", "sandbox"}  # the reward time is the trainer's


def test_the_senders_stop_ends_the_hosts_group(pushed: tuple[dict, torch.nn.Module]) -> None:
    got, _ = pushed
    assert got["stopped"] is None and got["group_after_stop"] is None


def test_bad_settings_are_refused_naming_them(tiny_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"HostSettings.sandbox_urls is empty but model.tool.tools include python"):
        EngineHost(HostSettings(str(tiny_dir), HFRollout(), ToolConfig(max_tool_calls=4)))
    with pytest.raises(FileNotFoundError, match=r"HostSettings.model_path=.*no config.json"):
        EngineHost(host_settings(tmp_path))
    with pytest.raises(ValueError, match=r"HostSettings.threads=0"):
        EngineHost(HostSettings(str(tiny_dir), HFRollout(), NO_TOOL, threads=0))
    with pytest.raises(TypeError, match=r"HostSettings.rollout="):
        EngineHost(HostSettings(str(tiny_dir), "hf", NO_TOOL))  # type: ignore[arg-type]


@pytest.mark.timeout(60)
def test_calls_out_of_order_say_what_to_call_first(tiny_dir: Path) -> None:
    host = EngineHost(host_settings(tiny_dir))
    with pytest.raises(RuntimeError, match="before join_weights"):
        host.receive_weights()
    with pytest.raises(ValueError, match="rank 0 is the trainer's sender"):
        host.join_weights(GroupAddress("127.0.0.1", free_port()), 0, 2, 1.0)
    host.close()
    host.close()  # idempotent
    with pytest.raises(RuntimeError, match="EngineHost is closed"):
        host.roll_out(prompt_ids(tiny_dir), None, GREEDY)


@pytest.mark.timeout(60)
def test_a_host_never_collects_jobs_another_host_queued(tiny_dir: Path) -> None:
    """A restarted actor gets a ``collect`` whose ``queue`` ran on the process that died: its keys are that
    process's, so the call fails as lost jobs (recovered as the engine's death) instead of waiting for, or taking, a
    job of its own that happens to have the same number."""
    first, second = EngineHost(host_settings(tiny_dir)), EngineHost(host_settings(tiny_dir))
    try:
        queued = first.queue([(prompt_ids(tiny_dir), None, GREEDY)])
        assert [key[1] for key in second.queue([(prompt_ids(tiny_dir), None, GREEDY)])[0]] == \
            [key[1] for key in queued[0]]
        with pytest.raises(JobsLost, match="queued on engine process .*, not this one"):
            second.collect(queued, 0)
        traj, _ = first.collect(queued, 0)
        assert sampled_ids(traj) == local_greedy(load_causal_lm(tiny_dir), tiny_dir)
    finally:
        first.close()
        second.close()


@pytest.mark.timeout(60)
def test_a_streaming_host_samples_each_prompt_of_a_call_with_its_rows_seed(tiny_dir: Path) -> None:
    """Three prompts in one call, n = 2, seed 100: prompt i is a job of its own, and its trajectories sample with
    the seeds its rows have in the batch, 100 + 2i and 100 + 2i + 1; no two prompts share one."""
    host = EngineHost(HostSettings(str(tiny_dir), SeedRecordingRollout(), NO_TOOL, threads=1, max_in_flight=8,
                                   own_process=False))
    tok = load_tokenizer(tiny_dir)
    prompts = [tok.encode(p) for p in ("Hello", "2+3=", "x")]
    try:
        traj, _ = host.roll_out(prompts, None, SamplingParams(n=2, temperature=1.0, max_new_tokens=4, seed=100))
    finally:
        seeds = host.engine.seeds
        host.close()
    assert traj.group_ids.tolist() == [0, 0, 1, 1, 2, 2]
    assert [seeds[tuple(p)] for p in prompts] == [{100, 101}, {102, 103}, {104, 105}]


@pytest.mark.timeout(60)
def test_calls_queued_together_reach_the_stream_in_one_submit(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two calls queued at once: every job of both in one submit (the stream admits them in one turn), each call
    collected on its own, its groups in its row order with its rows' seeds."""
    submits: list[int] = []
    submit = GroupStream.submit
    monkeypatch.setattr(GroupStream, "submit", lambda self, jobs: submits.append(len(jobs)) or submit(self, jobs))
    host = EngineHost(HostSettings(str(tiny_dir), SeedRecordingRollout(), NO_TOOL, threads=1, max_in_flight=8,
                                   own_process=False))
    tok = load_tokenizer(tiny_dir)
    first, second = [tok.encode(p) for p in ("Hello", "x")], [tok.encode("2+3=")]
    try:
        queued = host.queue([(first, None, SamplingParams(n=2, temperature=1.0, max_new_tokens=4, seed=10)),
                             (second, None, SamplingParams(n=2, temperature=1.0, max_new_tokens=4, seed=50))])
        got = [host.collect(queued, i) for i in (1, 0)]
    finally:
        seeds = host.engine.seeds
        host.close()
    assert submits == [3] and [len(q) for q in queued] == [2, 1]
    assert got[0][0].group_ids.tolist() == [0, 0] and got[1][0].group_ids.tolist() == [0, 0, 1, 1]
    assert [seeds[tuple(p)] for p in [*first, *second]] == [{10, 11}, {12, 13}, {50, 51}]


def test_the_hosts_figures_average_their_shares_of_time_and_add_up_their_counts():
    each = [{"busy": 0.5, "fill": 0.25, "aborted_groups": 1.0, "aborted_tokens": 30.0},
            {"busy": 1.0, "fill": 0.75, "aborted_groups": 2.0, "aborted_tokens": 12.0}]
    assert combine_occupancy(each) == {"fleet_busy": 0.75, "fleet_fill": 0.5, "fleet_aborted_groups": 3.0,
                                       "fleet_aborted_tokens": 42.0}


def test_a_streams_fill_while_work_waits_divides_by_the_waiting_seconds_alone():
    """Hand-worked: 100 s of wall, 2 s of it with a group waiting while 3 of a room of 4 trajectories ran (a group of
    2 did not fit): fill 60 / (100 x 4) over all the time, 6 / (2 x 4) while work waited."""
    stats = StreamStats(wall=100.0, busy=50.0, trajectory_seconds=60.0, waiting=2.0, trajectory_seconds_waiting=6.0,
                        aborted_groups=1, aborted_tokens=7)
    assert stream_occupancy(stats, 4) == {"busy": 0.5, "fill": 0.15, "fill_waiting": 0.75, "aborted_groups": 1.0,
                                          "aborted_tokens": 7.0}
    assert stream_occupancy(StreamStats(wall=10.0, busy=10.0, trajectory_seconds=40.0), 4)["fill_waiting"] == 1.0
    assert stream_occupancy(stats, 0) == {"busy": 0.5}  # whole shares: no room to fill
