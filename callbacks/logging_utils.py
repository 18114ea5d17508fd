"""How the callbacks write scalars: on the RL-step axis, once per tag.

Under manual optimization ``trainer.global_step`` counts optimizer steps (PPO epochs x micro-batches per RL step),
so ``pl_module.log`` alone would put rollout statistics on the wrong x axis. The callbacks therefore
    * call ``pl_module.log(..., logger=False)`` so the values reach ``trainer.callback_metrics`` and the progress bar
      (and can be monitored by ``ModelCheckpoint`` / ``EarlyStopping``), and
    * write them to every logger with ``logger.log_metrics(metrics, step=rl_step)`` (the ``StepResult``'s), so each TensorBoard
      tag has exactly one series, indexed by the RL step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def log_scalars(trainer: Any, pl_module: Any, metrics: Mapping[str, float], step: int) -> None:
    """Send ``metrics`` to the progress bar / callback metrics and to every logger at x = ``step``."""
    if not metrics:
        return
    values = {name: float(value) for name, value in metrics.items()}
    for name, value in values.items():
        pl_module.log(name, value, logger=False, on_step=True, on_epoch=False, batch_size=1)
    for logger in trainer.loggers:
        logger.log_metrics(values, step=step)
