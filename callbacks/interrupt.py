"""Ctrl-C keeps the run: a resumable ``last.ckpt`` at the last completed RL step, and one line saying where
``--ckpt_path last`` resumes.

Lightning answers a ``KeyboardInterrupt`` (SIGINT) during ``fit`` by calling every callback's ``on_exception`` and
exiting; its ``ModelCheckpoint`` keeps only what its schedule (``checkpoint.every_n_train_steps``) saved before, so
the steps since were lost without a word. ``SaveOnInterrupt`` saves the state of the last *completed* RL step into
the checkpoint folder's ``last.ckpt`` when that state is whole:

* interrupted while the step in progress is rolling out (most of a step's time), nothing of that step has touched
  the saved state yet (weights, optimizer, data position, curriculum, filters' counts): saved;
* interrupted once the step started changing that state (the curriculum has seen its results, the update is under
  way: ``ZeroTIRModule.step_changing_state``), the state is half of one step and half of the next: not saved, and
  the line names the last checkpoint saved, which ``--ckpt_path last`` resumes.

On several processes each rank receives the signal and saves together (``trainer.save_checkpoint`` is collective);
rank 0 says the line. The CLI adds the callback to every run (``zerotir.cli.app.RUN_CALLBACKS``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn


class SaveOnInterrupt(Callback):
    """Save ``last.ckpt`` at the last completed RL step on Ctrl-C during ``fit`` (see the module docstring)."""

    def __init__(self) -> None:
        self.saved_step: int | None = None  # the RL step of the last checkpoint this run saved or resumed from

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        self.saved_step = int(checkpoint.get("zerotir", {}).get("rl_steps_done", checkpoint["global_step"]))

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        self.saved_step = int(checkpoint.get("zerotir", {}).get("rl_steps_done", checkpoint["global_step"]))

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if not isinstance(exception, KeyboardInterrupt) or trainer.state.fn != TrainerFn.FITTING:
            return
        done = int(pl_module.rl_steps_done)
        line = self._save(trainer, pl_module, done, trainer.checkpoint_callback)
        if trainer.is_global_zero:
            sys.stderr.write(f"zerotir: interrupted during RL step {done + 1}: {line}\n")
            sys.stderr.flush()

    def _save(self, trainer: Any, pl_module: Any, done: int, checkpoint: ModelCheckpoint | None) -> str:
        """Save when the state is whole; the line saying what was kept and where ``--ckpt_path last`` resumes."""
        if checkpoint is None or checkpoint.dirpath is None:
            return "checkpointing is off (trainer.enable_checkpointing false): nothing saved, nothing to resume"
        if pl_module.step_changing_state or trainer.global_step != done:
            if self.saved_step is None:
                return ("the step was changing the model's state, which is not saved half-done; no checkpoint "
                        "yet: start again without --ckpt_path")
            return (f"the step was changing the model's state, which is not saved half-done; --ckpt_path last "
                    f"resumes at RL step {self.saved_step + 1} from the last checkpoint in {checkpoint.dirpath}")
        if done == 0:
            return "no RL step completed, nothing to save: start again without --ckpt_path"
        path = Path(checkpoint.dirpath) / f"{checkpoint.CHECKPOINT_NAME_LAST}{checkpoint.FILE_EXTENSION}"
        if self.saved_step != done:
            checkpoint.last_model_path = str(path)  # part of the saved state: a resumed run writes last.ckpt again
            trainer.save_checkpoint(path)
        return f"saved RL step {done} to {path}; --ckpt_path last resumes at RL step {done + 1}"
