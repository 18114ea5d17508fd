"""One RL step after the rollout, as plain functions on plain data: forward passes of the models over a batch of
trajectories, advantages per algorithm, and the PPO-epoch micro-batch update.

Nothing here imports Lightning: the module passes ``backward`` and ``optimizer_step`` callables, so the update is
tested with plain torch and runs unchanged under any Lightning strategy.

Alignment (see ``zerotir.types``): every per-token tensor is ``(B, T)`` and aligned with ``input_ids``; the log-prob at
``t`` scores token ``t`` given the tokens before it, and the value at ``t`` is the critic's estimate of that state.
Position 0 is a prompt token and gets 0.

Micro-batches (``zerotir.rl.micro_batches``): ``micro_batch_size`` rows, or bins under the token budget
``max_tokens_per_micro_batch``, in every pass (old and reference log-probs, critic values, the update); the
log-probs come from the full logits or, with ``logprob_chunk_tokens``, from the hidden states a chunk of tokens at a
time (``zerotir.rl.chunked_logprobs``); with ``pack_rows`` each micro-batch is one packed row of its trajectories
(``zerotir.rl.packing``: positions restarting, attention within each trajectory), its outputs put back in ``(B, T)``.

Data parallel: each rank holds its own trajectories. Whitening uses the global batch statistics, the loss weights
use the global token (or sequence) count, and every rank runs the same number of forward / backward passes (the
largest local count; the extra passes repeat a local row with weight 0), which ZeRO-3's collective parameter gathers
require. A rank whose filter kept nothing is given a one-row placeholder with an empty action mask (``placeholder``).
Without a process group all of this reduces to the single-process computation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import torch
from torch import Tensor, nn

from zerotir.config import RLConfig
from zerotir.rl import algorithms as A
from zerotir.rl.chunked_logprobs import chunked_sequence_logprobs
from zerotir.rl.estimators import ESTIMATORS
from zerotir.rl.guards import check_finite
from zerotir.rl.micro_batches import aligned, iter_rows, micro_batches, row_lengths
from zerotir.rl.mismatch import mismatch_stats
from zerotir.rl.packing import pack, packed_inputs, unpack
from zerotir.rl.off_policy import behaviour_weights
from zerotir.parallel.distributed import all_reduce_sum, global_max, global_sum, rank_and_world_size
from zerotir.types import Trajectories

__all__ = ["RLConfig", "TrainBatch", "compute_advantages", "iter_rows", "micro_batch_loss", "placeholder",
           "ppo_update", "prepare_batch"]


@dataclass
class TrainBatch:
    """What the update needs, all ``(B, T)`` unless noted; tensors the algorithm does not use are None."""

    input_ids: Tensor
    attention_mask: Tensor
    action_mask: Tensor  # bool, the env-token mask
    old_logp: Tensor | None  # the actor's log-probs before the update; None: taken in the update (single pass)
    advantages: Tensor
    engine_logp: Tensor | None = None  # the rollout engine's log-probs: the behaviour policy (off-policy weights)
    ref_logp: Tensor | None = None  # only with use_kl_loss
    old_values: Tensor | None = None  # PPO
    returns: Tensor | None = None  # PPO (value targets)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, rows: Tensor) -> TrainBatch:
        """Rows ``rows``, trimmed to their longest real sequence (right padding costs compute for nothing)."""
        width = int(self.attention_mask[rows].sum(1).max().item()) if len(rows) else 1
        values = {}
        for f in fields(self):
            v = getattr(self, f.name)
            values[f.name] = None if v is None else v[rows, :width]
        return TrainBatch(**values)


def sequence_logprobs(
    model: nn.Module, input_ids: Tensor, attention_mask: Tensor, *, temperature: float, with_entropy: bool = False,
    entropy_grad: bool = False, chunk_tokens: int | None = None, packed: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs of every token under ``model`` at ``temperature`` (and the entropy of each position's
    distribution), ``(B, T)``.

    ``temperature`` is ``model.sampling.temperature``: the logits are divided by it (in place, as verl and OpenRLHF
    do) so that the trainer scores the tokens under the distribution the engine sampled them from; every log-prob
    pass (old, reference, the update's) takes the same one, and so does the entropy (the sampling distribution's).
    It must be > 0 (greedy decoding has no distribution to train on).

    The model's logits at ``t - 1`` predict token ``t``, so both outputs are shifted right by one; position 0 is 0.
    The entropy is computed one row at a time (a full float32 softmax of a (B, T, V) batch is large for big
    vocabularies) and without gradient unless ``entropy_grad`` (an entropy bonus in the loss).

    ``chunk_tokens`` is ``model.rl.logprob_chunk_tokens``: set, the same values come from the decoder's hidden
    states through the LM head that many tokens at a time (``chunked_sequence_logprobs``: no full logits, the
    entropy per chunk); None, from the model's full logits as described above.

    ``packed`` is ``model.rl.pack_rows``: the rows go through the model as one packed row (``zerotir.rl.packing``)
    and the outputs come back in the ``(B, T)`` layout, 0 on padding.
    """
    check_temperature(temperature)
    if packed:
        row = pack(input_ids, attention_mask)
        logp, entropy = _logprobs(model, packed_inputs(model, row), temperature, with_entropy, entropy_grad,
                                  chunk_tokens)
        return unpack(row, logp), None if entropy is None else unpack(row, entropy)
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": None}
    return _logprobs(model, inputs, temperature, with_entropy, entropy_grad, chunk_tokens)


def _logprobs(model: nn.Module, inputs: dict[str, Tensor | None], temperature: float, with_entropy: bool,
              entropy_grad: bool, chunk_tokens: int | None) -> tuple[Tensor, Tensor | None]:
    """``sequence_logprobs`` of the model's forward ``inputs`` (padded rows, or one packed row)."""
    input_ids = inputs["input_ids"]
    if chunk_tokens is not None:
        return chunked_sequence_logprobs(model, input_ids, inputs["attention_mask"], temperature=temperature,
                                         chunk_tokens=chunk_tokens, with_entropy=with_entropy,
                                         entropy_grad=entropy_grad, position_ids=inputs["position_ids"])
    logits = model(**inputs).logits
    if temperature != 1.0:
        logits.div_(temperature)  # in place: no second (B, T, V) tensor; the LM head's backward does not need it
    logits = logits[:, :-1]
    logp = A.logprobs_from_logits(logits, input_ids[:, 1:])
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(torch.is_grad_enabled() and entropy_grad):
            entropy = torch.stack([A.entropy_from_logits(row) for row in logits])
    pad = (1, 0)
    return nn.functional.pad(logp, pad), None if entropy is None else nn.functional.pad(entropy, pad)


def check_temperature(temperature: float) -> None:
    """The trainer's log-probs need a sampling distribution: ``model.sampling.temperature`` > 0."""
    if not temperature > 0:
        raise ValueError(f"model.sampling.temperature={temperature}: training needs a sampling temperature > 0 (0 is "
                         "greedy decoding, which has no distribution to score or to train; use it in "
                         "model.eval.sampling only)")


def sequence_values(critic: nn.Module, input_ids: Tensor, attention_mask: Tensor, packed: bool = False) -> Tensor:
    """Critic values aligned with the actions, ``(B, T)``: the value at ``t`` is read after token ``t - 1``;
    ``packed`` (``model.rl.pack_rows``): through one packed row, as ``sequence_logprobs``."""
    if not packed:
        return nn.functional.pad(critic(input_ids, attention_mask)[:, :-1].float(), (1, 0))
    row = pack(input_ids, attention_mask)
    inputs = packed_inputs(critic, row)
    values = critic(inputs["input_ids"], inputs["attention_mask"], inputs["position_ids"])[:, :-1].float()
    return unpack(row, nn.functional.pad(values, (1, 0)))


@torch.no_grad()
def forward_in_chunks(fn: Callable[[Tensor, Tensor], Tensor], input_ids: Tensor, attention_mask: Tensor,
                      chunks: list[Tensor], total_chunks: int) -> Tensor:
    """``fn(ids, mask) -> (b, t)`` over the micro-batches ``chunks`` (row indices, each trimmed to its longest row),
    re-padded to ``(B, T)``; ``total_chunks`` passes in all (``aligned``: the caller's reduced count, the same on
    every rank)."""
    out = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    for rows, padding in aligned(chunks, total_chunks):
        width = int(attention_mask[rows].sum(1).max().item())
        values = fn(input_ids[rows, :width], attention_mask[rows, :width]).float()
        if not padding:
            out[rows, :width] = values
    return out


def placeholder(traj: Trajectories) -> Trajectories:
    """Row 0 of ``traj`` with an empty action mask and reward 0: this rank's stand-in when its filter kept nothing
    but other ranks train (it contributes zero gradient and keeps the collective passes in step)."""
    row = traj.select([0])
    row.action_mask = torch.zeros_like(row.action_mask)
    row.rewards = torch.zeros_like(row.rewards)
    return row


def compute_advantages(
    cfg: RLConfig, traj: Trajectories, mask: Tensor, kl: Tensor | None, values: Tensor | None
) -> tuple[Tensor, Tensor | None]:
    """Advantages ``(B, T)`` (0 off the action mask) and, for PPO, the value targets: the estimator that
    ``cfg.algorithm`` names in ``zerotir.rl.estimators.ESTIMATORS``, whitening over the global batch of all ranks.

    ``kl`` is the per-token KL estimate of the sampling policy against the reference; unless ``use_kl_loss`` moves it
    into the loss (``RLConfig.kl_in_reward``) the estimator folds it into the rewards (per token for PPO,
    REINFORCE++, REINFORCE++-baseline and RLOO; summed per trajectory before GRPO's group baseline).
    """
    estimator = ESTIMATORS[cfg.algorithm]
    rewards = traj.rewards.to(mask.device, torch.float32)
    groups = traj.group_ids.to(mask.device)
    return estimator(rewards, groups, mask, kl if cfg.kl_in_reward else None, values, cfg, all_reduce_sum)


@torch.no_grad()
def prepare_batch(
    cfg: RLConfig, traj: Trajectories, actor: nn.Module, ref: nn.Module | None, critic: nn.Module | None, *,
    temperature: float, top_p: float, ref_logp: Tensor | None = None,
) -> tuple[TrainBatch, dict[str, float]]:
    """Recompute the old log-probs with the actor (the engine's are informational; skipped in a single pass, see
    ``RLConfig.single_pass``), the reference log-probs and the critic values, then the advantages.

    ``ref_logp``: the reference log-probs of ``traj`` when the step has taken them already (the high-perplexity
    filter, ``zerotir.rl.perplexity``); the reference pass is then not run again.

    ``temperature`` and ``top_p`` are ``model.sampling``'s: every log-prob is taken at that temperature. The
    engine's log-probs are kept as the behaviour policy only when ``top_p == 1``: under nucleus sampling they are
    log-probs of the renormalised nucleus, a different distribution from the trainer's full tempered softmax, so
    neither the off-policy weights (``RLConfig.check_training_sampling`` refuses that combination) nor
    ``engine_logprob_diff`` (it would measure the truncation, not a mismatch) can use them.

    Returns:
        The batch and its statistics: ``kl`` (policy vs reference on the action tokens), ``engine_logprob_diff``
        (mean |actor - engine| log-prob) and the ``mismatch_*`` diagnostics (``zerotir.rl.mismatch``), unless the
        update measures them (single pass).
    """
    ids, attn = traj.input_ids, traj.attention_mask
    mask = traj.action_mask.bool()
    chunks = micro_batches(row_lengths(attn), cfg.micro_batch_size, cfg.max_tokens_per_micro_batch, cfg.pack_rows)
    passes = int(global_max(len(chunks)))  # collective: every rank runs as many forward passes
    logprobs = {"temperature": temperature, "chunk_tokens": cfg.logprob_chunk_tokens, "packed": cfg.pack_rows}
    engine_logp = traj.logprobs.float() if top_p == 1.0 else None
    stats: dict[str, float] = {}
    old_logp = None
    if not cfg.single_pass:
        old_logp = forward_in_chunks(lambda i, m: sequence_logprobs(actor, i, m, **logprobs)[0],
                                     ids, attn, chunks, passes)
        if engine_logp is not None:
            stats.update({k: v.item() for k, v in engine_stats(old_logp, engine_logp, mask).items()})
    kl = None
    if ref_logp is None and ref is not None and cfg.kl_coef > 0:
        ref_logp = forward_in_chunks(lambda i, m: sequence_logprobs(ref, i, m, **logprobs)[0],
                                     ids, attn, chunks, passes)
    if ref_logp is not None and old_logp is not None:
        kl = A.kl_penalty(old_logp, ref_logp, cfg.kl_estimator, mask, cfg.kl_clamp)
        stats["kl"] = A.masked_mean(kl, mask).item()
    values = None
    if cfg.uses_critic:
        if critic is None:
            raise ValueError(f"algorithm {cfg.algorithm!r} needs a critic")
        values = forward_in_chunks(lambda i, m: sequence_values(critic, i, m, cfg.pack_rows), ids, attn, chunks,
                                   passes)
    adv, returns = compute_advantages(cfg, traj, mask, kl, values)
    batch = TrainBatch(ids, attn, mask, old_logp, adv, engine_logp,
                       ref_logp if cfg.use_kl_loss else None, values, returns)
    return batch, stats


def micro_batch_loss(
    cfg: RLConfig, mb: TrainBatch, actor: nn.Module, critic: nn.Module | None,
    max_response_tokens: int | None = None, *, temperature: float,
    record: Callable[[Tensor, Tensor], None] | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The loss of one micro-batch: clipped policy loss + vf_coef * value loss (+ kl_coef * KL, - entropy bonus),
    each aggregated over the micro-batch by ``loss_agg_mode`` (token mean by default). ``max_response_tokens`` is the
    response budget (``model.sampling.max_response_tokens``), the divisor of ``seq-mean-token-sum-norm``;
    ``temperature`` is ``model.sampling.temperature`` (see ``sequence_logprobs``). Returns the loss and detached
    statistics. ``record``, given, is handed the pass's per-token log-probs and entropies (detached)."""
    logp, entropy = sequence_logprobs(actor, mb.input_ids, mb.attention_mask, temperature=temperature,
                                      with_entropy=True, entropy_grad=cfg.entropy_coef != 0,
                                      chunk_tokens=cfg.logprob_chunk_tokens, packed=cfg.pack_rows)
    if record is not None:
        record(logp.detach(), entropy.detach())
    mask = mb.action_mask
    single_pass = mb.old_logp is None
    old_logp = logp.detach() if single_pass else mb.old_logp
    agg = dict(agg_mode=cfg.loss_agg_mode, max_response_tokens=max_response_tokens)
    weights, is_stats = _behaviour_weights(cfg, old_logp, mb.engine_logp, mask)
    loss, stats = A.policy_loss(logp, old_logp, mb.advantages, mask, cfg.clip_low, cfg.clip_high, cfg.dual_clip, **agg,
                                weights=weights)
    stats = dict(stats, **is_stats, policy_loss=loss.detach(), entropy=A.masked_mean(entropy, mask).detach())
    if single_pass and mb.engine_logp is not None:
        stats.update(engine_stats(old_logp, mb.engine_logp, mask))
    if cfg.entropy_coef:
        loss = loss - cfg.entropy_coef * A.aggregate_loss(entropy, mask, **agg)
    if mb.ref_logp is not None:
        kl_loss = A.aggregate_loss(A.kl_penalty(logp, mb.ref_logp, cfg.kl_estimator, mask, cfg.kl_clamp), mask,
                                   **agg)
        stats["kl_loss"] = kl_loss.detach()
        if single_pass:  # the KL before the update, measured in the same forward pass
            stats["kl"] = stats["kl_loss"]
        loss = loss + cfg.kl_coef * kl_loss
    if cfg.uses_critic:
        values = sequence_values(critic, mb.input_ids, mb.attention_mask, cfg.pack_rows)
        v_loss = A.value_loss(values, mb.old_values, mb.returns, mask, cfg.value_clip, **agg)
        stats["value_loss"] = v_loss.detach()
        loss = loss + cfg.vf_coef * v_loss
    return loss, stats


def _behaviour_weights(cfg: RLConfig, old_logp: Tensor, engine_logp: Tensor | None,
                       mask: Tensor) -> tuple[Tensor | None, dict[str, Tensor]]:
    """The off-policy weights of the policy loss (None: weight 1) and their statistics. The proximal policy is the
    old one (in a single pass the current parameters before the step: the same policy)."""
    mode = cfg.off_policy_correction or "none"  # unset and never given a schedule (RLConfig.for_run): none
    if engine_logp is None:
        if mode != "none":
            raise ValueError(f"model.rl.off_policy_correction={mode!r} needs the engine's "
                             "log-probs of the sampled tokens under the trainer's distribution, and this batch has "
                             "none (model.sampling.top_p < 1 samples from a truncated one); set top_p: 1 or "
                             "off_policy_correction: none")
        return None, {}
    weights, stats = behaviour_weights(old_logp, engine_logp, mask, mode, cfg.is_cap,
                                       cfg.is_band_low, cfg.is_band_high)
    return (None if mode == "none" else weights), stats


@torch.no_grad()
def engine_stats(trainer_logp: Tensor, engine_logp: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """The engine-vs-trainer statistics of a step: ``engine_logprob_diff`` (mean |trainer - engine| log-prob of the
    action tokens) and the ``mismatch_*`` diagnostics. Taken once over the batch after the old log-probs pass, or
    per micro-batch in a single pass (then the step's value is their mean weighted like the loss, as every update
    statistic; exact for the token means under token-mean, the perplexities are of the micro-batches)."""
    diff = A.masked_mean((trainer_logp.float() - engine_logp.float()).abs(), mask)
    return {"engine_logprob_diff": diff, **mismatch_stats(trainer_logp, engine_logp, mask)}


def ppo_update(
    cfg: RLConfig,
    batch: TrainBatch,
    actor: nn.Module,
    critic: nn.Module | None,
    backward: Callable[[Tensor], None],
    optimizer_step: Callable[[bool], float],
    rl_step: int,
    generator: torch.Generator | None = None,
    max_response_tokens: int | None = None,
    *,
    temperature: float,
    seen: dict[str, Tensor] | None = None,
) -> dict[str, float]:
    """``ppo_epochs`` passes over the batch, each split into ``num_mini_batches`` optimizer steps, each accumulated
    over micro-batches of the mini-batch's rows: ``micro_batch_size`` trajectories, or bins under
    ``max_tokens_per_micro_batch`` (``zerotir.rl.micro_batches``).

    A micro-batch's loss is weighted by its share of the mini-batch's action tokens (``token-mean``) or of its
    sequences (the ``seq-mean-*`` modes), so the accumulated gradient is the mini-batch's aggregate loss whatever
    the partition into micro-batches. Exactly ``optimizer_steps_per_rl_step``
    calls of ``optimizer_step(has_grad)`` are made; an empty mini-batch calls it with ``has_grad=False`` (the step is
    then a no-op that keeps Lightning's step count in line with the RL step). ``max_response_tokens``,
    ``temperature``: see ``micro_batch_loss``. ``seen``, given, receives ``logp`` and ``entropy`` ``(B, T)``: the
    actor's values of every token in the first epoch's passes (in a single pass: the old log-probs).

    Returns:
        Means of the micro-batch statistics, weighted like the loss, and the mean gradient norm of the real steps.
    """
    sums: dict[str, float] = {}
    norms = []
    weight_total = 0.0
    world = rank_and_world_size()[1]
    lengths = row_lengths(batch.attention_mask)
    if seen is not None:
        seen.update(logp=torch.zeros_like(batch.attention_mask, dtype=torch.float32),
                    entropy=torch.zeros_like(batch.attention_mask, dtype=torch.float32))
    for epoch in range(cfg.ppo_epochs):
        order = torch.randperm(len(batch), generator=generator)
        # tensor_split gives exactly num_mini_batches parts (some empty when the batch is small).
        for mini_rows in torch.tensor_split(order, cfg.num_mini_batches):
            units = global_sum(A.loss_units(batch.action_mask[mini_rows], cfg.loss_agg_mode))
            if units == 0:  # nothing the policy sampled on any rank: keep the step count, change nothing
                optimizer_step(False)
                continue
            chunks = micro_batches(lengths[mini_rows], cfg.micro_batch_size, cfg.max_tokens_per_micro_batch,
                                   cfg.pack_rows)
            passes = int(global_max(len(chunks)))  # collective, as `units`: every rank runs as many passes
            for rows, padding in aligned(chunks, passes):
                mb = batch.select(order[:1] if padding or not len(mini_rows) else mini_rows[rows])
                record = None
                if seen is not None and epoch == 0 and not padding:
                    record = _recorder(seen, mini_rows[rows])
                loss, stats = micro_batch_loss(cfg, mb, actor, critic, max_response_tokens, temperature=temperature,
                                               record=record)
                check_finite(loss, stats, rl_step, mb)
                # Data-parallel backends average gradients over ranks, hence * world: the sum is the mini-batch's
                # aggregate (its token mean, or its sequence mean with the seq-mean modes).
                weight = 0.0 if padding else float(A.loss_units(mb.action_mask, cfg.loss_agg_mode)) * world / units
                backward(loss * weight)
                for k, v in stats.items():
                    sums[k] = sums.get(k, 0.0) + float(v) * weight
                weight_total += weight
            norms.append(optimizer_step(True))
    out = {k: v / max(weight_total, 1e-12) for k, v in sums.items()}
    out["grad_norm"] = sum(norms) / max(len(norms), 1)
    return out


def _recorder(seen: dict[str, Tensor], rows: Tensor) -> Callable[[Tensor, Tensor], None]:
    """Writes a micro-batch's ``(b, t)`` log-probs and entropies into ``seen``'s ``(B, T)`` at its ``rows``."""
    def record(logp: Tensor, entropy: Tensor) -> None:
        index = rows.to(seen["logp"].device)
        seen["logp"][index, :logp.shape[1]] = logp.float()
        seen["entropy"][index, :entropy.shape[1]] = entropy.float()
    return record
