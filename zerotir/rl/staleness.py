"""Bounded staleness: when an engine host may start a batch, and how old the tokens of a trained batch are.

Versions count updates: the trainer's weights at RL step k (1-based) have seen ``k - 1`` updates, and a token sampled
by weights that had seen ``v`` updates has version ``v``. Its staleness when step k trains on it is ``k - 1 - v``.

The capacity rule (AReaL's ``max_head_offpolicyness``, SkyRL's bound): the batch of step k may start generating only
once the host's weights have version ``>= k - 1 - S``. Versions only grow while it generates, so every token of
that batch is then at most S versions old when step k trains on it; S = 0 is the synchronous schedule (each batch
waits for the update before it). ``check_staleness`` verifies the bound on the batch itself before an update.
"""

from __future__ import annotations

import torch
from torch import Tensor


def trainer_version(step: int) -> int:
    """The version of the trainer's weights when RL step ``step`` (1-based) trains: the updates before it."""
    if step < 1:
        raise ValueError(f"step={step}: RL steps count from 1")
    return step - 1


def may_start(step: int, version: int, max_staleness: int) -> bool:
    """Whether the batch of RL step ``step`` may start generating with weights of ``version`` (the capacity rule)."""
    if max_staleness < 0:
        raise ValueError(f"max_staleness={max_staleness}: must be >= 0")
    return version >= trainer_version(step) - max_staleness


def staleness_stats(versions: Tensor, mask: Tensor, step: int) -> dict[str, float]:
    """Staleness of the sampled tokens of a batch trained at RL step ``step``.

    Args:
        versions: (B, T) long, the weight version of each token (``Trajectories.versions``).
        mask: (B, T) bool, the action mask (only sampled tokens have a version).
        step: the RL step that trains on the batch.

    Returns:
        ``staleness_mean`` (over the sampled tokens), ``staleness_max`` and ``oldest_version`` (the smallest version);
        all 0 / the trainer's version for a batch without sampled tokens.

    Raises:
        ValueError: shapes differ, or a sampled token has no version (< 0) or one newer than the trainer's.
    """
    if versions.shape != mask.shape:
        raise ValueError(f"versions {tuple(versions.shape)} and mask {tuple(mask.shape)} must have the same shape")
    now = trainer_version(step)
    sampled = versions[mask.bool()]
    if sampled.numel() == 0:
        return {"staleness_mean": 0.0, "staleness_max": 0.0, "oldest_version": float(now)}
    oldest, newest = int(sampled.min()), int(sampled.max())
    if oldest < 0:
        raise ValueError("a sampled token has no weight version (-1): the engine that generated the batch did not "
                         "stamp it")
    if newest > now:
        raise ValueError(f"a sampled token has version {newest}, newer than the trainer's weights at step {step} "
                         f"({now}): the engine host's versions and the trainer's steps disagree")
    age = (now - sampled).to(torch.float64)
    return {"staleness_mean": float(age.mean()), "staleness_max": float(age.max()), "oldest_version": float(oldest)}


def check_staleness(stats: dict[str, float], step: int, max_staleness: int) -> None:
    """Refuse to train step ``step`` on a batch older than the bound (``staleness_stats``'s result).

    Raises:
        RuntimeError: the oldest sampled token is more than ``max_staleness`` versions old.
    """
    if stats["staleness_max"] > max_staleness:
        raise RuntimeError(f"step {step}: the batch's oldest token has version {int(stats['oldest_version'])}, "
                           f"{int(stats['staleness_max'])} updates old, over model.hosts.max_staleness="
                           f"{max_staleness}; the engine host broke the capacity rule")


class StreamCursor:
    """Which batch of the training stream each RL step takes, and the latest step each batch can train at: the
    capacity rule's bookkeeping, one for the thread host and the Ray engines alike.

    Steps take the stream's batches in order from ``first_batch`` (``first_step``'s): each step one, and with
    refill (``model.filters.refill``) more, the step asking again. A batch not yet taken is trained at the latest at
    step ``latest_step(index)``: as if every later step took one batch (refill batches taken so far only make it
    earlier), so gating batch ``index`` on that step keeps the bound whatever the steps take.

    Args:
        first_step: the first RL step that takes a batch (``rl_steps_done + 1`` on a resume).
        first_batch: its batch index (the first unconsumed batch).
    """

    def __init__(self, first_step: int, first_batch: int):
        self.first_step, self.first_batch = first_step, first_batch
        self.taken = first_step - 1  # the last step handed a batch
        self.next_take = first_batch  # the batch the trainer takes next
        self.refills = 0  # batches taken beyond one per step

    def take(self, step: int) -> tuple[int, bool]:
        """The index of the batch ``step`` takes now and whether it is a refill batch (``step`` again); the refill
        is counted at once (it may let one more batch start), the batch once ``handed``.

        Raises:
            ValueError: ``step`` is neither the next step nor, for a refill, the last one taken.
        """
        refill = step == self.taken >= self.first_step
        if step != self.taken + 1 and not refill:
            again = f" (or {self.taken} again, a refill batch)" if self.taken >= self.first_step else ""
            raise ValueError(f"step {step} asked for a batch: steps take their batches in order; the next one is "
                             f"{self.taken + 1}{again}")
        self.refills += refill
        return self.next_take, refill

    def handed(self, step: int) -> None:
        """The batch ``take`` named went to ``step``."""
        self.taken, self.next_take = step, self.next_take + 1

    def latest_step(self, index: int) -> int:
        """The latest RL step that can train on stream batch ``index`` (>= ``next_take``)."""
        return self.first_step + index - self.first_batch - self.refills

    def may_start(self, index: int, version: int, max_staleness: int) -> bool:
        """Whether batch ``index`` may start generating with weights of ``version`` (the capacity rule)."""
        return may_start(self.latest_step(index), version, max_staleness)
