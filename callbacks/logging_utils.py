"""How the callbacks write scalars: on the RL-step axis, once per tag.

Under manual optimization ``trainer.global_step`` counts optimizer steps (PPO epochs x micro-batches per RL step),
so ``pl_module.log`` alone would put rollout statistics on the wrong x axis. The callbacks therefore
    * call ``pl_module.log(..., logger=False)`` so the values reach ``trainer.callback_metrics`` and the progress bar
      (and can be monitored by ``ModelCheckpoint`` / ``EarlyStopping``), and
    * write them to every logger with ``logger.log_metrics(metrics, step=pl_module.rl_step)``, so each TensorBoard
      tag has exactly one series, indexed by the RL step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def rl_step(pl_module: Any) -> int:
    """The index of the RL step in progress, as exposed by the module (``pl_module.rl_step``)."""
    step = getattr(pl_module, "rl_step", None)
    if not isinstance(step, int) or isinstance(step, bool):
        raise AttributeError(
            f"{type(pl_module).__name__} must expose `rl_step: int` (the index of the RL step in progress) for the "
            f"zerotir callbacks; got {step!r}"
        )
    return step


def log_scalars(trainer: Any, pl_module: Any, metrics: Mapping[str, float], step: int) -> None:
    """Send ``metrics`` to the progress bar / callback metrics and to every logger at x = ``step``."""
    if not metrics:
        return
    values = {name: float(value) for name, value in metrics.items()}
    for name, value in values.items():
        pl_module.log(name, value, logger=False, on_step=True, on_epoch=False, batch_size=1)
    for logger in getattr(trainer, "loggers", []):
        logger.log_metrics(values, step=step)
