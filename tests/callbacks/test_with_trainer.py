"""Both callbacks inside a real Lightning Trainer: TensorBoard tags on the RL-step axis, filter state across resume."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from callbacks import PassRateFilter, ScalingMetrics
from tests.callbacks.helpers import make_batch, step_outputs
from zerotir import metric_names as mn
from zerotir.config import FilterConfig, ToolConfig
from zerotir.filters.decide import decide
from zerotir.filters.trajectory import FilterContext

FILTERS = FilterConfig(pass_rate=True, pass_rate_low=0.25, pass_rate_high=0.75)

OPTIMIZER_STEPS_PER_RL_STEP = 2  # so trainer.global_step and the RL step differ


class ScriptedRLModule(pl.LightningModule):
    """Follows the module side of the callback protocol with a scripted rollout, the filters' decision and a trivial
    update."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.layer = torch.nn.Linear(2, 1)
        self.trained_rows: list[int] = []

    def train_dataloader(self):
        return torch.utils.data.DataLoader(list(range(3)), batch_size=1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def training_step(self, batch, batch_idx):
        rl_step = self.trainer.global_step // OPTIMIZER_STEPS_PER_RL_STEP
        # group 0 all right, group 1 half right: the filter keeps group 1 only
        rollout = make_batch([1, 1, 1, 0], [0, 0, 1, 1], num_calls=[1, 0, 2, 0], texts=["a", "b", "cc", "d"])
        decision = decide(FILTERS, rollout, FilterContext.of(ToolConfig(), 16), step=rl_step + 1, seed=0)
        self.trained_rows.append(int(decision.keep.sum()))
        optimizer = self.optimizers()
        for _ in range(OPTIMIZER_STEPS_PER_RL_STEP):
            optimizer.zero_grad()
            self.manual_backward(self.layer(torch.ones(1, 2)).sum())
            optimizer.step()
        timings = {"generation": 0.3, "sandbox": 0.1, "reward": 0.01, "update": 0.2, "weight_sync": 0.0, "step": 0.61}
        stats = {"kl": 0.0, "entropy": 1.0, "policy_loss": 0.1, "value_loss": 0.0, "clip_fraction": 0.0,
                 "grad_norm": 1.0, "lr": 0.1}
        return step_outputs(rollout, rl_step, decision, stats, timings)


def make_trainer(root: Path, epochs: int) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu",
        max_epochs=epochs,
        logger=TensorBoardLogger(root, name="run", version=0),
        callbacks=[PassRateFilter(), ScalingMetrics()],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def test_tags_steps_and_resume(tmp_path):
    trainer = make_trainer(tmp_path, epochs=1)
    module = ScriptedRLModule()
    trainer.fit(module)
    assert module.trained_rows == [2, 2, 2]
    assert trainer.callback_metrics[mn.KEPT_FRACTION] == 0.5  # the pl_module.log side
    checkpoint = tmp_path / "after3.ckpt"
    trainer.save_checkpoint(checkpoint)
    trainer.loggers[0].experiment.flush()

    events = EventAccumulator(str(tmp_path / "run" / "version_0"), size_guidance={"scalars": 0, "histograms": 0})
    events.Reload()
    scalar_tags = set(events.Tags()["scalars"])
    rollout_tags = {mn.REWARD_MEAN, mn.ACCURACY, mn.TOOL_CALL_RATE, mn.TOOL_IN_CORRECT, mn.CALLS_PER_RESPONSE,
                    mn.RESPONSE_LENGTH, mn.REPEAT_SCORE, mn.EXEC_ERROR_RATE, mn.TIMEOUT_RATE, mn.SANDBOX_ERROR_RATE,
                    mn.TRUNCATION_RATE, *mn.CORRECT_BY_CALLS}
    update_tags = {mn.KL, mn.ENTROPY, mn.POLICY_LOSS, mn.VALUE_LOSS, mn.CLIP_FRACTION, mn.GRAD_NORM, mn.LEARNING_RATE}
    time_tags = {mn.TIME_GENERATION, mn.TIME_SANDBOX, mn.TIME_REWARD, mn.TIME_UPDATE, mn.TIME_WEIGHT_SYNC, mn.TIME_STEP}
    assert rollout_tags | update_tags | time_tags | {mn.KEPT_FRACTION} <= scalar_tags
    # one point per RL step (0, 1, 2), not per optimizer step (global_step reached 6)
    assert [e.step for e in events.Scalars(mn.REWARD_MEAN)] == [0, 1, 2]
    assert [e.value for e in events.Scalars(mn.REWARD_MEAN)] == [0.75] * 3
    assert [e.step for e in events.Scalars(mn.KEPT_FRACTION)] == [0, 1, 2]
    assert trainer.global_step == 3 * OPTIMIZER_STEPS_PER_RL_STEP
    assert mn.CALLS_HIST in events.Tags()["histograms"]
    assert events.Histograms(mn.CALLS_HIST)[0].histogram_value.num == 4  # 4 trajectories per step

    state = torch.load(checkpoint, weights_only=False)["callbacks"]["PassRateFilter"]
    assert state["steps_seen"] == 3 and state["groups_seen"] == 6 and state["groups_kept"] == 3

    resumed_trainer = make_trainer(tmp_path / "resumed", epochs=2)
    resumed_trainer.fit(ScriptedRLModule(), ckpt_path=checkpoint)
    resumed_filter = resumed_trainer.callbacks[0]
    assert isinstance(resumed_filter, PassRateFilter)
    assert resumed_filter.steps_seen == 6 and resumed_filter.groups_kept == 6  # 3 restored + 3 new
