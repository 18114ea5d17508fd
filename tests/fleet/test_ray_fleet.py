"""The fleet on a local Ray cluster: one ``EngineHost`` actor (the transformers engine on the tiny model of
``tiny_dir``) and this test process as the trainer's weight sender.

The sender moves every parameter, pushes while the actor's ``receive_weights`` runs, and the actor's greedy rollout
(no tools, so no sandbox) must then be exactly the sender model's greedy tokens, stamped with the version pushed.
A ``FleetSource`` at S = 1 on the same cluster, its engine's rollout of the next batch held at a gate
(``tests.fleet.gated_engine``), hands the trainer its batch and takes its update while that rollout is held.
Every wait on the actor is bounded (``ray.get(..., timeout=...)``); the cluster is shut down at the end.
"""

from __future__ import annotations

import socket
from dataclasses import replace
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tests.fleet.gated_engine import STREAM, GatedRollout, s1_with_batch_2_held, wait_for
from tests.fleet.held_engine import HeldRollout, abort_at_push_2, held_rows
from tests.fleet.test_engine_host import (GREEDY, NO_TOOL, host_settings, local_greedy, prompt_ids, sampled_ids,
                                          sender_model)
from tests.ports import free_port
from tests.scripted_source import FixedStream

from zerotir.config import HostsConfig, SamplingConfig, SandboxConfig
from zerotir.fleet.source import FleetSource
from zerotir.fleet.weight_group import GroupAddress, form_weight_group
from zerotir.fleet.weight_push import WeightSender
from zerotir.models import load_tokenizer
from zerotir.parallel.weight_sync import sync_weights

ray = pytest.importorskip("ray", reason='the fleet tests need Ray: pip install -e ".[fleet]"')

from zerotir.fleet.cluster import other_nodes, spawn_hosts, start_cluster, stop_cluster  # noqa: E402

STARTUP_TIMEOUT_S = 300.0  # a hang guard: the actor's process imports torch and transformers and builds its engine
GROUP_TIMEOUT_S = 60.0  # the actor is up when the group forms
CALL_TIMEOUT_S = 60.0
VERSION = 4


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    """A local cluster of this module's own, started while ``RAY_ADDRESS`` names another: ``start_cluster`` without
    an address never joins a cluster the environment or an earlier ``ray start`` names (Ray's own default does)."""
    import signal

    before = signal.getsignal(signal.SIGTERM)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_ADDRESS", "127.0.0.1:9")  # nothing listens there: joining it would fail the start
        start_cluster(num_cpus=2, num_gpus=0, object_store_memory=100 << 20)
    try:
        yield
    finally:
        stop_cluster()
    assert signal.getsignal(signal.SIGTERM) == before  # ray.init's own SIGTERM handler does not outlive the cluster


@pytest.mark.timeout(600)
def test_an_actor_decodes_as_the_sender_after_a_push(cluster: None, tiny_dir: Path) -> None:
    host = spawn_hosts(1, host_settings(tiny_dir), num_cpus=1)[0]
    built = ray.get(host.describe.remote(), timeout=STARTUP_TIMEOUT_S)  # built before the group's clock starts
    assert built == {"engine": "HFEngine", "context_length": built["context_length"], "adapter_path": "adapter",
                     "version": None, "node": socket.gethostname(), "pid": built["pid"]}
    address = GroupAddress("127.0.0.1", free_port())
    joined = host.join_weights.remote(address, 1, 2, GROUP_TIMEOUT_S)
    sender = WeightSender(form_weight_group(address, 0, 2, "cpu", GROUP_TIMEOUT_S))  # waits for the actor to join
    ray.get(joined, timeout=CALL_TIMEOUT_S)
    model = sender_model(tiny_dir, seed=5)
    received = host.receive_weights.remote()
    # The host's default group is busy until the push below (as with a rollout in flight): its questions are answered
    # meanwhile, so the trainer never waits for one queued behind a rollout.
    assert set(ray.get(host.occupancy.remote(), timeout=CALL_TIMEOUT_S)) == {"busy"}
    assert ray.get(host.describe.remote(), timeout=CALL_TIMEOUT_S)["pid"] == built["pid"]
    assert ray.wait([received], timeout=0)[1] == [received]  # still waiting for the push
    with sender.push(VERSION):
        sync_weights(model, sender, bucket_bytes=1)  # a bucket per layer, while the actor receives
    assert ray.get(received, timeout=CALL_TIMEOUT_S) == VERSION
    traj, timings = ray.get(host.roll_out.remote(prompt_ids(tiny_dir), None, GREEDY), timeout=CALL_TIMEOUT_S)
    want = local_greedy(model, tiny_dir)
    assert [len(ids) for ids in want] == [12, 12]
    assert sampled_ids(traj) == want
    assert torch.equal(traj.versions, torch.where(traj.action_mask, VERSION, -1))
    assert timings["generation"] > 0
    stopped = host.receive_weights.remote()
    sender.stop()  # the actor's receive_weights returns None; the sender leaves last
    assert ray.get(stopped, timeout=CALL_TIMEOUT_S) is None
    ray.get(host.close.remote(), timeout=CALL_TIMEOUT_S)


def test_the_cluster_refuses_bad_calls_naming_the_fix(cluster: None, tiny_dir: Path) -> None:
    assert other_nodes() == []  # a local cluster: the embedded sandbox serves every engine
    with pytest.raises(RuntimeError, match="already started in this process; stop_cluster"):
        start_cluster(num_cpus=1)
    with pytest.raises(ValueError, match="spawn_hosts\\(count=0\\)"):
        spawn_hosts(0, host_settings(tiny_dir))
    with pytest.raises(ValueError, match="num_cpus=-1"):
        spawn_hosts(1, host_settings(tiny_dir), num_cpus=-1)


def test_the_local_clusters_workers_run_at_normal_priority(cluster: None) -> None:
    """Ray's default worker niceness (15) lets any busy process starve the engine hosts; the local cluster's is 0."""
    import os

    niceness = ray.get(ray.remote(num_cpus=0)(lambda: os.nice(0)).remote(), timeout=STARTUP_TIMEOUT_S)
    assert niceness == os.nice(0)
    assert "RAY_worker_niceness" not in os.environ  # set only while the raylet started



def _gated_source(tiny_dir: Path, gate: Path, monkeypatch: pytest.MonkeyPatch, fleet: HostsConfig,
                  max_staleness: int) -> FleetSource:
    """A started ``FleetSource`` on the module's cluster, its engines gated at ``gate`` (``GatedRollout``)."""
    from zerotir.fleet import cluster

    monkeypatch.setattr(cluster, "fleet_cluster", lambda *args: None)  # the module's cluster serves the source
    monkeypatch.setattr(cluster, "stop_cluster", lambda: None)  # and outlives it
    source = FleetSource(replace(fleet, max_staleness=max_staleness), GatedRollout(gate=str(gate)),
                         SandboxConfig(), NO_TOOL, SamplingConfig(n=1, max_response_tokens=4), None, str(tiny_dir), 0)
    source.start(sender_model(tiny_dir, seed=1), load_tokenizer(tiny_dir), "cpu", STREAM)
    return source


@pytest.mark.timeout(120)
def test_s1_trains_step_k_while_batch_k_plus_1_is_generated(cluster: None, tiny_dir: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """By observed order: stream batch 1 (step 2's) is held in the engine process until the test
    releases it, after step 1 has taken its batch and applied its update; a question queued behind that rollout
    (the engines' occupancy, asked after each batch) would hang here instead."""
    source = _gated_source(tiny_dir, tmp_path, monkeypatch, HostsConfig(max_staleness=0, engines=1, pin_cores=False),
                           max_staleness=1)
    try:
        s1_with_batch_2_held(source, tmp_path)
    finally:
        (tmp_path / "released").touch()
        source.close()


@pytest.mark.timeout(120)
def test_an_engine_process_aborts_a_group_a_push_leaves_stale_and_trains_it_once_fresh(
        cluster: None, tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The thread host's abort scenario (``held_engine.abort_at_push_2``) in an engine process of its own: the
    bound reaches the actor in its settings, and its abort counts reach the trainer's figures."""
    from zerotir.fleet import cluster as fleet_cluster

    monkeypatch.setattr(fleet_cluster, "fleet_cluster", lambda *args: None)  # the module's cluster serves the source
    monkeypatch.setattr(fleet_cluster, "stop_cluster", lambda: None)  # and outlives it
    source = FleetSource(HostsConfig(max_staleness=1, engines=1, pin_cores=False, timeout_s=60.0, max_in_flight=4),
                         HeldRollout(gate=str(tmp_path)), SandboxConfig(), NO_TOOL,
                         SamplingConfig(n=2, max_response_tokens=4), None, str(tiny_dir), 0)
    source.start(sender_model(tiny_dir, seed=1), load_tokenizer(tiny_dir), "cpu", FixedStream(held_rows, 2))
    try:
        abort_at_push_2(source, tmp_path)
    finally:
        source.close()


@pytest.mark.timeout(120)
def test_an_engine_killed_during_a_push_is_recovered_without_waiting_out_the_timeout(
        cluster: None, tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On gloo: the engine process is killed while it receives step 1's push (held in its first
    bucket); with model.hosts.timeout_s at 600 the push fails at once, Ray restarts the engine and the recovery
    pushes version 1 to the new process, well within the test's timeout."""
    import os
    import signal
    import threading

    source = _gated_source(tiny_dir, tmp_path, monkeypatch,
                           HostsConfig(max_staleness=0, engines=1, pin_cores=False, max_restarts=1), max_staleness=0)
    (tmp_path / "released").touch()  # no rollout is held here
    try:
        source.batch(1)
        pid = ray.get(source.hosts[0].describe.remote(), timeout=CALL_TIMEOUT_S)["pid"]

        def kill_when_held() -> None:
            wait_for(tmp_path / "push-held")
            (tmp_path / "hold-push").unlink()  # the restarted engine receives its push
            os.kill(pid, signal.SIGKILL)

        (tmp_path / "hold-push").touch()
        killer = threading.Thread(target=kill_when_held, daemon=True)
        killer.start()
        source.after_update(source._actor, 1)
        killer.join()
        assert source.restarts == 1 and source.version == 1
        assert ray.get(source.hosts[0].describe.remote(), timeout=CALL_TIMEOUT_S)["pid"] != pid
        second = source.batch(2)
        assert set(second.trajectories.versions[second.trajectories.action_mask].tolist()) == {1}
    finally:
        source.close()


@pytest.mark.timeout(120)
def test_a_push_is_interrupted_when_an_engines_receive_dies(cluster: None) -> None:
    """``watch_push``: the receive call of a killed actor interrupts the weight group while the push runs; and
    ``ray_get`` raises its death at once, though the call before it in the list never ends."""
    import threading

    from zerotir.fleet.cluster import EngineDied, ray_get, watch_push

    class Group:  # the one call watch_push makes of a WeightGroup
        def __init__(self) -> None:
            self.interrupted = threading.Event()

        def interrupt(self) -> bool:
            self.interrupted.set()
            return True

    receiver = ray.remote(num_cpus=0, max_restarts=0)(_Receiver).remote()
    alive = ray.remote(num_cpus=0)(_Receiver).remote()
    group = Group()
    refs = [alive.receive.remote(), receiver.receive.remote()]  # the live one first: it must not hide the dead one
    with watch_push(refs, group):
        ray.kill(receiver)
        group.interrupted.wait()  # bounded by the test's timeout
    assert group.interrupted.is_set()
    with pytest.raises(EngineDied, match="engine process 1 of the fleet died while receiving"):  # not after 600 s
        ray_get(refs, 600.0, "receiving")
    ray.kill(alive)


def test_lost_jobs_of_a_restarted_engine_are_its_death(cluster: None) -> None:
    """``ray_get``: a ``collect`` that reached a restarted actor (``JobsLost``) raises ``EngineDied`` (the caller
    recovers), any other failure of a call a ``RuntimeError`` naming the engine."""
    from zerotir.fleet.cluster import EngineDied, ray_get
    from zerotir.fleet.engine_host import JobsLost

    @ray.remote(num_cpus=0)
    def fail(error: Exception) -> None:
        raise error

    with pytest.raises(EngineDied, match="engine process 3 of the fleet died while collecting: .*lost") as died:
        ray_get([fail.remote(JobsLost("the jobs were lost"))], CALL_TIMEOUT_S, "collecting", [3])
    assert died.value.engine == 3 and died.value.restarting
    with pytest.raises(RuntimeError, match="engine process 0 of the fleet failed while collecting: ValueError: x"):
        ray_get([fail.remote(ValueError("x"))], CALL_TIMEOUT_S, "collecting")


class _Receiver:
    """An engine's ``receive_weights`` that never ends (its push never comes)."""

    def receive(self) -> None:
        time.sleep(3600)
