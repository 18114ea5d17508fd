"""The RL-step progress bar through a pipe: one line per RL step with its reward and tool use, the right k of N
after a resume, and each line ended (nothing glued to what prints next)."""

from __future__ import annotations

import io
import re

import lightning.pytorch as pl
import torch

from callbacks.progress import RLStepProgressBar, rl_step_description, rl_step_total
from tests.callbacks.helpers import make_batch, step_outputs

OPTIMIZER_STEPS_PER_RL_STEP = 2  # max_steps counts optimizer steps: the bar must still count RL steps


class TwoOptimizerStepsPerRLStep(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.layer = torch.nn.Linear(2, 1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(list(range(10)), batch_size=1)

    def val_dataloader(self):
        return torch.utils.data.DataLoader(list(range(2)), batch_size=1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        for _ in range(OPTIMIZER_STEPS_PER_RL_STEP):
            optimizer.zero_grad()
            self.manual_backward(self.layer(torch.ones(1, 2)).sum())
            optimizer.step()
        rollout = make_batch([1, 1, 1, 0], [0, 0, 1, 1], num_calls=[1, 0, 2, 0])
        return step_outputs(rollout, rl_step=self.trainer.global_step // OPTIMIZER_STEPS_PER_RL_STEP)

    def validation_step(self, batch, batch_idx):
        return None


def fit(stream: io.StringIO, max_rl_steps: int, ckpt_path=None, val_every: int | None = None) -> pl.Trainer:
    trainer = pl.Trainer(accelerator="cpu", max_steps=max_rl_steps * OPTIMIZER_STEPS_PER_RL_STEP, logger=False,
                         enable_checkpointing=False, enable_model_summary=False, num_sanity_val_steps=0,
                         limit_val_batches=2 if val_every else 0, val_check_interval=val_every,
                         callbacks=[RLStepProgressBar(lines=True, stream=stream)])
    trainer.fit(TwoOptimizerStepsPerRLStep(), ckpt_path=ckpt_path)
    return trainer


STEP_LINE = re.compile(r"^RL step (\d+)/(\d+) \| reward 0\.75 \| tool use 50% \| \d+:\d\d elapsed, eta (\?|\d+:\d\d)$")


def step_lines(text: str) -> list[tuple[int, int]]:
    return [(int(m.group(1)), int(m.group(2))) for m in map(STEP_LINE.match, text.splitlines()) if m]


def test_one_line_per_rl_step_with_reward_and_tool_use_and_k_of_n_after_resume(tmp_path):
    first = io.StringIO()
    trainer = fit(first, max_rl_steps=2)
    assert step_lines(first.getvalue()) == [(1, 4 // 2), (2, 2)]
    checkpoint = tmp_path / "after2.ckpt"
    trainer.save_checkpoint(checkpoint)

    resumed = io.StringIO()
    fit(resumed, max_rl_steps=5, ckpt_path=checkpoint)
    text = resumed.getvalue()
    assert text.splitlines()[0].startswith("resumed after 4 optimizer steps")
    assert step_lines(text) == [(3, 5), (4, 5), (5, 5)]  # not "batch 3 of the epoch's 3 left"
    assert all(STEP_LINE.match(line) or line.startswith("resumed") for line in text.splitlines())
    assert text.endswith("\n")
    assert "eta ?" in text.splitlines()[1] and "eta ?" not in text.splitlines()[2]  # timed from this process's steps


def test_validation_prints_its_own_lines_between_steps():
    out = io.StringIO()
    fit(out, max_rl_steps=2, val_every=1)
    lines = out.getvalue().splitlines()
    assert [line.split(" |")[0] for line in lines] == [
        "RL step 1/2", "validation batch 1/2", "validation batch 2/2",
        "RL step 2/2", "validation batch 1/2", "validation batch 2/2"]


def test_totals_and_description():
    assert rl_step_total(40, 0, 0) == 40 and rl_step_total(-1, 5, 5) is None
    assert rl_step_total(80, 6, 3) == 40  # two optimizer steps per RL step
    assert rl_step_description(40) == "RL steps (of 40)" and rl_step_description(-1) == "RL steps"


def test_with_several_tools_each_is_shown_every_step_a_tool_never_called_at_0():
    from zerotir.types import ToolCall

    rollout = make_batch([1, 0, 1, 0], [0, 0, 1, 1], num_calls=[1, 0, 2, 0])
    rollout.tool_calls = [[ToolCall(code="1+1", output="2", status="ok", tool="python")], [],
                          [ToolCall(code="x", output="", status="ok", tool="lookup"),
                           ToolCall(code="2+2", output="4", status="ok", tool="python")], []]
    out = io.StringIO()
    bar = RLStepProgressBar(lines=True, stream=out, tools=["python", "calculator"])
    bar.on_train_start(pl.Trainer(logger=False, enable_checkpointing=False, enable_model_summary=False), None)
    trainer = type("T", (), {"max_steps": 4, "global_step": 1})()
    bar.on_train_batch_end(trainer, None, step_outputs(rollout, rl_step=1), None, 0)
    rollout.tool_calls = [[], [], [], []]
    bar.on_train_batch_end(trainer, None, step_outputs(rollout, rl_step=2), None, 1)
    first, second = out.getvalue().splitlines()
    assert "| reward 0.50 | tool use 50% | python 50% | calculator 0% | lookup 25% |" in first
    assert "| python 0% | calculator 0% | lookup 0% |" in second  # a tool called before stays, at 0
    assert "code use" not in first
