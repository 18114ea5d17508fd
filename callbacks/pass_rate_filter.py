"""What the filters of a run kept, counted and logged: ``filter/kept_fraction`` (prompt groups kept / seen) per step.

The rule itself is the pass-rate rule of ``model.filters`` (``pass_rate: true``, ``zerotir.filters.pass_rate``): the
RL step applies the decision of ``zerotir.filters.decide`` and returns it in its ``StepResult``, from which this
callback counts what was kept (``on_train_batch_end``). It decides nothing: a run without it trains the same. Its
counts live in ``state_dict`` so they survive ``fit --ckpt_path``.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import Callback

from callbacks.logging_utils import log_scalars
from zerotir import metric_names
from zerotir.rl.step import StepResult


class PassRateFilter(Callback):
    """Count the steps, prompt groups and trajectories the filters kept (a step without a decision is not counted)
    and log the kept fraction of prompt groups; the rule is ``model.filters.pass_rate``."""

    def __init__(self) -> None:
        self.steps_seen = 0
        self.steps_skipped = 0  # steps where nothing (or too little) was kept and the update is skipped
        self.groups_seen = 0
        self.groups_kept = 0
        self.trajectories_seen = 0
        self.trajectories_kept = 0
        self.last_kept_fraction = 1.0

    def observe(self, result: StepResult) -> None:
        """Count what the step kept (its decision came from ``zerotir.filters.decide``)."""
        decision = result.filter
        if decision is None:
            return
        self.steps_seen += 1
        self.steps_skipped += int(decision.skipped)
        self.groups_seen += decision.groups
        self.groups_kept += decision.kept_groups
        self.trajectories_seen += len(result.rollout)
        self.trajectories_kept += int(decision.keep.sum().item())
        self.last_kept_fraction = decision.kept_fraction

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        result: StepResult = outputs["step"]
        self.observe(result)
        if result.filter is not None:
            log_scalars(trainer, pl_module, {metric_names.KEPT_FRACTION: self.last_kept_fraction}, result.rl_step)

    _STATE_KEYS = (
        "steps_seen",
        "steps_skipped",
        "groups_seen",
        "groups_kept",
        "trajectories_seen",
        "trajectories_kept",
        "last_kept_fraction",
    )

    def state_dict(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in self._STATE_KEYS}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        missing = [key for key in self._STATE_KEYS if key not in state_dict]
        if missing:
            raise KeyError(f"PassRateFilter state is missing {missing}; the checkpoint was not written by this filter")
        for key in self._STATE_KEYS:
            setattr(self, key, state_dict[key])
