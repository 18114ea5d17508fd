"""Resume: 4 RL steps straight and 2 + ``fit --ckpt_path last`` 2 reach the same RL step and global step, with the
pass-rate filter's statistics restored, the optimizer state carried over, and the same prompts in the same order
(none lost, none repeated); then ``test`` on the resumed checkpoint writes its reports. A run killed (SIGKILL) after
a checkpoint and resumed leaves one value per step in TensorBoard, the resumed run's.

Rollouts are not compared token for token: the tool loop overlaps sandbox calls with generation, so which row is
sampled with which random draw depends on timing. Everything the checkpoint must carry is compared exactly.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.e2e.conftest import cli_args, killed_at_step_3, read_scalars, run_cli
from zerotir import metric_names as mn
from zerotir.scaling.runs import load_run

pytestmark = pytest.mark.slow


def _ckpt(root):
    ckpt = torch.load(root / "checkpoints" / "last.ckpt", weights_only=False)
    filters = [v for k, v in ckpt["callbacks"].items() if k.startswith("PassRateFilter")]
    return ckpt, filters[0]


def _records(path):
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in lines if "start" in r], [r for r in lines if "start" not in r]


def test_two_plus_two_steps_equal_four_straight(e2e_base, e2e_data, tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"

    def fit(root, steps, *extra):
        record = ["--trainer.callbacks+=tests.e2e.helpers.RecordSteps", "--trainer.callbacks.path",
                  str(root.parent / f"{root.name}.jsonl")]
        return run_cli(cli_args("fit", "tiny_cpu_reinforce", e2e_base, e2e_data, root, "--trainer.max_steps",
                                str(steps), "--checkpoint.every_n_train_steps", "2", *record, *extra))

    fit(straight, 4)
    fit(resumed, 2)
    _, half_filter = _ckpt(resumed)
    cli = fit(resumed, 4, "--ckpt_path", "last")
    assert cli.model.rl_steps_done == 4 and cli.trainer.global_step == 4

    a, a_filter = _ckpt(straight)
    b, b_filter = _ckpt(resumed)
    assert a["global_step"] == b["global_step"] == 4
    assert a["zerotir"]["rl_steps_done"] == b["zerotir"]["rl_steps_done"] == 4
    assert a["PromptDataModule"]["consumed"] == b["PromptDataModule"]["consumed"] == 4

    # Data order: the same prompts at the same RL steps.
    _, steps_a = _records(tmp_path / "straight.jsonl")
    starts_b, steps_b = _records(tmp_path / "resumed.jsonl")
    assert [r["rl_step"] for r in steps_b] == [1, 2, 3, 4] and steps_a == steps_b

    # Filter statistics: restored at the resume, then counted on.
    assert starts_b[1] == {"start": half_filter, "rl_step": 2} and half_filter["steps_seen"] == 2
    assert b_filter["steps_seen"] == a_filter["steps_seen"] == 4
    assert b_filter["groups_seen"] == a_filter["groups_seen"] == 16
    assert b_filter["groups_kept"] >= half_filter["groups_kept"]

    # Optimizer state carried over: Adam's per-parameter step count is that of 4 updates in both runs
    # (skipped updates make no-op steps, which Adam does not count, so compare with the straight run).
    step_a = {int(s["step"]) for s in a["optimizer_states"][0]["state"].values()}
    step_b = {int(s["step"]) for s in b["optimizer_states"][0]["state"].values()}
    updates = len(read_scalars(resumed / "tensorboard")[mn.GRAD_NORM])
    assert step_b == ({updates} if updates else set()) and len(step_a) <= 1
    assert b["lr_schedulers"][0]["last_epoch"] == a["lr_schedulers"][0]["last_epoch"] == 4
    assert [s for s, _ in read_scalars(resumed / "tensorboard")[mn.REWARD_MEAN]] == [1, 2, 3, 4]

    # Evaluate the resumed checkpoint: a JSON and a Markdown report per benchmark, curves at the RL step. Other data
    # settings than training's (seed, batch) are fine: evaluation never reads the training stream, and the data
    # seed (5) differs from the module's (0, restored from the checkpoint) without a hyperparameter clash.
    test_root = tmp_path / "test"
    run_cli(cli_args("test", "tiny_cpu_reinforce", e2e_base, e2e_data, test_root,
                     "--ckpt_path", str(resumed / "checkpoints" / "last.ckpt"),
                     "--data.seed", "5", "--data.prompts_per_step", "128"))
    (test_run,) = (test_root / "test").iterdir()  # a test run writes a folder of its own: <root>/test/<stamp>
    report = json.loads((test_run / "eval" / "test_heldout.json").read_text())
    assert report["benchmarks"]["heldout"]["num_problems"] == 8 and report["meta"]["rl_step"] == 4
    assert (test_run / "eval" / "test_heldout.md").read_text().count("| heldout |") == 1
    assert f"heldout/{mn.EVAL_ACCURACY}" in read_scalars(test_run / "tensorboard")


# The killed run trains LoRA adapters: the kill and the resume through the command line carry the adapters
# and their optimizer state, the base stays bit-identical (full fine-tuning's kill-and-resume: test_curriculum_resume,
# test_sandbox_failure; bit-exact resume of LoRA in one process: tests/test_lora.py).
KILL_COMMON = ["--checkpoint.every_n_train_steps", "2", "--trainer.limit_val_batches", "0",
               "--model.base.lora.rank", "4", "--model.base.lora.alpha", "8"]


@pytest.fixture(scope="module", autouse=True)
def killed_run(e2e_base, e2e_data, tmp_path_factory):
    """The kill-and-resume test's first run, going on beside this module's earlier tests (``killed_at_step_3``)."""
    root = tmp_path_factory.mktemp("killed")
    run = killed_at_step_3(e2e_base, e2e_data, root, *KILL_COMMON)
    yield root, run
    run.stop()


def test_killed_after_a_checkpoint_and_resumed_leaves_one_value_per_step(e2e_base, e2e_data, killed_run):
    """Checkpoint at step 2, killed with SIGKILL once step 3 is logged and on disk, resumed to step 4."""
    tmp_path, run = killed_run
    common = KILL_COMMON
    run.killed()
    tensorboard = tmp_path / "tensorboard"
    killed_files = set(tensorboard.glob("events.out.tfevents.*"))
    before = read_scalars(tensorboard)
    assert [s for s, _ in before[mn.REWARD_MEAN]] == [1, 2, 3]  # step 3 was logged after the checkpoint
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["zerotir"]["rl_steps_done"] == 2

    cli = run_cli(cli_args("fit", "tiny_cpu_reinforce", e2e_base, e2e_data, tmp_path, "--trainer.max_steps", "4",
                           "--ckpt_path", "last", *common))
    assert cli.model.rl_steps_done == 4
    after = read_scalars(tensorboard)
    doubled = {tag: steps for tag, series in after.items()
               if len(steps := [s for s, _ in series]) != len(set(steps))}
    assert not doubled, f"steps logged twice: {doubled}"
    assert [s for s, _ in after[mn.REWARD_MEAN]] == [1, 2, 3, 4]
    # Steps 1-2 are the killed run's, 3-4 the resumed run's; the scaling report reads the same single points.
    resumed = {}
    for path in set(tensorboard.glob("events.out.tfevents.*")) - killed_files:
        resumed.update(dict(read_scalars(path).get(mn.REWARD_MEAN, [])))
    assert sorted(resumed) == [3, 4]
    merged = dict(after[mn.REWARD_MEAN])
    assert merged[1] == dict(before[mn.REWARD_MEAN])[1] and all(merged[s] == resumed[s] for s in (3, 4))
    report = load_run("run", tensorboard).scalars[mn.REWARD_MEAN]
    assert report.to_dict() == merged
    _assert_adapters_carried(ckpt, torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False), after)


def _assert_adapters_carried(at_2: dict, at_4: dict, scalars: dict) -> None:
    """The LoRA run's checkpoints: adapters only in the optimizer, every base weight of step 2 unchanged at step 4,
    and Adam's step count that of every update of both processes (a resume that reset the optimizer counts only the
    resumed run's)."""
    adapters = sorted(k for k in at_4["state_dict"] if "lora_" in k)
    assert adapters and adapters == sorted(k for k in at_2["state_dict"] if "lora_" in k)
    base = [k for k in at_4["state_dict"] if "lora_" not in k]
    assert base and all(torch.equal(at_4["state_dict"][k], at_2["state_dict"][k]) for k in base)
    state = at_4["optimizer_states"][0]["state"]
    assert len(state) <= len(adapters)  # Adam holds state for trained tensors only: the adapters
    updates = len(scalars[mn.GRAD_NORM])
    assert {int(s["step"]) for s in state.values()} == ({updates} if updates else set())
