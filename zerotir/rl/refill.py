"""Dynamic sampling with refill (``model.filters.refill``): a step's batch assembled from generation rounds until it
holds its number of kept prompt groups, and a run whose steps train nothing that says so, then stops.

    round 1: the step's P prompts -> rollout -> keep decision     (kept k1 of P groups)
    round 2: the next P prompts of the stream -> ...              (while k1 + k2 + ... < P and rounds < max_rounds)
    merged:  every round's trajectories, group ids renumbered (round r's after round r-1's), the kept groups cut to
             exactly P: the round that overfills keeps its first groups (rank by rank, then by group id)

A round's keep decision is that of ``model.filters``, taken on counts over all ranks (``FilterDecision.kept_groups``), so
every rank runs the same rounds and cuts the same number of groups. When the rounds run out the step trains on the
groups it kept (a smaller batch): those groups are informative and already paid for, where skipping would waste
them and stopping would end a run over one hard stretch of data; the step is counted and warned about
(``FillWatch``). A step that keeps nothing makes no update; ``FillWatch`` warns with the count of such steps in a
row and stops the run at ``model.filters.refill.max_empty_steps``.

The merged rollout (every round, before filtering) is what the callbacks see: its rollout statistics cover all the
generated trajectories, and its ``BatchInfo`` names every round's prompts. Nothing here imports Lightning.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from zerotir.config import RefillConfig
from zerotir.rl.guards import EmptyStepsError
from zerotir.rl.step import FilterDecision
from zerotir.parallel.distributed import gather_objects, global_group_counts, rank_and_world_size
from zerotir.types import PromptRow, Trajectories

log = logging.getLogger(__name__)


@dataclass
class Round:
    """One generation round of a step, on this rank."""

    rows: list[PromptRow]  # the prompt rows its group ids index
    trajectories: Trajectories  # scored
    decision: FilterDecision | None  # the filters' (None: every rule off)
    timings: dict[str, float] = field(default_factory=dict)


@dataclass
class FilledBatch:
    """A step's batch, merged from its rounds."""

    rows: list[PromptRow]  # every round's rows, in order: index = group id of ``trajectories``
    trajectories: Trajectories  # every round's trajectories, before filtering
    decision: FilterDecision | None  # over ``trajectories``: at most ``target`` kept groups (over all ranks)
    kept: int  # prompt groups with a trajectory kept, over all ranks (``target`` without a filter)
    rounds: int  # generation rounds the step took
    target: int  # kept groups a full batch holds (data.prompts_per_step)
    timings: dict[str, float] = field(default_factory=dict)  # summed over the rounds

    @property
    def short(self) -> bool:
        """The batch holds fewer than ``target`` kept groups (with refill: its rounds ran out)."""
        return self.kept < self.target


def first_kept_groups(keep: Tensor, group_ids: Tensor, groups: int) -> Tensor:
    """``keep`` restricted to its first ``groups`` kept groups by group id (a kept group keeps what it kept).

    Example: keep [T, T, F, F, T, T], group ids [0, 0, 1, 1, 2, 2], groups=1 -> [T, T, F, F, F, F].
    """
    kept_ids = torch.unique(group_ids[keep])  # sorted
    allowed = torch.isin(group_ids, kept_ids[:max(groups, 0)])
    return keep & allowed


def rank_share(counts: Sequence[int], rank: int, wanted: int) -> int:
    """How many of its kept groups rank ``rank`` contributes when ``wanted`` groups are taken from the ranks in rank
    order (``counts``: each rank's kept groups). Example: counts [3, 2, 4], wanted 4 -> rank 0: 3, 1: 1, 2: 0."""
    return max(0, min(counts[rank], wanted - sum(counts[:rank])))


def _cut(decision: FilterDecision, group_ids: Tensor, wanted: int) -> FilterDecision:
    """A decision that kept more groups (over all ranks) than ``wanted``, cut to ``wanted`` (the groups cut are
    simply not kept: no rule removed them); a collective."""
    keep = decision.keep.cpu()
    local = int(torch.unique(group_ids[keep]).numel())
    rank, _ = rank_and_world_size()
    mine = rank_share(gather_objects(local), rank, wanted)
    return replace(decision, keep=first_kept_groups(keep, group_ids, mine), kept_groups=wanted)


class BatchFill:
    """Collects the rounds of one step (``add`` each; it says when to stop) and merges them (``result``).

    Args:
        target: kept prompt groups a full batch holds, over all ranks (the step's global prompt count).
        max_rounds: ``model.filters.refill.max_rounds``.
    """

    def __init__(self, target: int, max_rounds: int) -> None:
        self.target, self.max_rounds = target, max_rounds
        self.rounds: list[Round] = []
        self.kept = 0  # kept groups so far, over all ranks (after the cut)

    def add(self, rnd: Round) -> bool:
        """Add a round; True when the step's batch is complete: full, without a filter, or out of rounds. A kept
        group is one with a trajectory kept, counted here over all ranks (a collective, as the decision was)."""
        decision = rnd.decision
        if decision is None:
            self.rounds.append(rnd)
            self.kept = self.target
            return True
        group_ids = rnd.trajectories.group_ids.cpu()
        kept = global_group_counts(decision.keep.cpu(), group_ids)[0]
        if kept > self.target - self.kept:
            decision, kept = _cut(decision, group_ids, self.target - self.kept), self.target - self.kept
        self.rounds.append(replace(rnd, decision=decision))
        self.kept += kept
        return self.kept >= self.target or len(self.rounds) >= self.max_rounds

    def result(self, pad_token_id: int) -> FilledBatch:
        """The merged batch (one round: its own trajectories and decision, unchanged); checked to hold exactly the
        kept groups counted, over all ranks (a collective on every rank, as the rounds were)."""
        parts, rows, offset = [], [], 0
        for rnd in self.rounds:
            parts.append(replace(rnd.trajectories, group_ids=rnd.trajectories.group_ids + offset))
            rows.extend(rnd.rows)
            offset += len(rnd.rows)
        one = len(self.rounds) == 1
        traj = self.rounds[0].trajectories if one else Trajectories.cat(parts, pad_token_id)
        decision = self.rounds[0].decision
        if decision is not None:
            if not one:  # removals and reward shaping concatenated too
                decision = FilterDecision.cat([rnd.decision for rnd in self.rounds], self.kept, self.kept == 0)
            held = global_group_counts(decision.keep.cpu(), traj.group_ids.cpu())[0]
            if held != self.kept:
                raise RuntimeError(f"refill: the merged batch holds {held} kept prompt groups, not the {self.kept} "
                                   f"its rounds kept (a full batch: {self.target})")
        timings: dict[str, float] = {}
        for rnd in self.rounds:
            for key, seconds in rnd.timings.items():
                timings[key] = timings.get(key, 0.0) + seconds
        return FilledBatch(rows, traj, decision, self.kept, len(self.rounds), self.target, timings)


class FillWatch:
    """What a step's batch became, never silently: the refill metrics of every step, a warning for a step whose
    rounds ran out short and for a step that trained nothing (with the count in a row), and ``EmptyStepsError`` after
    ``max_empty_steps`` of those in a row. Its counters survive resume (``state_dict``, in the module's checkpoint).

    When every response of such a step scored 0 (no group has one right), the filters are not the cause: the warning
    points at the reward and the call format instead.

    Args:
        config: the ``model.filters.refill`` group.
        call_format: ``model.tool.format``, named when every response scored 0.
    """

    def __init__(self, config: RefillConfig, call_format: str = "fences") -> None:
        self.config, self.call_format = config, call_format
        self.empty_in_a_row = 0  # consecutive steps without an update
        self.exhausted_steps = 0  # steps whose rounds ran out before the batch was full

    def update(self, step: int, filled: FilledBatch, skipped: bool) -> dict[str, float]:
        """Count step ``step`` (``skipped``: no rank trained anything); warn, or raise ``EmptyStepsError`` at the
        bound. Returns the step's metrics (``StepResult.refill``)."""
        cfg, decision = self.config, filled.decision
        exhausted = cfg.enabled and filled.short
        self.exhausted_steps += int(exhausted)
        self.empty_in_a_row = self.empty_in_a_row + 1 if skipped else 0
        seen = decision.groups if decision is not None else filled.target * filled.rounds
        rounds = f"{filled.rounds} generation round{'s' if filled.rounds > 1 else ''}"
        if self.empty_in_a_row >= cfg.max_empty_steps:
            raise EmptyStepsError(
                f"RL step {step}: {self.empty_in_a_row} consecutive steps without an update (model.filters.refill."
                f"max_empty_steps={cfg.max_empty_steps}); the filters kept no trajectory of the {seen} prompt groups "
                f"of the last one ({rounds}). Fix: widen the pass-rate bounds (model.filters.pass_rate_low / high), "
                f"let a step draw more prompts (model.filters.refill.max_rounds={cfg.max_rounds}), or use easier "
                f"data; then resume with `fit --ckpt_path last`{self._all_zero_hint(filled)}")
        if rank_and_world_size()[0] == 0:
            if skipped:
                log.warning("RL step %d: the filters kept no trajectory of the %d prompt groups (%s): no update, %d "
                            "consecutive steps without one; the run stops at model.filters.refill.max_empty_steps=%d. "
                            "Fix: widen the pass-rate bounds (model.filters.pass_rate_low / high) or raise "
                            "model.filters.refill.max_rounds=%d%s", step, seen, rounds, self.empty_in_a_row,
                            cfg.max_empty_steps, cfg.max_rounds, self._all_zero_hint(filled))
            elif exhausted:
                log.warning("RL step %d: %s (model.filters.refill.max_rounds=%d) kept %d of the %d prompt groups of a "
                            "full batch (data.prompts_per_step); the step trains on %d (%d short steps so far)", step,
                            rounds, cfg.max_rounds, filled.kept, filled.target, filled.kept, self.exhausted_steps)
        metrics = {"generation_rounds": float(filled.rounds), "prompts_consumed": float(filled.target * filled.rounds),
                   "empty_steps_in_a_row": float(self.empty_in_a_row)}
        if cfg.enabled:
            metrics["exhausted_steps"] = float(self.exhausted_steps)
        return metrics

    def _all_zero_hint(self, filled: FilledBatch) -> str:
        """A sentence for a step whose every response scored 0 (this rank's), else ""."""
        rewards = filled.trajectories.rewards
        if rewards.numel() == 0 or bool((rewards != 0).any()):
            return ""
        return (f". Every response of the step scored 0: check the reward (model.reward) and that the model writes "
                f"its calls in the configured format (model.tool.format={self.call_format}) and its answer as the "
                "reward reads it; `python -m zerotir rollouts <run folder>` shows what it wrote")

    def state_dict(self) -> dict[str, int]:
        return {"empty_in_a_row": self.empty_in_a_row, "exhausted_steps": self.exhausted_steps}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.empty_in_a_row = int(state.get("empty_in_a_row", 0))
        self.exhausted_steps = int(state.get("exhausted_steps", 0))
