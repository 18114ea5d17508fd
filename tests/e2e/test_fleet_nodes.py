"""The fleet on a cluster of several nodes, all on this machine (``ray.cluster_utils.Cluster``): one sandbox server
per node, placed and watched through Ray (``model.hosts.sandbox_per_node``, ``zerotir.fleet.sandboxes``).

The head node (the trainer's: the driver joins the cluster there) has no CPU for Ray, the worker node one, so the
engine's bundle lands on the worker node. A 2-step fit: the engine's code reaches its own node's server and none of
it the trainer's (their ``/metrics``); the engine node's server is SIGKILLed before step 1's update, started again
on the same address by its actor, and step 2's batch runs on it; no trajectory is trained on a failure."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import REPO, cli_args, read_scalars, run_cli
from zerotir import metric_names as mn

pytest.importorskip("ray", reason='the fleet runs on Ray: pip install -e ".[fleet]"')
pytestmark = pytest.mark.slow


@pytest.fixture
def two_nodes(monkeypatch):
    """A head node with no CPU (the trainer's) and a worker node with one (the engine's); their processes import
    this checkout."""
    import signal

    from ray.cluster_utils import Cluster

    monkeypatch.setenv("PYTHONPATH", str(REPO))
    before = signal.getsignal(signal.SIGTERM)  # a head node started here installs Ray's own handler
    cluster = Cluster(initialize_head=True, connect=False,
                      head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()
        signal.signal(signal.SIGTERM, before)  # or every later test of this worker would meet Ray's handler


@pytest.mark.timeout(600)
def test_each_engine_reaches_its_nodes_sandbox_which_is_restarted_after_a_kill(two_nodes, e2e_base, e2e_data,
                                                                              tmp_path):
    record = tmp_path / "sandboxes.jsonl"
    cli = run_cli(cli_args(
        "fit", "tiny_cpu_reinforce", e2e_base, e2e_data, tmp_path, "--trainer.max_steps", "2",
        "--trainer.limit_val_batches", "0", "--trainer.enable_checkpointing", "false",
        "--model.hosts.max_staleness", "0", "--model.hosts.engines", "1", "--model.hosts.timeout_s", "300",
        "--model.hosts.address", two_nodes.address,
        "--trainer.callbacks+=tests.e2e.helpers.KillNodeSandbox", "--trainer.callbacks.path", str(record),
        "--trainer.callbacks.step", "1"))
    assert cli.model.rl_steps_done == 2
    records = [json.loads(line) for line in record.read_text().splitlines()]
    killed, end = (next(r for r in records if r["when"] == when) for when in ("killed", "end"))
    assert killed["engine_nodes"] != [killed["trainer_node"]]  # the engine runs on the other node
    assert killed["trainer"] not in killed["engines"]  # ... and has a server of its own there
    before = {s["url"]: s for s in killed["servers"]}
    after = {s["url"]: s for s in end["servers"]}
    engine_url, trainer_url = killed["engines"][0], killed["trainer"]
    assert before[engine_url]["code_requests"] > 0 and before[trainer_url]["code_requests"] == 0  # step 1's calls
    assert after[engine_url]["restarts"] == 1 and after[engine_url]["pid"] != before[engine_url]["pid"]
    assert after[engine_url]["code_requests"] > 0  # step 2's calls, on the server started again (fresh metrics)
    assert after[trainer_url]["restarts"] == 0 and after[trainer_url]["code_requests"] == 0
    steps = [r for r in records if r["when"] == "step"]
    assert [r["step"] for r in steps] == [1, 2] and all(r["infra_trained"] == 0 for r in steps), steps
    scalars = read_scalars(tmp_path / "tensorboard")
    assert [s for s, _ in scalars[mn.SANDBOX_ERROR_RATE]] == [1, 2]
    assert cli.model.source.hosts == []  # closed at the end of fit: the engine, the servers and the cluster are gone
