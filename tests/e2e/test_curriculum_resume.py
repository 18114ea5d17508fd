"""A ``data.curriculum`` run killed (SIGKILL) after a checkpoint and resumed: its steps train the prompts, kinds and
stages of a run never killed, the stage went on at the resume (stage 0 for 2 steps, then stage 1), and no batch
trained twice.

Stages switched by steps make the stream a function of the batch index, so the two runs can be compared prompt for
prompt (rewards are not: ``tests/e2e/test_resume.py`` says why). The killed run goes on in a process of its own
beside the never-killed run in this one.
"""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from tests.e2e.conftest import cli_args, killed_at_step_3, read_scalars, run_cli

pytestmark = pytest.mark.slow

STAGES = {"stages": [{"weights": {"even": 1.0}, "steps": 2}, {"weights": {"odd": 1.0, "even": 1.0}}]}


def kinds_data(e2e_data, folder):
    """The e2e problems with a kind each (by row parity): ``even`` rows and ``odd`` rows."""
    rows = [json.loads(line) for line in e2e_data["train"].read_text().splitlines()]
    rows = [{**row, "kind": "odd" if i % 2 else "even"} for i, row in enumerate(rows)]
    (folder / "kinds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "curriculum.yaml").write_text(yaml.safe_dump({"data": {"curriculum": STAGES}}))
    return {**e2e_data, "train": folder / "kinds.jsonl"}, {r["id"]: r["kind"] for r in rows}


def steps(path):
    """Per RL step (the last record of a step: a resumed run's), the prompt ids it trained."""
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return {r["rl_step"]: r["trained"] for r in records if "start" not in r}


def test_a_killed_curriculum_run_resumes_in_its_stage_with_the_same_stream(e2e_base, e2e_data, tmp_path):
    data, kind_of = kinds_data(e2e_data, tmp_path)
    killed_root, straight_root = tmp_path / "killed", tmp_path / "straight"
    killed_root.mkdir()

    def extra(root):
        return ["--config", str(tmp_path / "curriculum.yaml"), "--checkpoint.every_n_train_steps", "2",
                "--trainer.limit_val_batches", "0", "--trainer.callbacks+=tests.e2e.helpers.RecordSteps",
                "--trainer.callbacks.path", str(root.parent / f"{root.name}.jsonl")]

    killed = killed_at_step_3(e2e_base, data, killed_root, *extra(killed_root))
    try:
        run_cli(cli_args("fit", "tiny_cpu_reinforce", e2e_base, data, straight_root, "--trainer.max_steps", "4",
                         *extra(straight_root)))
        killed.killed()
    finally:
        killed.stop()
    ckpt = torch.load(killed_root / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["zerotir"]["rl_steps_done"] == 2 and ckpt["PromptDataModule"]["curriculum"]["stage"] == 0
    before_resume = steps(tmp_path / "killed.jsonl")
    cli = run_cli(cli_args("fit", "tiny_cpu_reinforce", e2e_base, data, killed_root, "--trainer.max_steps", "4",
                           "--ckpt_path", "last", *extra(killed_root)))
    assert cli.model.rl_steps_done == 4

    resumed, straight = steps(tmp_path / "killed.jsonl"), steps(tmp_path / "straight.jsonl")
    assert resumed == straight and sorted(resumed) == [1, 2, 3, 4]
    assert before_resume[3] == resumed[3]  # the killed run's step 3, drawn again from the checkpoint's state
    assert [sorted({kind_of[i] for i in resumed[s]}) for s in (1, 2)] == [["even"], ["even"]]
    assert {kind_of[i] for s in (3, 4) for i in resumed[s]} <= {"even", "odd"}
    # No batch trained twice: 4 batches consumed, one per step, as the straight run's.
    final = torch.load(killed_root / "checkpoints" / "last.ckpt", weights_only=False)["PromptDataModule"]
    assert final["consumed"] == 4 and final["curriculum"]["stage"] == 1 and final["curriculum"]["start"] == 2
    for root in (killed_root, straight_root):
        scalars = read_scalars(root / "tensorboard")
        assert scalars["data/stage"] == [(1, 0.0), (2, 0.0), (3, 1.0), (4, 1.0)]
        shares = dict(scalars["data/kind_share/even"])
        assert [shares[s] for s in (1, 2)] == [1.0, 1.0] and sorted(shares) == [1, 2, 3, 4]
        for s in (3, 4):
            assert shares[s] == pytest.approx(sum(kind_of[i] == "even" for i in resumed[s]) / len(resumed[s]))
