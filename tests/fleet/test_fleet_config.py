"""``model.hosts`` (``zerotir.config.hosts``) and the source it selects: each bad value names its field and fix, the
groups that cannot run together fail naming both, and ``make_rollout_source`` picks the fleet's source only when
engines are asked for. No Ray: nothing here starts a cluster."""

from __future__ import annotations

from dataclasses import replace

import pytest

from zerotir.config import (
    HFRollout, HostsConfig, SamplingConfig, SandboxConfig, ToolConfig, VLLMRollout,
)
from zerotir.fleet.source import FleetSource
from zerotir.fleet.thread_host import ThreadTransport
from zerotir.sources import make_rollout_source

NO_TOOLS = ToolConfig(max_tool_calls=0)
JOINED = HostsConfig(max_staleness=0, engines=2, address="10.0.0.1:6379")  # a cluster joined by address


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_staleness": -1}, r"model.hosts.max_staleness=-1: must be >= 0"),
    ({"engines": -1}, r"model.hosts.engines=-1: must be >= 0 \(0: one engine host in a thread"),
    ({"cpus_per_engine": -1}, r"model.hosts.cpus_per_engine=-1: must be >= 0"),
    ({"threads": 0}, r"model.hosts.threads=0: must be >= 1"),
    ({"max_restarts": -1}, r"model.hosts.max_restarts=-1: must be >= 0"),
    ({"weight_port": 70000}, r"model.hosts.weight_port=70000: a TCP port 1..65535, or 0 for a free one"),
    ({"timeout_s": 0}, r"model.hosts.timeout_s=0: must be > 0 seconds"),
])
def test_fleet_errors_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        HostsConfig(**kwargs)


def test_derived_settings():
    thread = HostsConfig(max_staleness=0)
    assert not HostsConfig().enabled and thread.enabled and not thread.on_ray
    ray = HostsConfig(max_staleness=0, engines=2)
    assert ray.enabled and ray.on_ray and ray.engine_device == "cpu"
    assert HostsConfig(max_staleness=0, engines=1, gpus_per_engine=1).engine_device == "cuda"
    assert HostsConfig(max_staleness=0, engines=1, cpus_per_engine=0.5).engine_threads == 1
    assert HostsConfig(max_staleness=0, engines=1, cpus_per_engine=4).engine_threads == 4
    assert HostsConfig(max_staleness=0, engines=1, cpus_per_engine=4, threads=2).engine_threads == 2


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"engines": 1}, r"model.hosts.engines=1 with model.hosts.max_staleness: null: engine host settings.*set "
                     r"model.hosts.max_staleness"),
    ({"max_staleness": 1, "engines": 1, "device": "cuda:1"},
     r"model.hosts.device='cuda:1' with model.hosts.engines=1: the device of the engine host in a thread; Ray "
     r"engines take model.hosts.gpus_per_engine"),
])
def test_settings_of_the_other_kind_of_host_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        HostsConfig(**kwargs)


@pytest.mark.parametrize(("backend", "message"), [
    (VLLMRollout(tensor_parallel_size=2), r"model.hosts.engines=1 with .*tensor_parallel_size=2: a fleet engine is "
                                          r"one process"),
    (VLLMRollout(enable_sleep_mode=True), r"model.hosts.engines=1 with .*enable_sleep_mode=true: a fleet engine has "
                                          r"devices of its own"),
])
def test_engines_that_cannot_run_on_the_fleet(backend, message):
    with pytest.raises(ValueError, match=message):
        make_rollout_source(HostsConfig(max_staleness=1, engines=1), backend, SandboxConfig(), NO_TOOLS,
                            SamplingConfig(), None, "x", 0)


def test_the_fleet_source_is_chosen_by_its_engines_and_serves_any_trainer():
    # An engine process has threads of its own beside the transformers engine's.
    fleet = make_rollout_source(HostsConfig(max_staleness=1, engines=2, threads=1), HFRollout(num_threads=2),
                                SandboxConfig(), NO_TOOLS, SamplingConfig(), None, "x", 0)
    assert isinstance(fleet, FleetSource) and fleet.stats() == {"fleet_restarts": 0.0, "push_mb": 0.0}
    fleet.check_trainer(1, zero3=True)  # one process under ZeRO-3: sync_weights gathers each bucket
    fleet.check_trainer(8, zero3=True)  # rank 0 drives the fleet, every rank joins the gathers (fleet.ranks)
    fleet.close()  # never started: nothing to stop
    plain = make_rollout_source(HostsConfig(max_staleness=1), HFRollout(), SandboxConfig(), NO_TOOLS,
                                SamplingConfig(), None, "x", 0)
    assert isinstance(plain, FleetSource) and isinstance(plain.transport, ThreadTransport)  # one host in a thread


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"gpus_per_engine": 0.5}, r"model.hosts.gpus_per_engine=0.5: .*NCCL, which refuses two ranks on one GPU.*give "
                               r"whole GPUs"),
    ({"trainer_threads": 0}, r"model.hosts.trainer_threads=0: must be >= 1"),
])
def test_settings_the_fleet_cannot_apply_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        HostsConfig(max_staleness=0, engines=1, **kwargs)


def test_a_local_cluster_beside_a_cuda_trainer_is_refused_naming_ray_start_head():
    fleet = HostsConfig(max_staleness=0, engines=2, gpus_per_engine=1)
    with pytest.raises(ValueError, match=r"model.hosts.address: null with model.hosts.gpus_per_engine=1 and the "
                                         r"trainer on CUDA.*`CUDA_VISIBLE_DEVICES=.*ray start --head"):
        fleet.check_trainer_device("cuda")
    fleet.check_trainer_device("cpu")  # a CPU trainer holds no GPU the engines could be given
    HostsConfig(max_staleness=0, engines=2, gpus_per_engine=1, address="10.0.0.1:6379").check_trainer_device("cuda")
    HostsConfig(max_staleness=0, engines=2).check_trainer_device("cuda")  # CPU engines take no GPU
    source = make_rollout_source(fleet, HFRollout(), SandboxConfig(), NO_TOOLS, SamplingConfig(), None, "x", 0)
    with pytest.raises(ValueError, match="ray start --head"):  # before a sandbox or a cluster is started
        source.start(None, None, "cuda:0", None)
    assert not source.hosts and source.sandbox.urls == []


@pytest.mark.parametrize(("urls", "tool", "nodes", "per_node", "refused"), [
    (None, ToolConfig(), ["10.0.0.2"], False, True),  # engines on another node, the sandbox on 127.0.0.1 of this one
    (None, ToolConfig(), ["10.0.0.2"], True, False),  # a server on each node (the default)
    (["http://10.0.0.9:8080"], ToolConfig(), ["10.0.0.2"], False, False),  # servers the engines reach
    (None, NO_TOOLS, ["10.0.0.2"], False, False),  # no code runs
    (None, ToolConfig(), [], False, False),  # one node: `ray start --head` on the trainer's (address: auto)
])
def test_an_embedded_sandbox_is_refused_once_the_cluster_has_other_nodes(urls, tool, nodes, per_node, refused):
    fleet = HostsConfig(max_staleness=0, engines=4, address="auto", sandbox_per_node=per_node)
    if refused:
        with pytest.raises(ValueError, match=r"model.hosts.address='auto' with model.tool.sandbox.urls: null: the cluster "
                                             r"has nodes other than the trainer's \(10.0.0.2\).*127.0.0.1.*python -m "
                                             r"sandbox serve --host .* set model.tool.sandbox.urls.*sandbox_per_node: "
                                             r"true"):
            fleet.check_sandbox_reach(SandboxConfig(urls=urls), tool, nodes)
    else:
        fleet.check_sandbox_reach(SandboxConfig(urls=urls), tool, nodes)


@pytest.mark.parametrize(("fleet", "urls", "tool", "expected"), [
    (JOINED, None, ToolConfig(), True),
    (replace(JOINED, sandbox_per_node=False), None, ToolConfig(), False),
    (JOINED, ["http://10.0.0.9:8080"], ToolConfig(), False),  # urls win
    (JOINED, None, NO_TOOLS, False),  # no code runs
    (HostsConfig(max_staleness=0, engines=2), None, ToolConfig(), False),  # a local cluster: one node, one server
    (HostsConfig(max_staleness=0, address="10.0.0.1:6379"), None, ToolConfig(), False),  # a thread host: no Ray
])
def test_a_sandbox_on_each_node_only_on_a_joined_cluster_with_tools_and_no_urls(fleet, urls, tool, expected):
    assert fleet.sandbox_on_each_node(SandboxConfig(urls=urls), tool) is expected


def test_a_sandbox_on_each_node_refuses_engines_that_ask_for_no_resource():
    fleet = HostsConfig(max_staleness=0, engines=2, address="10.0.0.1:6379", cpus_per_engine=0)
    with pytest.raises(ValueError, match=r"sandbox_per_node: true with model.hosts.cpus_per_engine=0 and "
                                         r"gpus_per_engine=0.*cpus_per_engine > 0.*sandbox_per_node: false"):
        fleet.sandbox_on_each_node(SandboxConfig(), ToolConfig())
