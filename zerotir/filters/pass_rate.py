"""The pass-rate rule of ``model.filters`` (``pass_rate: true``): train only on prompts the policy sometimes solves and
sometimes fails.

A prompt group whose n samples are all right or all wrong carries no learning signal for group baselines (every
advantage is 0) and little for the others, so ZeroTIR drops it (e.g. keeps 2..6 correct of 8). Unlike the trajectory
rules it judges a whole group, over ALL n samples of each prompt, so it is the rule that can drop prompt groups: the
one refill (``model.filters.refill``) draws more prompts for.

The decision is a keep mask (``pass_rate_keep_mask``, pure), one collective that counts the kept and seen groups over
all ranks (``global_group_counts``, so every rank takes the same skip decision), and the skip rule on those counts
(``pass_rate_decision``, pure): when fewer than ``min_keep_groups`` groups pass, it keeps nothing and the step's
update is skipped. ``zerotir.filters.decide`` composes it with the trajectory rules; ``callbacks.PassRateFilter``
only counts and logs what was kept.
"""

from __future__ import annotations

import torch

from zerotir.config import FilterConfig
from zerotir.rl.algorithms import group_stats
from zerotir.rl.step import FilterDecision
from zerotir.parallel.distributed import global_group_counts
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
    """The rule's decision for one step from its keep mask and the group counts: a pure function (the caller
    counts the groups over all ranks first, ``global_group_counts``, so that every rank decides the same).

    Args:
        keep: (B,) this rank's keep mask (``pass_rate_keep_mask``).
        kept_groups / groups: prompt groups kept / seen, over all ranks.
        min_keep_groups: fewer kept groups than this keep nothing: the step is skipped.
    """
    if kept_groups < min_keep_groups:
        return FilterDecision(torch.zeros_like(keep), 0, groups, skipped=True)
    return FilterDecision(keep, kept_groups, groups)


def pass_rate(cfg: FilterConfig, traj: Trajectories, counted: torch.Tensor | None = None) -> FilterDecision:
    """The pass-rate decision of ``model.filters`` on this rank's ``traj``, the rates taken over the rows ``counted``
    ((B,) bool; None: all of them): a row outside it (an infrastructure failure) neither counts in its group's rate
    nor is kept, and a group with none counted is not seen. A collective under a process group: every rank calls it
    at the same step."""
    # the share of correct answers (the reward's verdict): a graded or composed score keeps the rule's meaning; with
    # the math reward's 0 / 1 scores it is the group's mean reward
    correct, group_ids = traj.correct.cpu().float(), traj.group_ids.cpu()
    if counted is None:
        keep = pass_rate_keep_mask(correct, group_ids, cfg.pass_rate_low, cfg.pass_rate_high)
        kept_groups, groups = global_group_counts(keep, group_ids)  # all-reduce over the ranks
    else:
        rows = counted.cpu().bool()
        keep = torch.zeros(len(rows), dtype=torch.bool)
        keep[rows] = pass_rate_keep_mask(correct[rows], group_ids[rows], cfg.pass_rate_low, cfg.pass_rate_high)
        kept_groups, groups = global_group_counts(keep[rows], group_ids[rows])
    return pass_rate_decision(keep, kept_groups, groups, cfg.min_keep_groups)
