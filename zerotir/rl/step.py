"""One RL step after the rollout, as a plain function: scored trajectories and a keep decision in, a ``StepResult``
out.

    rollout (scored) --keep decision--> kept rows --(no rank kept any: skip)--> prepare_batch (old log-probs,
    reference, values, advantages) --> ppo_update (epochs x mini-batches x micro-batches) --> StepResult

The LightningModule owns the models, the optimizer and the DeepSpeed strategy; it calls ``rl_step`` with them and
returns the result from ``training_step``, so callbacks read it from ``outputs["step"]`` of ``on_train_batch_end``.
Nothing here imports Lightning: the optimizer is reached through two callables (``StepOptimizer``).

A keep decision (``FilterDecision``) comes from the pass-rate filter (``callbacks.PassRateFilter``, a pure function
of the rewards); without one every trajectory is kept. The skip decision is global: every rank skips together, or
every rank trains (a rank that kept nothing then trains on a zero-weight placeholder row so the collective passes
stay in step).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from zerotir.config import RLConfig
from zerotir.rl.update import check_temperature, placeholder, ppo_update, prepare_batch
from zerotir.scale.distributed import global_sum
from zerotir.types import Trajectories

LOSS_KEYS = ("policy_loss", "value_loss", "kl_loss")


@dataclass
class FilterDecision:
    """Which trajectories of a step train, as decided by a rollout filter."""

    keep: Tensor  # (B,) bool: the trajectories kept for the update (all False when the step is skipped)
    kept_groups: int  # prompt groups kept, over all ranks
    groups: int  # prompt groups seen, over all ranks
    skipped: bool = False  # fewer groups than the filter's minimum passed: the update is skipped

    @property
    def kept_fraction(self) -> float:
        return self.kept_groups / max(self.groups, 1)


RolloutFilter = Callable[[Trajectories], FilterDecision]


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
        decision: the rollout filter's decision, or None.
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
    if global_sum(len(kept)) == 0:  # no rank kept anything
        for _ in range(cfg.optimizer_steps_per_rl_step):
            optimizer.step(False)
        stats: dict[str, float] = {}
    else:
        batch = (kept if len(kept) else placeholder(rollout)).to(device)
        stats = _update(cfg, batch, models, optimizer, step, seed, max_response_tokens, temperature, top_p)
    return StepResult(step, rollout, keep, decision, stats)


def _update(cfg: RLConfig, batch_traj: Trajectories, models: Models, optimizer: StepOptimizer, step: int,
            seed: int, max_response_tokens: int | None, temperature: float, top_p: float) -> dict[str, float]:
    trained = [m for m in (models.actor, models.critic) if m is not None]
    for m in trained:
        m.eval()  # old log-probs / values without dropout, as the rollout saw them
    batch, stats = prepare_batch(cfg, batch_traj, models.actor, models.reference, models.critic,
                                 temperature=temperature, top_p=top_p)
    for m in trained:
        m.train()  # gradient checkpointing is only active in train mode
    gen = torch.Generator().manual_seed(seed + step)
    stats.update(ppo_update(cfg, batch, models.actor, models.critic, optimizer.backward, optimizer.step, step, gen,
                            max_response_tokens, temperature=temperature))
    return stats
