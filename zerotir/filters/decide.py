"""The step's keep decision: the rules of ``model.filters`` as one composition, pure but for one group count.

    infrastructure failures (a tool call or the score failed for a reason not the model's: ``infra_failed_rows``)
      -> pass rate (the group's difficulty, over ALL n samples of each prompt but those: ``pass_rate.pass_rate``)
      -> the trajectory rules (``trajectory.RULES``: each judges every trajectory by itself)
      -> "mask": truncated responses (``overlong.truncated_rows``)
      -> GRPO-RoC downsampling among the trajectories still kept (``roc``)
    keep = not removed by any of them; the RL step then removes the high-perplexity ones (it has the reference
    log-probs: ``FilterDecision.perplexity_threshold``) and adds the soft overlong penalty
    (``FilterDecision.reward_shaping``) to the rewards of the trajectories it trains on.

Baseline rule: a removed trajectory is dropped before the advantages, so a group baseline (GRPO, RLOO,
REINFORCE++-baseline) is taken over the group's remaining samples, as the paper's code does by dropping filtered
samples from its replay buffer before the update. A removed trajectory's reward is noise (a truncated right answer,
a shortcut through unexecuted code, a repetition loop): kept in the baseline, it would shift every other sample's
advantage by it.

An infrastructure failure (a dead sandbox, a tool that raised, a judge that did not answer) says nothing about the
model: trained as a 0, it would teach the policy that the call it made was wrong and lower its group's baseline.
So such a trajectory leaves the batch before anything else is decided, its group's pass rate is taken over the
others, and a group it leaves with fewer than 2 goes too (a baseline of one sample is the sample itself).

``removed`` records, per rule name, every trajectory the rule matched (one match removes; a row can match several),
so the metrics give each rule's share and the rollout dump names the rules that removed each row.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from zerotir.config import FilterConfig
from zerotir.filters.overlong import soft_overlong_penalty, truncated_rows
from zerotir.filters.pass_rate import pass_rate
from zerotir.filters.roc import roc_dropped, roc_penalty
from zerotir.filters.trajectory import RULES, FilterContext
from zerotir.rl.step import PERPLEXITY, FilterDecision
from zerotir.parallel.distributed import global_group_counts
from zerotir.types import Trajectories

INFRA, PASS_RATE, TRUNCATED, ROC = "infra_failed", "pass_rate", "truncated", "roc"
# Every name a decision's ``removed`` can hold, in the order the rules apply (metric_names.FILTER_NAMES lists them).
REMOVAL_NAMES = (INFRA, PASS_RATE, *RULES, TRUNCATED, ROC, PERPLEXITY)


def infra_failed_rows(traj: Trajectories) -> Tensor:
    """(B,) bool: the trajectories that failed for infrastructure reasons (``Trajectories.infra_failed``), and the
    rest of any group they leave with fewer than 2 trajectories. A group of one by design (``model.sampling.n`` 1)
    that did not fail stays."""
    failed = traj.infra_failed.cpu().bool()
    if not failed.any():
        return failed
    groups = traj.group_ids.cpu()
    ids, inverse = torch.unique(groups, return_inverse=True)
    left = torch.zeros(len(ids), dtype=torch.long).index_add_(0, inverse, (~failed).long())
    hit = torch.zeros(len(ids), dtype=torch.long).index_add_(0, inverse, failed.long()) > 0
    return failed | (hit & (left < 2))[inverse]


def decide(cfg: FilterConfig, traj: Trajectories, ctx: FilterContext, *, step: int, seed: int) -> FilterDecision | None:
    """The step's decision on this rank's ``traj`` (see the module doc); None when every rule of ``cfg`` is off
    (everything trains). With only the pass-rate rule on it is that rule's decision with its dropped rows recorded
    under "pass_rate" (so the rollout dump names the rule that removed each row either way). The group counts are
    reduced over the ranks once (a collective: every rank calls this at the same step).

    Args:
        cfg: ``model.filters``.
        traj: the step's scored trajectories.
        ctx: the block markers and the response budget.
        step: the RL step; with ``seed`` it seeds the RoC order among equal penalties.
        seed: the run's seed.
    """
    infra = infra_failed_rows(traj) if cfg.infra_failed else None
    # taken on all samples of each prompt but the infrastructure's failures
    group = pass_rate(cfg, traj, counted=None if infra is None else ~infra) if cfg.pass_rate else None
    if not cfg.row_rules:
        return None if group is None else replace(group, removed={PASS_RATE: ~group.keep.cpu().bool()})
    size = len(traj)
    removed: dict[str, Tensor] = {}
    if infra is not None:
        removed[INFRA] = infra
    if group is not None:
        removed[PASS_RATE] = ~group.keep.cpu().bool()
    for name in cfg.trajectory_rules:
        removed[name] = RULES[name](traj, cfg, ctx)
    if cfg.overlong == "mask":
        removed[TRUNCATED] = truncated_rows(traj)
    keep = torch.ones(size, dtype=torch.bool)
    for matched in removed.values():
        keep &= ~matched
    if cfg.roc:
        generator = torch.Generator().manual_seed(seed + step)
        removed[ROC] = roc_dropped(keep, traj.correct.cpu(), traj.group_ids.cpu(), roc_penalty(traj, ctx.markers),
                                   cfg.roc_correct_keep, generator)
        keep &= ~removed[ROC]
    shaping = None
    if cfg.overlong == "soft_penalty":
        shaping = soft_overlong_penalty(traj.response_lens.cpu(), ctx.max_response_tokens, cfg.overlong_buffer,
                                        cfg.overlong_penalty)
    if group is not None:
        kept_groups, groups, skipped = group.kept_groups, group.groups, group.skipped
    else:
        kept_groups, groups = global_group_counts(torch.ones(size, dtype=torch.bool) if infra is None else ~infra,
                                                  traj.group_ids.cpu())
        skipped = False
    return FilterDecision(keep, kept_groups, groups, skipped, removed=removed, reward_shaping=shaping,
                          perplexity_threshold=cfg.perplexity_threshold if cfg.perplexity else None)
