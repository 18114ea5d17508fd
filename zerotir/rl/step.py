"""One RL step after the rollout, as a plain function: scored trajectories and a keep decision in, a ``StepResult``
out.

    rollout (scored) --keep decision--> kept rows --(no rank kept any: skip)--> prepare_batch (old log-probs,
    reference, values, advantages) --> ppo_update (epochs x mini-batches x micro-batches) --> StepResult

The LightningModule owns the models, the optimizer and the DeepSpeed strategy; it calls ``rl_step`` with them and
returns the result from ``training_step``, so callbacks read it from ``outputs["step"]`` of ``on_train_batch_end``.
Nothing here imports Lightning: the optimizer is reached through two callables (``StepOptimizer``).

A keep decision (``FilterDecision``) comes from the rules of ``model.filters`` (the pass-rate rule, a function of the
rewards, composed with the trajectory rules: ``zerotir.filters.decide``); with every rule off every trajectory is
kept. Two of its parts apply here, to the kept rows only: the high-perplexity removal (it needs
the reference log-probs, taken once and reused for the KL: ``zerotir.rl.perplexity``) and the reward shaping (the
soft overlong penalty, added before the advantages; ``StepResult.rollout`` keeps the raw rewards). A removed row is
dropped before the advantages, so a group baseline is over the group's remaining samples. The skip decision is
global: every rank skips together, or every rank trains (a rank that kept nothing then trains on a zero-weight
placeholder row so the collective passes stay in step).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor, nn

from zerotir.config import RLConfig
from zerotir.rl.perplexity import reference_logprobs, sequence_perplexity
from zerotir.rl.update import TrainBatch, check_temperature, placeholder, ppo_update, prepare_batch
from zerotir.parallel.distributed import global_sum
from zerotir.types import Trajectories

LOSS_KEYS = ("policy_loss", "value_loss", "kl_loss")
PERPLEXITY = "perplexity"  # the high-perplexity removal's name in FilterDecision.removed


@dataclass
class FilterDecision:
    """Which trajectories of a step train, as decided by the rules of ``model.filters``."""

    keep: Tensor  # (B,) bool: the trajectories kept for the update (all False when the step is skipped)
    kept_groups: int  # prompt groups the pass-rate rule kept, over all ranks (all of them without that rule)
    groups: int  # prompt groups seen, over all ranks
    skipped: bool = False  # fewer groups than model.filters.min_keep_groups passed: the update is skipped
    # rule name -> (B,) bool: the trajectories that rule matched; a match removes ("pass_rate": its dropped groups)
    removed: dict[str, Tensor] = field(default_factory=dict)
    reward_shaping: Tensor | None = None  # (B,) added to the trained rows' rewards before the advantages, or None
    perplexity_threshold: float | None = None  # kept rows with a reference perplexity above it leave the update

    @property
    def kept_fraction(self) -> float:
        return self.kept_groups / max(self.groups, 1)

    @staticmethod
    def cat(parts: list[FilterDecision], kept_groups: int, skipped: bool) -> FilterDecision:
        """The decision over the batches of ``parts`` concatenated in order (refill rounds): keeps, removals and
        reward shaping concatenated (a rule absent from a part matched none of its rows), groups summed;
        ``kept_groups`` and ``skipped`` as the caller counted them."""
        zeros = [torch.zeros(len(p.keep), dtype=torch.bool) for p in parts]
        names = dict.fromkeys(name for p in parts for name in p.removed)
        removed = {name: torch.cat([p.removed.get(name, z).cpu() for p, z in zip(parts, zeros)]) for name in names}
        shaping = None
        if any(p.reward_shaping is not None for p in parts):
            shaping = torch.cat([p.reward_shaping.cpu() if p.reward_shaping is not None else z.float()
                                 for p, z in zip(parts, zeros)])
        thresholds = {p.perplexity_threshold for p in parts}
        if len(thresholds) > 1:
            raise ValueError(f"FilterDecision.cat: the parts disagree on the perplexity threshold ({thresholds})")
        return FilterDecision(torch.cat([p.keep.cpu() for p in parts]), kept_groups, sum(p.groups for p in parts),
                              skipped, removed, shaping, thresholds.pop())


@dataclass
class Models:
    """The models an RL step uses; ``critic`` only for PPO, ``reference`` only with ``kl_coef > 0``."""

    actor: nn.Module
    critic: nn.Module | None = None
    reference: nn.Module | None = None


@dataclass
class StepOptimizer:
    """How the step reaches the one optimizer: ``backward(loss)`` and ``step(has_grad) -> actor grad norm`` (one
    call per optimizer step; ``has_grad=False`` keeps the step count without changing anything)."""

    backward: Callable[[Tensor], None]
    step: Callable[[bool], float]


@dataclass
class BatchInfo:
    """What the rollout's group ids stand for (index = group id), and the weights that generated it."""

    prompts: list[str] = field(default_factory=list)  # prompt text of each group
    problem_ids: list[str] = field(default_factory=list)  # data id of each group
    sources: list[str] = field(default_factory=list)  # source (benchmark) name of each group
    weight_version: int = 0  # updates the generating weights had seen
    kinds: list[str] = field(default_factory=list)  # question kind of each group ("" where its row has none)


@dataclass
class TrainedTokens:
    """The per-token values the update trained on, for the rows of ``StepResult.rollout`` it kept (what the rollout
    dump shows token by token; references to the update's tensors, on the models' device).

    ``rows`` (K,) long: the rollout rows, in the order of the other tensors' rows; ``old_logp`` (K, T): the actor's
    log-probs at the update (the old log-probs; in a single pass, those of the update's own forward pass);
    ``advantages`` (K, T), 0 off the action mask; ``entropy`` (K, T): the entropy of the actor's tempered
    distribution at each token in the update's first epoch."""

    rows: Tensor
    old_logp: Tensor
    advantages: Tensor
    entropy: Tensor


@dataclass
class StepResult:
    """What one RL step did, handed to the callbacks through ``on_train_batch_end``'s ``outputs["step"]`` (an
    evaluation batch returns one too, without an update)."""

    rl_step: int  # 1-based index of the RL step (the x axis of every TensorBoard tag)
    rollout: Trajectories  # every scored trajectory of this rank, before filtering
    kept: Tensor  # (B,) bool over ``rollout``: the trajectories the update trained on
    filter: FilterDecision | None  # the filter's decision (None: no filter, everything kept)
    stats: dict[str, float]  # update statistics: losses, kl, entropy, clip_fraction, grad_norm, lr; {} when skipped
    timings: dict[str, float] = field(default_factory=dict)  # seconds per phase: generation, sandbox, reward, ...
    batch: BatchInfo = field(default_factory=BatchInfo)  # filled by the module (it knows the prompts)
    pipeline: dict[str, float] = field(default_factory=dict)  # staleness_mean / _max of the batch's tokens (versions)
    refill: dict[str, float] = field(default_factory=dict)  # the batch's generation rounds, ... (rl.refill.FillWatch)
    data: dict[str, float] = field(default_factory=dict)  # data/stage, data/kind_share/<kind>, ... (data.curriculum)
    trained: TrainedTokens | None = None  # the update's per-token values of the kept rows; None: no update

    @property
    def skipped(self) -> bool:
        """No rank kept anything: no update happened (the optimizer steps were no-ops)."""
        return not self.stats

    @property
    def losses(self) -> dict[str, float]:
        return {k: v for k, v in self.stats.items() if k in LOSS_KEYS}


def rl_step(cfg: RLConfig, rollout: Trajectories, decision: FilterDecision | None, models: Models,
            optimizer: StepOptimizer, step: int, seed: int, device: torch.device | str = "cpu",
            max_response_tokens: int | None = None, *, temperature: float, top_p: float) -> StepResult:
    """Train on the kept trajectories of ``rollout`` (all of them without a decision); see the module doc.

    Args:
        cfg: the ``model.rl`` group.
        rollout: this rank's scored trajectories (rewards filled), on the models' device.
        decision: the filters' decision (``zerotir.filters.decide``), or None.
        models: actor (and critic, reference).
        optimizer: backward and optimizer-step callables of the module.
        step: the RL step index (names the step in errors; with ``seed`` it seeds the mini-batch order).
        seed: the run's seed.
        device: where the models are (the kept trajectories are moved there).
        max_response_tokens: the response budget (``model.sampling.max_response_tokens``), the divisor of
            ``loss_agg_mode="seq-mean-token-sum-norm"``; None is an error in that mode only.
        temperature: ``model.sampling.temperature``, at which every log-prob pass scores the tokens (the engine
            sampled them at it); must be > 0.
        top_p: ``model.sampling.top_p``; below 1 the engine's log-probs are not used (``prepare_batch``).

    Returns:
        The step's result; ``stats`` is empty when no rank kept anything (then exactly
        ``cfg.optimizer_steps_per_rl_step`` no-op optimizer steps were made, as an update makes real ones).
    """
    check_temperature(temperature)
    keep = decision.keep.cpu() if decision is not None else torch.ones(len(rollout), dtype=torch.bool)
    kept = rollout.select(keep)
    if decision is not None and decision.reward_shaping is not None:
        kept.rewards = kept.rewards + decision.reward_shaping.cpu()[keep].to(kept.rewards)
    stats: dict[str, float] = {}
    trained = None
    if global_sum(len(kept)) > 0:  # else no rank kept anything: skip
        batch = (kept if len(kept) else placeholder(rollout)).to(device)
        ref_logp = None
        if decision is not None and decision.perplexity_threshold is not None:
            batch, ref_logp, decision = _drop_high_perplexity(cfg, batch, len(kept) > 0, decision, models.reference,
                                                              temperature)
            keep = decision.keep
        if decision is None or decision.perplexity_threshold is None or global_sum(int(keep.sum())) > 0:
            seen: dict[str, Tensor] = {}
            stats, train_batch = _update(cfg, batch, models, optimizer, step, seed, max_response_tokens,
                                         temperature, top_p, ref_logp, seen)
            rows = keep.cpu().nonzero(as_tuple=True)[0]
            if len(rows):  # else this rank trained a zero-weight placeholder
                old = train_batch.old_logp if train_batch.old_logp is not None else seen["logp"]
                trained = TrainedTokens(rows, old, train_batch.advantages, seen["entropy"])
    if not stats:
        for _ in range(cfg.optimizer_steps_per_rl_step):
            optimizer.step(False)
    return StepResult(step, rollout, keep, decision, stats, trained=trained)


def _drop_high_perplexity(cfg: RLConfig, batch: Trajectories, real: bool, decision: FilterDecision,
                          reference: nn.Module | None, temperature: float
                          ) -> tuple[Trajectories, Tensor, FilterDecision]:
    """The reference pass over the kept ``batch`` (``real``: not this rank's placeholder), its rows whose perplexity
    is above the decision's threshold removed (the decision records them under ``PERPLEXITY``, over the rollout's
    rows); returns the remaining rows (a placeholder when none remains), their reference log-probs and the decision.
    """
    if reference is None:
        raise ValueError("model.filters.perplexity=true needs the reference model, which is loaded only with "
                         "model.rl.kl_coef > 0; set kl_coef > 0 or perplexity: false")
    ref_logp = reference_logprobs(cfg, batch, reference, temperature)  # every rank runs it: a collective pass count
    keep = decision.keep.cpu()
    over = (sequence_perplexity(ref_logp, batch.action_mask).cpu() > decision.perplexity_threshold) & real
    removed = torch.zeros_like(keep)
    if real:
        removed[keep.nonzero(as_tuple=True)[0][over]] = True
    decision = replace(decision, keep=keep & ~removed, removed={**decision.removed, PERPLEXITY: removed})
    if over.all():
        return placeholder(batch), ref_logp[:1], decision
    rows = (~over).nonzero(as_tuple=True)[0]
    return batch.select(rows), ref_logp[rows.to(ref_logp.device)], decision


def _update(cfg: RLConfig, batch_traj: Trajectories, models: Models, optimizer: StepOptimizer, step: int,
            seed: int, max_response_tokens: int | None, temperature: float, top_p: float,
            ref_logp: Tensor | None, seen: dict[str, Tensor]) -> tuple[dict[str, float], TrainBatch]:
    trained = [m for m in (models.actor, models.critic) if m is not None]
    for m in trained:
        m.eval()  # old log-probs / values without dropout, as the rollout saw them
    batch, stats = prepare_batch(cfg, batch_traj, models.actor, models.reference, models.critic,
                                 temperature=temperature, top_p=top_p, ref_logp=ref_logp)
    for m in trained:
        m.train()  # gradient checkpointing is only active in train mode
    gen = torch.Generator().manual_seed(seed + step)
    stats.update(ppo_update(cfg, batch, models.actor, models.critic, optimizer.backward, optimizer.step, step, gen,
                            max_response_tokens, temperature=temperature, seen=seen))
    return stats, batch
