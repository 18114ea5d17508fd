"""``fit`` with each algorithm through the real command line and the shipped tiny configs: a real sandbox server
(embedded), the transformers engine, a quickly pretrained base. Two RL steps each; every trainable parameter changes,
the frozen reference does not, and TensorBoard holds the scaling-metric tags on the RL-step axis."""

from __future__ import annotations

import json

import pytest
import torch

from tests.e2e.conftest import cli_args, read_scalars, run_cli
from zerotir import metric_names as mn

ROLLOUT_TAGS = {mn.REWARD_MEAN, mn.ACCURACY, mn.CODE_RATE, mn.CODE_IN_CORRECT, mn.CALLS_PER_RESPONSE,
                mn.RESPONSE_LENGTH, mn.REPEAT_SCORE, mn.EXEC_ERROR_RATE, mn.TIMEOUT_RATE, mn.SANDBOX_ERROR_RATE,
                mn.TRUNCATION_RATE, *mn.CORRECT_BY_CALLS, mn.KEPT_FRACTION, mn.CALLS_HIST}
TIME_TAGS = {mn.TIME_GENERATION, mn.TIME_SANDBOX, mn.TIME_REWARD, mn.TIME_UPDATE, mn.TIME_WEIGHT_SYNC, mn.TIME_STEP}
UPDATE_TAGS = {mn.ENTROPY, mn.POLICY_LOSS, mn.CLIP_FRACTION, mn.GRAD_NORM, mn.LEARNING_RATE, mn.KL}


@pytest.mark.parametrize("config", ["tiny_cpu_ppo", "tiny_cpu_reinforce", "tiny_cpu_grpo"])
def test_fit_two_steps_updates_every_parameter(config, e2e_base, e2e_data, tmp_path):
    snapshot = tmp_path / "initial.pt"
    extra = ["--trainer.max_steps", "2", "--checkpoint.every_n_train_steps", "1",
             "--trainer.callbacks+=tests.e2e.helpers.SnapshotParams", "--trainer.callbacks.path", str(snapshot)]
    if config == "tiny_cpu_grpo":  # validation through the same rollout path, at step 2
        extra += ["--trainer.val_check_interval", "2"]
    cli = run_cli(cli_args("fit", config, e2e_base, e2e_data, tmp_path, *extra))
    module = cli.model
    assert module.rl_steps_done == 2 and cli.trainer.global_step == 2

    initial = torch.load(snapshot)
    final = dict(module.named_parameters())
    trainable = [n for n, (_, grad) in initial.items() if grad]
    unchanged = [n for n in trainable if torch.equal(initial[n][0], final[n].detach())]
    assert trainable and not unchanged, f"parameters that did not change: {unchanged}"
    frozen = [n for n, (_, grad) in initial.items() if not grad]
    assert frozen == [n for n in initial if n.startswith("ref_model.")]
    assert all(torch.equal(initial[n][0], final[n].detach()) for n in frozen)
    if config == "tiny_cpu_ppo":
        assert any(n.startswith("critic.value_head") for n in trainable)

    scalars = read_scalars(tmp_path / "tensorboard")
    expected = ROLLOUT_TAGS | TIME_TAGS | UPDATE_TAGS | ({mn.VALUE_LOSS} if config == "tiny_cpu_ppo" else set())
    assert expected <= set(scalars), f"missing tags: {sorted(expected - set(scalars))}"
    assert [step for step, _ in scalars[mn.REWARD_MEAN]] == [1, 2]  # the RL-step axis
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()

    if config == "tiny_cpu_grpo":
        summary = json.loads((tmp_path / "eval" / "val_step2_summary.json").read_text())
        assert summary["benchmarks"]["heldout"]["num_problems"] == 4
        assert (tmp_path / "eval" / "val_step2_heldout.md").is_file()
        assert f"heldout/{mn.EVAL_ACCURACY}" in scalars
