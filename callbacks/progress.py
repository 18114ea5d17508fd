"""A progress bar that counts RL steps.

Lightning's bar describes the training loop by epoch ("Epoch 0/-2" for a run bounded by ``trainer.max_steps``, whose
``max_epochs`` is then -1); a ZeroTIR run's prompt stream has no epochs that mean anything to its user, and one RL
step is one training batch. The CLI adds this bar unless the config names another progress bar or turns the bar off.
"""

from __future__ import annotations

from lightning.pytorch.callbacks import RichProgressBar


def rl_step_description(max_steps: int | None) -> str:
    """``"RL steps"``, with the bound when the run has one (``max_steps`` of -1 means none)."""
    return "RL steps" if max_steps is None or max_steps < 0 else f"RL steps (of {max_steps})"


class RLStepProgressBar(RichProgressBar):
    """Lightning's rich progress bar with the training bar named by RL steps instead of epochs."""

    def _get_train_description(self, current_epoch: int) -> str:
        return rl_step_description(self.trainer.max_steps)
