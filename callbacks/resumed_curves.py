"""One value per step on resumed curves.

A run killed at RL step 12 whose last checkpoint is step 10 has already logged steps 11 and 12; resumed with
``--ckpt_path last`` it logs them again into a new event file, and TensorBoard would show both (a zig-zag on every
curve). TensorBoard's answer is the writer's purge step: a ``SessionLog.START`` event at step k makes every reader
(TensorBoard, ``EventAccumulator``, so also ``zerotir scaling``) drop the events of earlier files at steps >= k.

On a resumed fit this callback gives every ``TensorBoardLogger``'s ``SummaryWriter`` the purge step
``rl_step + 1`` (the first step the resumed run logs), after the checkpoint is restored (``on_train_start``: under
DeepSpeed the restore comes after the writer is created). The writer's current file is closed; its next event opens a
new file that starts with the purge. ``ZeroTIRModule.configure_callbacks`` adds it to every run.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger

from callbacks.logging_utils import rl_step


def purge_from(writer: Any, step: int) -> None:
    """Make ``writer`` (a ``torch.utils.tensorboard.SummaryWriter``) hide every earlier event at steps >= ``step``.

    ``SummaryWriter`` writes its ``purge_step`` events when it opens an event file; closing it makes the next event
    open a new one (in the same folder).
    """
    if step < 1:
        raise ValueError(f"purge step {step}: must be >= 1")
    writer.close()
    writer.purge_step = step


class PurgeResumedSteps(Callback):
    """On ``fit --ckpt_path ...``, purge TensorBoard's events after the checkpoint's RL step (see module doc)."""

    def __init__(self) -> None:
        self.purged_from: int | None = None  # the purge step of the last resume (None: not resumed)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if trainer.ckpt_path is None or not trainer.is_global_zero:
            return
        self.purged_from = rl_step(pl_module) + 1
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                purge_from(logger.experiment, self.purged_from)
