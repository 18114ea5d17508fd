"""Pass-rate filtering: train only on prompts the policy sometimes solves and sometimes fails.

A prompt group whose n samples are all right or all wrong carries no learning signal for group baselines (every
advantage is 0) and little for the others, so ZeroTIR drops it (e.g. keeps 2..6 correct of 8).

Protocol with the module: after rewards are filled, the module calls
``batch = callback.on_rollout_scored(trainer, pl_module, batch)`` on every callback that defines that method, in
order, and trains on what comes back. When no group passes (or fewer than ``min_keep_groups``), the filter returns
an empty selection (``len(batch) == 0``) and the module must skip the update of that step.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

from callbacks.logging_utils import log_scalars, rl_step
from zerotir import metric_names
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
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_ids must both be (B,), got {tuple(rewards.shape)} and {tuple(group_ids.shape)}"
        )
    if rewards.numel() == 0:
        return torch.zeros(0, dtype=torch.bool, device=rewards.device)
    _, inverse = torch.unique(group_ids, return_inverse=True)
    num_groups = int(inverse.max().item()) + 1
    r = rewards.to(torch.float64)
    sums = torch.zeros(num_groups, dtype=torch.float64, device=r.device).index_add_(0, inverse, r)
    counts = torch.zeros_like(sums).index_add_(0, inverse, torch.ones_like(r))
    means = sums / counts
    return ((means >= low) & (means <= high))[inverse]


class PassRateFilter(Callback):
    """Drop prompt groups whose pass rate (mean reward) lies outside [low, high]; log the kept fraction.

    Its statistics live in ``state_dict`` so they survive ``fit --ckpt_path``.

    Args:
        low: smallest group mean reward kept (inclusive). The default 0.01 drops all-wrong groups for any n <= 100.
        high: largest group mean reward kept (inclusive). The default 0.99 drops all-right groups for any n <= 100.
        enabled: when False the batch passes through untouched and nothing is counted or logged.
        min_keep_groups: if fewer groups than this pass, the whole step is skipped (an empty selection is returned).
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

    def filter(self, batch: Trajectories) -> Trajectories:
        """Apply the filter to ``batch`` and update the statistics (no logging)."""
        keep = pass_rate_keep_mask(batch.rewards, batch.group_ids, self.low, self.high)
        # Counted over all ranks (each rank holds whole prompt groups), so every rank takes the same skip decision
        # and logs the same kept fraction; equal to the local counts in a single process.
        kept_groups, groups = global_group_counts(keep, batch.group_ids)
        if kept_groups < self.min_keep_groups:
            keep = torch.zeros_like(keep)
            kept_groups = 0
            self.steps_skipped += 1
        self.steps_seen += 1
        self.groups_seen += groups
        self.groups_kept += kept_groups
        self.trajectories_seen += len(batch)
        self.trajectories_kept += int(keep.sum().item())
        self.last_kept_fraction = kept_groups / max(groups, 1)
        return batch.select(keep)

    def on_rollout_scored(self, trainer: Any, pl_module: Any, batch: Trajectories) -> Trajectories:
        """Return the kept rows of ``batch`` (possibly none: then skip the update) and log the kept fraction."""
        if not self.enabled:
            return batch
        kept = self.filter(batch)
        log_scalars(trainer, pl_module, {metric_names.KEPT_FRACTION: self.last_kept_fraction}, rl_step(pl_module))
        return kept

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
