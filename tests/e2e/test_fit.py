"""``fit`` with each algorithm through the real command line and the shipped tiny configs: a real sandbox server
(embedded), the transformers engine, a quickly pretrained base. Two RL steps each; every trainable parameter changes,
the frozen reference does not, TensorBoard holds the scaling-metric tags on the RL-step axis, and every rollout is on
disk (with text samples in TensorBoard and the terminal view reading them). With Lightning's CSV logger instead of
TensorBoard the same scalars arrive in its metrics.csv."""

from __future__ import annotations

import csv
import io
import json

import pytest
import torch
from rich.console import Console
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

from tests.e2e.conftest import cli_args, read_scalars, run_cli
from zerotir import metric_names as mn
from zerotir.rollout_log import records as R
from zerotir.rollout_log.cli import show

ROLLOUT_TAGS = {mn.REWARD_MEAN, mn.ACCURACY, mn.TOOL_CALL_RATE, mn.TOOL_IN_CORRECT, mn.CALLS_PER_RESPONSE,
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
    check_rollouts(tmp_path, module, validated=config == "tiny_cpu_grpo")


RECORD_FIELDS = {"step", "split", "rank", "index", "group", "problem_id", "source", "prompt", "response", "answer",
                 "reference", "reward", "correct", "calls", "exec_errors", "timeouts", "sandbox_errors",
                 "tool_errors", "finish_reason", "truncated", "response_tokens", "sampled_tokens", "tool_calls",
                 "weight_version", "filtered_by"}
# advantage: the rows that trained; tokens: the per-token records of the step's sampled rows (the dumper's
# token_samples, 4 by default)
OPTIONAL_FIELDS = {"advantage", "tokens"}


def check_rollouts(root, module, validated: bool) -> None:
    """Every trajectory of both steps on disk with every field; text samples in TensorBoard; the terminal view."""
    folder = root / "rollouts"
    assert list(R.step_files(folder)) == [1, 2]
    per_step = module.sampling.n * 4  # prompts_per_step of the tiny configs
    for step in (1, 2):
        rows = R.read_step(folder, step)
        assert len(rows) == per_step and all(RECORD_FIELDS <= set(r) <= RECORD_FIELDS | OPTIONAL_FIELDS for r in rows)
        assert sum("tokens" in r for r in rows) == 4 and any("advantage" in r for r in rows)
        assert {r["step"] for r in rows} == {step} and {r["weight_version"] for r in rows} == {step - 1}
        assert all(r["prompt"].startswith("Q: ") and r["reference"] for r in rows)
        assert all(len(r["tool_calls"]) == r["calls"] for r in rows)
        for call in (c for r in rows for c in r["tool_calls"]):
            assert set(call) == {"tool", "code", "status", "output"} and call["code"] and call["status"]
    assert any(r["calls"] for s in (1, 2) for r in R.read_step(folder, s)), "no trajectory called the tool"
    if validated:
        val = R.read_step(folder, 2, "val")
        assert len(val) == 4 and {r["source"] for r in val} == {"heldout"} and val[0]["split"] == "val"
    acc = EventAccumulator(str(root / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    best = acc.Tensors("samples/best/text_summary")
    assert [e.step for e in best] == [1, 2]
    assert "**prompt**" in tensor_util.make_ndarray(best[0].tensor_proto).item().decode()
    out = io.StringIO()
    shown = show(root, filters=["tool"], limit=2, console=Console(file=out, width=100, color_system=None))
    tool_rows = sum(r["calls"] > 0 for r in R.read_step(folder, 2))
    text = out.getvalue()
    assert shown == min(2, tool_rows) and f"step 2: {tool_rows} of {per_step} trajectories matching tool" in text
    assert "step 1 | " in text and "step 2 | " in text


def test_csv_logger_instead_of_tensorboard_gets_the_scaling_metrics(e2e_base, e2e_data, tmp_path):
    run_cli(cli_args("fit", "tiny_cpu_reinforce", e2e_base, e2e_data, tmp_path, "--trainer.max_steps", "2",
                     "--trainer.logger", "lightning.pytorch.loggers.CSVLogger", "--trainer.logger.save_dir",
                     str(tmp_path), "--trainer.logger.name", "csv", "--trainer.logger.version", "0"))
    assert not (tmp_path / "tensorboard").exists()
    rows = list(csv.DictReader(io.StringIO((tmp_path / "csv" / "version_0" / "metrics.csv").read_text())))
    expected = (ROLLOUT_TAGS - {mn.CALLS_HIST}) | TIME_TAGS  # the histogram needs TensorBoard
    assert expected <= set(rows[0]), f"missing columns: {sorted(expected - set(rows[0]))}"
    logged = [r for r in rows if r[mn.REWARD_MEAN]]
    assert [int(r["step"]) for r in logged] == [1, 2]  # the RL-step axis
    assert all(0.0 <= float(r[mn.REWARD_MEAN]) <= 1.0 and float(r[mn.TIME_STEP]) > 0 for r in logged)
