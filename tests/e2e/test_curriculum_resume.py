"""A ``data.curriculum`` run killed (SIGKILL) after a checkpoint and resumed: its steps train the prompts, kinds and
stages of a run never killed (stage 0 for 2 steps, then stage 1, across the resume), and no batch trained twice.

Stages switched by steps make the stream a function of the batch index, so what an unkilled run trains is the data
module's batches 0..3 (``unkilled_stream``), compared prompt for prompt (rewards are not comparable:
``tests/e2e/test_resume.py`` says why); the killed run's own step 3 is drawn again after the resume.
"""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from tests.e2e.base_model import TEMPLATE
from tests.e2e.conftest import cli_args, killed_at_step_3, read_scalars, run_cli
from zerotir.data.curriculum import CurriculumConfig, Stage
from zerotir.data.datamodule import PromptDataModule
from zerotir.toy.tokenizer import build_byte_tokenizer

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


def unkilled_stream(data, prompts_per_step, steps):
    """The prompt ids an unkilled run trains at RL steps 1..``steps``: batches 0.. of the curriculum's stream (in
    line, without refill, step k trains batch k - 1), drawn by the data module alone."""
    dm = PromptDataModule(train_files=[str(data["train"])], template=TEMPLATE, prompts_per_step=prompts_per_step,
                          curriculum=CurriculumConfig(stages=[Stage(**stage) for stage in STAGES["stages"]]))
    dm.set_tokenizer(build_byte_tokenizer())
    return {b + 1: [row["id"] for row in dm.train_batch(b)] for b in range(steps)}


def test_a_killed_curriculum_run_resumes_in_its_stage_with_the_same_stream(e2e_base, e2e_data, tmp_path):
    data, kind_of = kinds_data(e2e_data, tmp_path)
    root = tmp_path / "killed"
    root.mkdir()
    extra = ["--config", str(tmp_path / "curriculum.yaml"), "--checkpoint.every_n_train_steps", "2",
             "--model.sampling.n", "2", "--trainer.limit_val_batches", "0",
             "--trainer.callbacks+=tests.e2e.helpers.RecordSteps", "--trainer.callbacks.path", str(tmp_path / "steps.jsonl")]
    killed_at_step_3(e2e_base, data, root, *extra).killed()
    ckpt = torch.load(root / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["zerotir"]["rl_steps_done"] == 2 and ckpt["PromptDataModule"]["curriculum"]["stage"] == 0
    killed = steps(tmp_path / "steps.jsonl")
    cli = run_cli(cli_args("fit", "tiny_cpu_reinforce", e2e_base, data, root, "--trainer.max_steps", "4",
                           "--ckpt_path", "last", *extra))
    assert cli.model.rl_steps_done == 4

    resumed = steps(tmp_path / "steps.jsonl")
    assert sorted(killed) == [1, 2, 3] and killed[3] == resumed[3]  # step 3 drawn again from the checkpoint's state
    assert resumed == unkilled_stream(data, cli.datamodule.prompts_per_step, 4)
    assert [{kind_of[i] for i in resumed[s]} for s in (1, 2)] == [{"even"}, {"even"}]
    # No batch trained twice: 4 batches consumed, one per step; stage 1 began at batch 2 (step 3).
    final = torch.load(root / "checkpoints" / "last.ckpt", weights_only=False)["PromptDataModule"]
    assert final["consumed"] == 4 and final["curriculum"]["stage"] == 1 and final["curriculum"]["start"] == 2
    scalars = read_scalars(root / "tensorboard")  # steps 1-2 the killed run's, 3-4 the resumed run's
    assert scalars["data/stage"] == [(1, 0.0), (2, 0.0), (3, 1.0), (4, 1.0)]
    shares = dict(scalars["data/kind_share/even"])
    assert sorted(shares) == [1, 2, 3, 4] and all(
        shares[s] == pytest.approx(sum(kind_of[i] == "even" for i in resumed[s]) / len(resumed[s])) for s in shares)
