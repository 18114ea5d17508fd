"""The RL algorithm and the optimizer: ``model.rl`` and ``model.optim``, and the choices their Literals name."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from zerotir.config.checks import check_choice, check_min
from zerotir.config.rollout import SamplingConfig

Algorithm = Literal["reinforce_pp", "ppo", "reinforce_baseline", "rloo", "grpo"]
GROUP_ALGORITHMS = ("reinforce_baseline", "rloo", "grpo")  # baselines from the other samples of the prompt
CRITIC_ALGORITHMS = ("ppo",)  # a value model trained beside the actor (RLConfig.uses_critic)
KLEstimator = Literal["k1", "k2", "k3"]
GAEInjected = Literal["skip", "restart"]
LossAggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
OffPolicyCorrection = Literal["none", "tis", "decoupled", "seq_tis", "seq_mask", "geo_mask", "token_mask"]
ASYNC_CORRECTION = "tis"  # model.rl.off_policy_correction when unset and model.hosts.max_staleness >= 1
MASKING_CORRECTIONS = ("seq_mask", "geo_mask", "token_mask")  # the corrections that keep a band and drop the rest
Optimizer = Literal["adamw", "deepspeed_cpu_adam"]
MICRO_BATCH_SIZE_DEFAULT = 8  # model.rl.micro_batch_size; it must stay so when max_tokens_per_micro_batch is set


@dataclass(frozen=True)
class RLConfig:
    """The RL algorithm: advantages, KL, clipping and how the update walks the batch (``model.rl``)."""

    algorithm: Algorithm = "reinforce_pp"
    """Advantage estimator: "reinforce_pp" (token-level KL in the reward, whitened discounted returns), "ppo"
    (critic + GAE), "reinforce_baseline" (REINFORCE++-baseline: group-mean-centred reward, then reinforce_pp's token
    returns and whitening), "rloo" (leave-one-out group baseline, returns not whitened) or "grpo" (group mean / std
    baseline). The group estimators need model.sampling.n >= 2."""
    kl_coef: float = 0.0
    """KL coefficient beta against the frozen base model; 0 skips the reference model entirely."""
    kl_estimator: KLEstimator = "k3"
    """KL estimator per token: k1 (log ratio), k2 (squared log ratio / 2) or k3 (Schulman's unbiased, >= 0)."""
    kl_clamp: float | None = 10.0
    """Clamp of the per-token k2 and k3 KL estimates to [-kl_clamp, kl_clamp] (> 0), in the rewards and in the KL
    loss alike, as verl (k3) and OpenRLHF (every estimator) clamp at 10: one token the policy finds far less likely
    than the reference otherwise adds up to ~4.9e8 (k3). k1 is never clamped. None = no clamp."""
    use_kl_loss: bool = False
    """Put the KL in the loss (GRPO style) instead of the token rewards."""
    grpo_kl_in_reward: bool = False
    """GRPO only, with use_kl_loss false: subtract kl_coef x the trajectory's summed KL from its reward before the
    group baseline (verl's use_kl_in_reward). Without it GRPO's KL must go in the loss (use_kl_loss)."""
    gamma: float = 1.0
    """Discount per action token."""
    gae_lambda: float = 1.0
    """GAE lambda (ppo)."""
    gae_injected: GAEInjected = "skip"
    """What an injected (tool output) token does in GAE (ppo): "skip" (as verl: the next action token carries on)
    or "restart" (the paper's code: each turn is its own episode, bootstrapping from 0 before a tool output)."""
    whiten_ppo_advantages: bool = True
    """Normalise PPO's GAE advantages over the (global) batch."""
    whiten_eps: float = 1e-8
    """Added to the variance when advantages are whitened (reinforce_pp, reinforce_baseline, ppo); must be > 0."""
    grpo_scale_by_std: bool = True
    """Divide GRPO's group-centred rewards by the group's standard deviation (false: Dr. GRPO)."""
    grpo_std_eps: float = 1e-6
    """Added to GRPO's group std before the division (an all-equal group has std 0); must be > 0."""
    clip_low: float = 0.2
    """Lower clip epsilon of the probability ratio (the paper's code: 0.22)."""
    clip_high: float = 0.28
    """Upper clip epsilon of the probability ratio (the paper's code: 0.28)."""
    dual_clip: float | None = 3.0
    """Dual clip bound c (> 1; verl's clip_ratio_c): for a negative advantage the policy loss is capped at
    -c x advantage, so a token whose ratio ran far above 1 stops pushing; None = no dual clip."""
    loss_agg_mode: LossAggMode = "token-mean"
    """How per-token losses become one number (verl's loss_agg_mode): "token-mean" (every action token weighs the
    same), "seq-mean-token-mean" (every response weighs the same), "seq-mean-token-sum", or
    "seq-mean-token-sum-norm" (each row's token sum / model.sampling.max_response_tokens, Dr. GRPO)."""
    off_policy_correction: OffPolicyCorrection | None = None
    """Weights of the policy loss for tokens the engine sampled (its log-probs) while the ratio is clipped against
    the trainer's recomputed ones (``zerotir.rl.off_policy``), with rho = exp(trainer - engine) per action token:
    "none"; "tis" (truncated importance sampling, min(rho, is_cap)); "decoupled" (decoupled PPO: rho, tokens above
    is_cap dropped); "seq_tis" (min(product of the row's rho, is_cap) on all its tokens); "seq_mask" (a row whose
    product of rho leaves [is_band_low, is_band_high] weighs 0, the others 1); "geo_mask" (the same on the geometric
    mean of rho); "token_mask" (IcePop: a token whose rho leaves the band weighs 0, the others 1). Corrects the
    engine / trainer mismatch (e.g. vLLM in bfloat16), and a behaviour policy some weight versions old. null (the
    default): "tis" when model.hosts.max_staleness >= 1 (tokens up to S versions old), "none" otherwise; an
    asynchronous run trains uncorrected only when the config says "none" (docs/pipeline.md)."""
    is_cap: float = 2.0
    """The cap of off_policy_correction tis, seq_tis and decoupled (> 1)."""
    is_band_low: float | None = None
    """Lower end of the kept band of the masking corrections (seq_mask, geo_mask, token_mask; in (0, 1), e.g. 0.5);
    set with is_band_high, for those corrections only."""
    is_band_high: float | None = None
    """Upper end of the kept band of the masking corrections (> 1, e.g. 2.0); set with is_band_low."""
    value_clip: float | None = 0.2
    """Clip range of the value loss around the old values (ppo); None = unclipped."""
    vf_coef: float = 0.5
    """Weight of the value loss (ppo)."""
    entropy_coef: float = 0.0
    """Weight of an entropy bonus in the loss (0 = none)."""
    ppo_epochs: int = 1
    """Passes over each RL batch."""
    num_mini_batches: int = 1
    """Optimizer steps per pass (each over its share of the batch)."""
    micro_batch_size: int = MICRO_BATCH_SIZE_DEFAULT
    """Trajectories per forward / backward (memory only: the gradient is the same token mean whatever the size)."""
    max_tokens_per_micro_batch: int | None = None
    """Token budget of a micro-batch, instead of micro_batch_size (which must then stay at its default): rows are
    binned, longest first, so that each micro-batch's rows x longest row length is at most this; a longer row is a
    micro-batch of its own, never truncated. Used by every forward pass (old / reference log-probs, critic, update);
    memory only, like micro_batch_size. None = micro_batch_size rows in batch order."""
    logprob_chunk_tokens: int | None = None
    """Tokens per LM-head chunk of the trainer's log-probs and entropy: the final hidden states go through the head
    this many at a time, recomputed in backward, so the (rows, T, vocabulary) logits never exist whole. Memory only
    (the same values). None = the full logits."""
    pack_rows: bool = False
    """Pack each micro-batch's trajectories into one row without padding (zerotir.rl.packing): positions restart
    per trajectory and each attends only to itself (a block-diagonal mask under sdpa / eager, transformers'
    variable-length path under flash attention; other attention implementations are refused). With
    max_tokens_per_micro_batch a packed row holds at most that many tokens (first-fit decreasing; a longer
    trajectory alone), else micro_batch_size trajectories. Memory and speed only (the same values)."""

    def __post_init__(self) -> None:
        check_choice("rl", "algorithm", self.algorithm, Algorithm)
        check_choice("rl", "kl_estimator", self.kl_estimator, KLEstimator)
        check_choice("rl", "gae_injected", self.gae_injected, GAEInjected)
        check_choice("rl", "loss_agg_mode", self.loss_agg_mode, LossAggMode)
        check_min("rl", self, ("ppo_epochs", "num_mini_batches", "micro_batch_size", "max_tokens_per_micro_batch",
                                "logprob_chunk_tokens"), 1)
        if self.max_tokens_per_micro_batch is not None and self.micro_batch_size != MICRO_BATCH_SIZE_DEFAULT:
            raise ValueError(f"model.rl.max_tokens_per_micro_batch={self.max_tokens_per_micro_batch} with "
                             f"micro_batch_size={self.micro_batch_size}: the token budget replaces the row count; "
                             f"remove micro_batch_size (leave it at {MICRO_BATCH_SIZE_DEFAULT}) or "
                             f"max_tokens_per_micro_batch")
        check_min("rl", self, ("kl_coef",), 0, " (0 turns the KL term and the reference model off)")
        check_min("rl", self, ("clip_low", "clip_high", "value_clip", "vf_coef"), 0)
        if not 0 <= self.gamma <= 1 or not 0 <= self.gae_lambda <= 1:
            raise ValueError(f"model.rl.gamma={self.gamma}, gae_lambda={self.gae_lambda}: both must be in [0, 1]")
        if self.use_kl_loss and self.kl_coef == 0:
            raise ValueError("model.rl.use_kl_loss=true with kl_coef=0 has no KL to put in the loss; set kl_coef > 0 "
                             "or use_kl_loss false")
        for name in ("whiten_eps", "grpo_std_eps"):
            if not getattr(self, name) > 0:
                raise ValueError(f"model.rl.{name}={getattr(self, name)}: must be > 0 (it keeps a zero spread finite)")
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ValueError(f"model.rl.dual_clip={self.dual_clip}: the lower bound c must be > 1 (3 is usual), "
                             f"or null: none")
        if self.kl_clamp is not None and not self.kl_clamp > 0:
            raise ValueError(f"model.rl.kl_clamp={self.kl_clamp}: must be > 0 (10 as verl and OpenRLHF), or null: no "
                             f"clamp")
        if self.off_policy_correction is not None:
            check_choice("rl", "off_policy_correction", self.off_policy_correction, OffPolicyCorrection)
        if not self.is_cap > 1:
            raise ValueError(f"model.rl.is_cap={self.is_cap}: must be > 1 (e.g. 2.0)")
        self._check_band()
        self._check_combinations()

    def _check_band(self) -> None:
        """The band of the masking corrections: both ends set for those, neither for the others, low < 1 < high."""
        low, high = self.is_band_low, self.is_band_high
        mode = self.off_policy_correction or "none"  # unset: "tis" or "none" by the schedule, neither keeps a band
        if mode in MASKING_CORRECTIONS:
            if low is None or high is None:
                raise ValueError(f"model.rl.off_policy_correction={mode!r} with is_band_low={low}, is_band_high="
                                 f"{high}: the masking corrections keep the ratios within [is_band_low, "
                                 f"is_band_high]; set both (e.g. 0.5 and 2.0)")
            if not 0 < low < 1 < high:
                raise ValueError(f"model.rl.is_band_low={low}, is_band_high={high}: need 0 < is_band_low < 1 < "
                                 f"is_band_high (e.g. 0.5 and 2.0)")
        elif low is not None or high is not None:
            raise ValueError(f"model.rl.is_band_low={low}, is_band_high={high} with off_policy_correction={mode!r}: "
                             f"the band is used only by {', '.join(MASKING_CORRECTIONS)}; remove is_band_low and "
                             f"is_band_high, or set off_policy_correction to one of those")

    def _check_combinations(self) -> None:
        """Settings that cannot apply together fail here, naming the fields and the fix."""
        if self.algorithm == "grpo" and self.kl_coef > 0 and not self.use_kl_loss and not self.grpo_kl_in_reward:
            raise ValueError(
                f"model.rl.algorithm=grpo with kl_coef={self.kl_coef} and use_kl_loss=false: GRPO's advantages come "
                f"from the outcome rewards only, so the KL would reach neither the rewards nor the loss. Set "
                f"use_kl_loss: true (GRPO's KL loss), or grpo_kl_in_reward: true (fold it into the rewards before the "
                f"group baseline), or kl_coef: 0")
        if self.grpo_kl_in_reward and (self.algorithm != "grpo" or self.use_kl_loss):
            raise ValueError(
                f"model.rl.grpo_kl_in_reward=true with algorithm={self.algorithm} and use_kl_loss={self.use_kl_loss}: "
                f"it only applies to algorithm=grpo with use_kl_loss=false (every other algorithm folds the KL into "
                f"its rewards whenever use_kl_loss is false); remove grpo_kl_in_reward")
        if self.gae_injected != "skip" and not self.uses_critic:
            raise ValueError(f"model.rl.gae_injected={self.gae_injected!r} with algorithm={self.algorithm}: GAE is "
                             f"only used by algorithm=ppo; remove gae_injected or set algorithm: ppo")

    def check_training_sampling(self, sampling: SamplingConfig) -> None:
        """The cross-group checks with ``model.sampling`` (the training rollouts).

        A group baseline needs two samples of each prompt. The trainer scores the sampled tokens at
        ``temperature`` (``zerotir.rl.update.sequence_logprobs``), so greedy decoding (0) cannot train. With
        ``top_p < 1`` the engine's log-probs are those of the renormalised nucleus, not of the trainer's full
        tempered softmax, so an off-policy correction built on them would weigh the truncation, not the policy lag.
        """
        if self.algorithm in GROUP_ALGORITHMS and sampling.n < 2:
            raise ValueError(f"model.rl.algorithm={self.algorithm} with model.sampling.n={sampling.n}: its baseline is "
                             f"the other samples of the same prompt, so every advantage would be 0; set "
                             f"model.sampling.n >= 2 or algorithm: reinforce_pp")
        if not sampling.temperature > 0:
            raise ValueError(f"model.sampling.temperature={sampling.temperature}: greedy decoding is for evaluation "
                             f"only (model.eval.sampling); training samples and scores its tokens at a temperature "
                             f"> 0 (e.g. 1.0)")
        if sampling.top_p < 1 and self.off_policy_correction not in (None, "none"):
            raise ValueError(f"model.rl.off_policy_correction={self.off_policy_correction!r} with "
                             f"model.sampling.top_p={sampling.top_p}: the engine's log-probs are then those of the "
                             f"truncated nucleus, not of the policy the trainer scores, so the weights would correct "
                             f"the truncation; set model.sampling.top_p: 1.0 or off_policy_correction: none")

    def for_run(self, max_staleness: int | None, sampling: SamplingConfig) -> RLConfig:
        """This group checked against ``model.sampling`` (``check_training_sampling``), with ``off_policy_correction``
        set for the schedule of ``model.hosts.max_staleness`` when the config left it unset:
        ``ASYNC_CORRECTION`` at S >= 1 (the tokens are up to S weight versions old, which a demanding user expects
        corrected, as TRL, prime-rl and NeMo-RL do by default), "none" otherwise (in line, or S = 0: the same
        rollouts and parameters as the in-line run).

        Raises:
            ValueError: S >= 1 with ``model.sampling.top_p`` < 1 and the correction unset: the correction needs the
                engine's log-probs of the full distribution, so the config must choose (top_p: 1.0, or "none").
        """
        self.check_training_sampling(sampling)
        if self.off_policy_correction is not None:
            return self
        if max_staleness is None or max_staleness < 1:
            return replace(self, off_policy_correction="none")
        if sampling.top_p < 1:
            raise ValueError(f"model.hosts.max_staleness={max_staleness} turns model.rl.off_policy_correction on "
                             f"({ASYNC_CORRECTION!r}, its default at S >= 1), which needs the engine's log-probs of "
                             f"the full distribution, and model.sampling.top_p={sampling.top_p} truncates it; set "
                             f"top_p: 1.0, or model.rl.off_policy_correction: none to train uncorrected")
        return replace(self, off_policy_correction=ASYNC_CORRECTION)

    @property
    def optimizer_steps_per_rl_step(self) -> int:
        """How many ``optimizer.step()`` calls (Lightning's ``global_step``) one RL step makes."""
        return self.ppo_epochs * self.num_mini_batches

    @property
    def single_pass(self) -> bool:
        """One epoch, one mini-batch, and no KL folded into the rewards: every micro-batch's forward in the update
        runs before the (single) optimizer step, so the actor's log-probs there *are* the old log-probs and the
        separate recomputation pass is skipped (the ratio is exactly 1 with its gradient)."""
        return self.ppo_epochs == 1 and self.num_mini_batches == 1 and not self.kl_in_reward

    @property
    def uses_critic(self) -> bool:
        """The algorithm learns a value model (PPO's GAE against it): the module loads and trains a critic, the
        update computes its values and loss, the memory plan counts it. The one place that asks."""
        return self.algorithm in CRITIC_ALGORITHMS

    @property
    def kl_in_reward(self) -> bool:
        """The KL against the reference is folded into the rewards (not the loss); GRPO only with grpo_kl_in_reward
        (the combination checks make kl_coef > 0 with grpo and no KL loss imply it)."""
        return self.kl_coef > 0 and not self.use_kl_loss


@dataclass(frozen=True)
class OptimConfig:
    """The one optimizer (actor and critic are two parameter groups of it) and its schedule (``model.optim``)."""

    lr: float = 1e-6
    """Actor learning rate."""
    critic_lr: float | None = None
    """Critic learning rate (ppo); None = ``lr``."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.95)
    """Adam betas."""
    warmup_steps: int = 0
    """Linear warmup in optimizer steps, constant afterwards."""
    max_grad_norm: float = 1.0
    """Gradient clipping (0 = off): per parameter group (actor, critic); under DeepSpeed one global norm over both
    (its ``gradient_clipping``, which must equal this, has no per-group clipping), logged as ``grad_norm``."""
    optimizer: Optimizer = "adamw"
    """"adamw" (torch) or "deepspeed_cpu_adam" (for ZeRO optimizer offload)."""

    def __post_init__(self) -> None:
        check_choice("optim", "optimizer", self.optimizer, Optimizer)
        for name, value in (("lr", self.lr), ("critic_lr", self.critic_lr)):
            if value is not None and value <= 0:
                raise ValueError(f"model.optim.{name}={value}: must be > 0")
        check_min("optim", self, ("weight_decay", "warmup_steps", "max_grad_norm"), 0)
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"model.optim.betas={self.betas}: two numbers in [0, 1), e.g. [0.9, 0.95]")
