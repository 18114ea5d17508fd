"""One value per step on resumed curves.

A run killed at RL step 12 whose last checkpoint is step 10 has already logged steps 11 and 12; resumed with
``--ckpt_path last`` it logs them again into a new event file, and TensorBoard would show both (a zig-zag on every
curve). TensorBoard's answer is the writer's purge step: a ``SessionLog.START`` event at step k makes every reader
(TensorBoard, ``EventAccumulator``, so also ``zerotir scaling``) drop the events of earlier files at steps >= k.

On a resumed fit this callback gives every ``TensorBoardLogger``'s ``SummaryWriter`` the purge step
``rl_steps_done + 1`` of the checkpoint (the first step the resumed run logs; read in ``on_load_checkpoint``), once
training starts (``on_train_start``: under DeepSpeed the restore comes after the writer is created). The writer's current file is closed; its next event opens a
new file that starts with the purge. The CLI adds it to every run (``zerotir.cli.app.RUN_CALLBACKS``).
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger


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
        self._resumed_from: int | None = None  # RL steps done in the checkpoint being resumed

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        self._resumed_from = int(checkpoint.get("zerotir", {}).get("rl_steps_done", 0))

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        resumed, self._resumed_from = self._resumed_from, None
        if trainer.ckpt_path is None or resumed is None or not trainer.is_global_zero:
            return
        self.purged_from = resumed + 1
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                purge_from(logger.experiment, self.purged_from)
