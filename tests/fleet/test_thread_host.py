"""The pipeline's engine host in a thread of the trainer's process (``zerotir.fleet.thread_host``), no Ray: the
fleet's source over ``ThreadTransport`` on the tiny model of ``tiny_dir``.

At S = 1 the host generates the next batch while the trainer takes this one and updates (the next batch held at a
gate, ``tests.fleet.gated_engine``); the push lands after it, and its tokens keep the version they were sampled
with. An engine that fails ends the trainer's wait with its error, naming the host and what it was doing; a host that
makes no progress is a timeout naming ``model.hosts.timeout_s``; ``close`` ends a rollout in flight at its
next engine step. The host's threads are its engine's: torch's process-wide count is left as it was.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.fleet.gated_engine import STREAM, GatedRollout, s1_with_batch_2_held
from tests.fleet.held_engine import HeldRollout, abort_at_push_2, held_rows
from tests.fleet.test_engine_host import NO_TOOL, sender_model
from tests.scripted_source import FixedStream

from zerotir.config import HostsConfig, HFRollout, SamplingConfig, SandboxConfig
from zerotir.fleet.engine_host import EngineHost, HostSettings
from zerotir.fleet.source import FleetSource
from zerotir.fleet.thread_host import ThreadHost, ThreadTransport
from zerotir.fleet.versioned import RolloutsStopped
from zerotir.models import load_tokenizer
from zerotir.rollout.engine import SamplingParams
from zerotir.rollout.engines import _hf_engine, create_engine


@dataclass(frozen=True)
class BrokenRollout(HFRollout):
    """The transformers engine whose steps raise (``broken``), each taking ``step_s`` seconds."""

    broken: bool = True
    step_s: float = 0.0


class BrokenEngine:
    def __init__(self, engine: Any, backend: BrokenRollout):
        self._engine, self._backend, self.steps = engine, backend, 0
        self.prompts: list[list[int]] = []  # the prompt of every request, in the order the engine got them

    def submit(self, key: Any, ids: list[int], params: Any) -> None:
        self.prompts.append(list(ids))
        self._engine.submit(key, ids, params)

    def step(self) -> Any:
        self.steps += 1
        time.sleep(self._backend.step_s)
        if self._backend.broken:
            raise RuntimeError("the engine broke")
        return self._engine.step()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


@create_engine.register
def _broken_engine(backend: BrokenRollout, *args: Any, **kwargs: Any) -> BrokenEngine:
    return BrokenEngine(_hf_engine(backend, *args, **kwargs), backend)


def _source(tiny_dir: Path, backend: HFRollout, max_staleness: int, timeout_s: float = 60.0,
            max_in_flight: int = 0) -> FleetSource:
    source = FleetSource(HostsConfig(max_staleness=max_staleness, timeout_s=timeout_s, max_in_flight=max_in_flight),
                         backend, SandboxConfig(), NO_TOOL,
                         SamplingConfig(n=1, max_response_tokens=4), None, str(tiny_dir), 0, ThreadTransport())
    source.start(sender_model(tiny_dir, seed=1), load_tokenizer(tiny_dir), "cpu", STREAM)
    return source


@pytest.mark.timeout(120)
def test_s1_trains_step_k_while_the_thread_host_generates_batch_k_plus_1(tiny_dir: Path, tmp_path: Path) -> None:
    threads = torch.get_num_threads()
    source = _source(tiny_dir, GatedRollout(gate=str(tmp_path)), max_staleness=1)
    try:
        assert isinstance(source.hosts[0], ThreadHost) and torch.get_num_threads() == threads
        actor = s1_with_batch_2_held(source, tmp_path)  # the copy lands after batch 1's rollout: one call at a time
        assert source.stats()["push_mb"] > 0
        assert torch.equal(source.hosts[0].host.engine.model.lm_head.weight, actor.lm_head.weight)
    finally:
        (tmp_path / "released").touch()
        source.close()
    assert source.hosts == [] and torch.get_num_threads() == threads


@pytest.mark.timeout(120)
def test_the_thread_host_streams_at_s1_within_the_staleness_bound(tiny_dir: Path) -> None:
    """Streaming (model.hosts.max_in_flight) through the thread host: each step takes prompt groups as they end,
    its rows recorded one by one, every sampled token at most S = 1 versions old, and the update reaches the engine
    while the next batch streams."""
    source = _source(tiny_dir, HFRollout(), max_staleness=1, max_in_flight=1)
    try:
        actor = source._actor
        first = source.batch(1)
        assert first.taken == [(0, 0), (0, 1)] and first.trajectories.group_ids.tolist() == [0, 1]
        with torch.no_grad():
            actor.lm_head.weight.add_(1.0)  # step 1's update
        source.after_update(actor, 1)
        second = source.batch(2)
        assert second.taken == [(1, 0), (1, 1)] and source.version == 1
        for step, got in ((1, first), (2, second)):
            sampled = got.trajectories.versions[got.trajectories.action_mask]
            assert sampled.numel() and int(sampled.min()) >= step - 1 - 1  # trainer_version(step) - S
        assert torch.equal(source.hosts[0].host.engine.model.lm_head.weight, actor.lm_head.weight)
        stats = source.stats()
        assert stats["fleet_fill"] > 0  # a streaming host reports how full it kept its room
        assert stats["fleet_fill_waiting"] >= 0  # and how full while work waited (a group of 2 > the room runs alone)
    finally:
        source.close()


@pytest.mark.timeout(120)
def test_an_engine_error_ends_the_trainers_wait_naming_the_host_and_the_batch(tiny_dir: Path) -> None:
    source = _source(tiny_dir, BrokenRollout(), max_staleness=0)
    try:
        with pytest.raises(RuntimeError, match=r"engine host 0 \(a thread of the trainer\) failed while rolling out "
                                               r"the batch of step 1 \(stream batch 0\): .*RuntimeError: the engine "
                                               r"broke"):
            source.batch(1)
    finally:
        source.close()


@pytest.mark.timeout(120)
def test_a_host_without_progress_is_a_timeout_naming_the_setting(tiny_dir: Path, tmp_path: Path) -> None:
    source = _source(tiny_dir, GatedRollout(gate=str(tmp_path)), max_staleness=0, timeout_s=0.5)
    try:
        with pytest.raises(TimeoutError, match=r"did not finish rolling out the batch of step 2 \(stream batch 1\) "
                                               r"within 0.5 s \(model.hosts.timeout_s\)"):
            source.batch(1)
            source.after_update(source._actor, 1)
            source.batch(2)  # held at the gate
    finally:
        (tmp_path / "released").touch()
        source.close()


@pytest.mark.timeout(120)
def test_close_ends_a_rollout_in_flight_at_its_next_engine_step(tiny_dir: Path) -> None:
    slow = BrokenRollout(broken=False, step_s=0.05)
    settings = ThreadTransport().settings(HostSettings(str(tiny_dir), slow, NO_TOOL), "cpu")
    host = ThreadHost(settings)
    long = SamplingParams(n=1, temperature=1.0, max_new_tokens=10_000, seed=0)
    (rollout,) = host.roll_out.remote([([[40]], None, long)])
    while host.host.engine.steps < 2:  # bounded by the test's timeout
        time.sleep(0.01)
    host.close()
    assert isinstance(rollout.exception().__cause__, RolloutsStopped)  # the tool loop names the rows it decoded
    assert host.host.engine is None  # closed: its engine too


@pytest.mark.timeout(120)
def test_rollout_calls_start_in_the_order_they_were_made(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Streaming one group at a time, calls made one after another reach the engine in that order, the first slow
    to queue its jobs: the host queues each call's jobs in the caller's thread, not in whichever of its executor's
    threads gets there first (under load a later batch's group overtook an earlier one's)."""
    queue = EngineHost.queue

    def slow_first(self: EngineHost, calls: list[tuple]) -> Any:
        if calls[0][0] == [[40]]:
            time.sleep(0.3)
        return queue(self, calls)

    monkeypatch.setattr(EngineHost, "queue", slow_first)
    slow = BrokenRollout(broken=False, step_s=0.01)
    settings = ThreadTransport().settings(HostSettings(str(tiny_dir), slow, NO_TOOL, max_in_flight=1), "cpu")
    host = ThreadHost(settings)
    try:
        params = SamplingParams(n=1, temperature=1.0, max_new_tokens=3, seed=0)
        calls = [ThreadTransport().roll_out(host, [([[40 + i]], None, params)])[0] for i in range(12)]
        for call in calls:
            call.result(timeout=60)
        assert host.host.engine.prompts == [[40 + i] for i in range(12)]
    finally:
        host.close()


def test_the_thread_hosts_settings_are_its_own_not_the_processes() -> None:
    settings = HostSettings("folder", HFRollout(), NO_TOOL, threads=7, device="cuda")
    assert ThreadTransport("cuda:1", 2).settings(settings, "cuda:0") == HostSettings(
        "folder", HFRollout(), NO_TOOL, threads=2, device="cuda:1", own_process=False)
    assert ThreadTransport().settings(settings, torch.device("cpu")).device == "cpu"  # the trainer's


def test_the_thread_hosts_copy_of_the_actor_takes_the_runs_dtype(tiny_dir: Path) -> None:
    """The host's transformers copy is its own model on the trainer's device: in the run's dtype (model.base.dtype),
    not float32 (twice the memory of a bfloat16 actor, on the GPU training shares)."""
    from zerotir.config import BaseModelConfig, RLConfig
    from zerotir.models import load_causal_lm
    from zerotir.module import ZeroTIRModule

    module = ZeroTIRModule(BaseModelConfig(str(tiny_dir), dtype="bfloat16"), rl=RLConfig(kl_coef=0.0), tool=NO_TOOL,
                           hosts=HostsConfig(max_staleness=0), rollout=HFRollout())
    actor = load_causal_lm(tiny_dir, "bfloat16")
    module.source.start(actor, load_tokenizer(tiny_dir), "cpu", STREAM)
    try:
        copy = module.source.hosts[0].host.engine.model
        assert copy is not actor
        assert {p.dtype for p in copy.parameters()} == {torch.bfloat16}
    finally:
        module.source.close()



@pytest.mark.timeout(120)
def test_the_thread_host_aborts_a_group_a_push_leaves_stale_and_trains_it_once_fresh(tiny_dir: Path,
                                                                                      tmp_path: Path) -> None:
    source = FleetSource(HostsConfig(max_staleness=1, timeout_s=60.0, max_in_flight=4), HeldRollout(gate=str(tmp_path)),
                         SandboxConfig(), NO_TOOL, SamplingConfig(n=2, max_response_tokens=4), None, str(tiny_dir), 0,
                         ThreadTransport())
    source.start(sender_model(tiny_dir, seed=1), load_tokenizer(tiny_dir), "cpu", FixedStream(held_rows, 2))
    try:
        abort_at_push_2(source, tmp_path)  # the checks: see its doc
    finally:
        source.close()
