"""Pass-rate filtering: train only on prompts the policy sometimes solves and sometimes fails.

A prompt group whose n samples are all right or all wrong carries no learning signal for group baselines (every
advantage is 0) and little for the others, so ZeroTIR drops it (e.g. keeps 2..6 correct of 8).

The decision (``PassRateFilter.decide``) is a keep mask (``pass_rate_keep_mask``, pure), one collective that counts
the kept and seen groups over all ranks (``global_group_counts``, so every rank takes the same skip decision), and
the skip rule on those counts (``pass_rate_decision``, pure). The callback hands it to the module once,
through the module's one explicit hook (``set_rollout_filter``, at ``setup``); the RL step applies it
(``zerotir.rl.step``) and returns it in its ``StepResult``, from which the callback counts and logs what was kept
(``on_train_batch_end``). When fewer than ``min_keep_groups`` groups pass, the decision keeps nothing and the step's
update is skipped.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

from callbacks.logging_utils import log_scalars
from zerotir import metric_names
from zerotir.rl.algorithms import group_stats
from zerotir.rl.step import FilterDecision, StepResult
from zerotir.scale.distributed import global_group_counts
from zerotir.types import Trajectories


def pass_rate_keep_mask(rewards: torch.Tensor, group_ids: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Which trajectories belong to a group whose mean reward lies in [low, high] (both ends inclusive).

    Means are computed in float64, so a bound written as a decimal (0.25, 0.6) compares exactly with k / n.
    With 8 samples and 0/1 rewards, low=0.25 and high=0.75 keep the groups with 2..6 correct.

    Args:
        rewards: (B,) outcome rewards.
        group_ids: (B,) prompt index of each trajectory.
        low: smallest group mean kept.
        high: largest group mean kept.

    Returns:
        (B,) bool mask of the trajectories to keep.
    """
    if low > high:
        raise ValueError(f"low ({low}) must be <= high ({high})")
    means, _, _ = group_stats(rewards, group_ids)
    return (means >= low) & (means <= high)


def pass_rate_decision(keep: torch.Tensor, kept_groups: int, groups: int, min_keep_groups: int = 1) -> FilterDecision:
    """The filter's decision for one step from its keep mask and the group counts: a pure function (the caller
    counts the groups over all ranks first, ``global_group_counts``, so that every rank decides the same).

    Args:
        keep: (B,) this rank's keep mask (``pass_rate_keep_mask``).
        kept_groups / groups: prompt groups kept / seen, over all ranks.
        min_keep_groups: fewer kept groups than this keep nothing: the step is skipped.
    """
    if kept_groups < min_keep_groups:
        return FilterDecision(torch.zeros_like(keep), 0, groups, skipped=True)
    return FilterDecision(keep, kept_groups, groups)


class PassRateFilter(Callback):
    """Drop prompt groups whose pass rate (mean reward) lies outside [low, high]; log the kept fraction.

    Its statistics live in ``state_dict`` so they survive ``fit --ckpt_path``.

    Args:
        low: smallest group mean reward kept (inclusive). The default 0.01 drops all-wrong groups for any n <= 100.
        high: largest group mean reward kept (inclusive). The default 0.99 drops all-right groups for any n <= 100.
        enabled: when False every trajectory trains and nothing is counted or logged.
        min_keep_groups: if fewer groups than this pass, the whole step is skipped.
    """

    def __init__(self, low: float = 0.01, high: float = 0.99, enabled: bool = True, min_keep_groups: int = 1) -> None:
        if low > high:
            raise ValueError(f"PassRateFilter: low ({low}) must be <= high ({high})")
        if not isinstance(min_keep_groups, int) or min_keep_groups < 1:
            raise ValueError(f"PassRateFilter: min_keep_groups must be an int >= 1, got {min_keep_groups!r}")
        self.low = float(low)
        self.high = float(high)
        self.enabled = enabled
        self.min_keep_groups = min_keep_groups
        self.steps_seen = 0
        self.steps_skipped = 0  # steps where nothing (or too little) was kept and the update is skipped
        self.groups_seen = 0
        self.groups_kept = 0
        self.trajectories_seen = 0
        self.trajectories_kept = 0
        self.last_kept_fraction = 1.0

    def decide(self, batch: Trajectories) -> FilterDecision:
        """This filter's decision for ``batch`` (nothing is counted in the filter's statistics here). A collective
        under a process group: every rank calls it at the same step."""
        keep = pass_rate_keep_mask(batch.rewards, batch.group_ids, self.low, self.high)
        kept_groups, groups = global_group_counts(keep, batch.group_ids)  # all-reduce over the ranks
        return pass_rate_decision(keep, kept_groups, groups, self.min_keep_groups)

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self.enabled and stage == "fit":
            pl_module.set_rollout_filter(self.decide)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self.enabled and stage == "fit":
            pl_module.set_rollout_filter(None)

    def observe(self, result: StepResult) -> None:
        """Count what the step kept (its decision came from ``decide``)."""
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
        if not self.enabled:
            return
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
