"""``ZeroTIRModule``: the LightningModule of a ZeroTIR run. One training step is one RL step:

    prompts -> tool-integrated rollouts (n per prompt) -> outcome rewards -> sandbox guard -> pass-rate filter
    (callbacks) -> old log-probs / reference / values -> advantages (``algorithm``) -> PPO-epoch update
    -> weight sync to the rollout engine -> statistics for ``ScalingMetrics``.

The math lives in ``zerotir.rl_step``, ``zerotir.algorithms`` and ``zerotir.baselines``; the sandbox and engine in
``zerotir.runtime``; validation / test in ``zerotir.eval_loop``. This file is the Lightning plumbing.
Optimization is manual with ONE optimizer (actor and critic are two parameter groups); each RL step makes exactly
``ppo_epochs * num_mini_batches`` optimizer steps, so ``global_step == rl_step * ppo_epochs * num_mini_batches``
(docs/training.md). ``rl_step`` is saved in checkpoints and is the x axis of every TensorBoard tag.
"""

from __future__ import annotations

import logging
import time
from dataclasses import fields
from typing import Any, Literal

import torch
from lightning.pytorch import Callback, LightningModule
from lightning.pytorch.trainer.states import TrainerFn

from callbacks.resumed_curves import PurgeResumedSteps
from zerotir import models
from zerotir.data import batch_fields
from zerotir.deepspeed_setup import (begin_micro_batch, check_deepspeed_config, check_rollout_backend,
                                     count_skipped_step, hf_zero3_config, is_deepspeed, is_zero3)
from zerotir.distributed import global_sum, shard_prompts, training_share
from zerotir.eval_loop import EvalAccumulator
from zerotir.guards import SandboxErrorGuard
from zerotir.rl_step import RLConfig, placeholder, ppo_update, prepare_batch
from zerotir.rollout.engine import SamplingParams
from zerotir.rollout.tp_group import own_trajectories
from zerotir.runtime import RolloutRuntime
from zerotir.types import Trajectories

log = logging.getLogger(__name__)


class ZeroTIRModule(LightningModule):
    """Train a base causal LM by outcome-reward RL with a code sandbox (ZeroTIR).

    Args:
        model_path: HF model folder or hub id of the base model (actor, reference and critic start from it).
        algorithm: "reinforce_pp" (REINFORCE++: token returns, KL in the token rewards, whitened), "reinforce_baseline"
            (the paper's: reward minus its prompt group's mean, then as reinforce_pp), "rloo" (reward minus the mean of
            the prompt's other samples, token returns, not whitened), "grpo" ((reward - group mean) / (group std +
            grpo_std_eps)) or "ppo" (critic, GAE). The group estimators need n_samples >= 2.
        dtype: parameter dtype of the models: float32, bfloat16 or float16.
        gradient_checkpointing: recompute activations in the backward pass (actor and critic).
        build_toy_base_if_missing: build the toy base model at ``model_path`` (``zerotir.toy.pretrain``) unless a
            toy base with the same settings is there.
        toy_base_settings: ``PretrainSettings`` fields for that build.
        n_samples: samples per prompt in training rollouts.
        temperature: sampling temperature of training rollouts.
        top_p: nucleus mass of training rollouts.
        max_response_tokens: total response budget per trajectory (sampled + injected tokens).
        max_tool_calls: code executions allowed per trajectory (the paper: 20); after that code stops are dropped.
        max_output_chars: injected tool output is truncated to this many characters,
        max_output_tokens: then to this many tokens (None: characters only; the paper's code: 256).
        run_timeout: seconds one code execution may run in the sandbox.
        rollout_backend: "hf" (transformers, wraps the actor itself) or "vllm" (separate engine, weights synced).
        rollout_schedule: tool loop of the "hf" backend: "continuous" (one decode session; rows leave at a code block
            and rejoin with its result) or "rounds" of generate calls (costs: ToolConfig.continuous).
        engine_kwargs: extra keyword arguments of the engine class.
        weight_sync_bucket_mb: bucket size of the vLLM weight sync.
        sandbox_urls: sandbox servers; None starts an embedded local sandbox for the run.
        local_sandbox_options: options of that embedded server (``workers``, ``run_timeout``, ...).
        sandbox_client_kwargs: options of the ``SandboxClient`` (``max_concurrency``, ``retries``, ...).
        max_sandbox_error_rate: highest tolerated share of executions the sandbox fails to run.
        sandbox_error_patience: consecutive steps above that rate that stop the run.
        eval_n_samples: samples per problem in validation / test (avg@k and pass@k with k = this).
        eval_temperature: sampling temperature of validation / test (0 = greedy).
        eval_top_p: nucleus mass of validation / test.
        eval_report_dir: where evaluation reports go; default ``<log dir>/eval``.
        kl_coef: KL coefficient beta; 0 skips the reference model entirely.
        kl_estimator: k1, k2 or k3.
        use_kl_loss: put the KL in the loss (GRPO style) instead of the token rewards.
        grpo_kl_in_reward: GRPO with use_kl_loss false: subtract kl_coef x the summed KL from each reward before the
            group baseline (GRPO with kl_coef > 0 needs this or use_kl_loss).
        gamma: discount per action token.
        gae_lambda: GAE lambda (PPO).
        gae_injected: GAE at injected tool-output tokens (PPO). "skip": they are transparent, the next action token is
            the next step (as verl). "restart": the paper's code; each turn is an episode ending in V = 0.
        whiten_ppo_advantages: normalise PPO's GAE advantages over the batch.
        whiten_eps: added to the variance when advantages are whitened (PPO, reinforce_pp, reinforce_baseline).
        grpo_scale_by_std: divide GRPO's group-centred rewards by the group std (false: Dr. GRPO).
        grpo_std_eps: added to GRPO's group std before dividing (an all-equal group has std 0).
        clip_low: lower clip epsilon of the ratio (the paper's code: 0.22).
        clip_high: upper clip epsilon of the ratio (the paper's code: 0.28).
        dual_clip: dual-clip PPO's bound c > 1: a token with advantage A < 0 loses at most -c x A (null: off).
        loss_agg_mode: how token losses become the batch loss: "token-mean" (every token weighs the same),
            "seq-mean-token-mean" (every response does), "seq-mean-token-sum", "seq-mean-token-sum-norm" (token sums
            / max_response_tokens, Dr. GRPO).
        value_clip: clip range of the value loss (None: unclipped).
        vf_coef: weight of the value loss.
        entropy_coef: weight of an entropy bonus (0 = none).
        ppo_epochs: passes over each RL batch.
        num_mini_batches: optimizer steps per pass.
        micro_batch_size: trajectories per forward / backward.
        lr: actor learning rate.
        critic_lr: critic learning rate (default: ``lr``).
        weight_decay: AdamW weight decay.
        betas: Adam betas.
        warmup_steps: linear warmup in optimizer steps, constant afterwards.
        max_grad_norm: gradient clipping (0 = off): per parameter group (actor, critic); under DeepSpeed one global
            norm over both (its ``gradient_clipping`` has no per-group clipping), logged as ``grad_norm``.
        optimizer: "adamw" (torch) or "deepspeed_cpu_adam" (for ZeRO optimizer offload).
        seed: seed of rollout sampling (step k samples with ``seed + k``), so a resumed run repeats a step exactly.
    """

    def __init__(
        self,
        model_path: str,
        algorithm: Literal["reinforce_pp", "reinforce_baseline", "rloo", "grpo", "ppo"] = "reinforce_pp",
        dtype: Literal["float32", "bfloat16", "float16"] = "float32",
        gradient_checkpointing: bool = False,
        build_toy_base_if_missing: bool = False,
        toy_base_settings: dict[str, Any] | None = None,
        n_samples: int = 8,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_response_tokens: int = 1024,
        max_tool_calls: int = 4,
        max_output_chars: int = 512,
        max_output_tokens: int | None = 256,
        run_timeout: float = 5.0,
        rollout_backend: Literal["hf", "vllm"] = "hf",
        rollout_schedule: Literal["rounds", "continuous"] = "continuous",
        engine_kwargs: dict[str, Any] | None = None,
        weight_sync_bucket_mb: int = 256,
        sandbox_urls: list[str] | None = None,
        local_sandbox_options: dict[str, Any] | None = None,
        sandbox_client_kwargs: dict[str, Any] | None = None,
        max_sandbox_error_rate: float = 0.5,
        sandbox_error_patience: int = 3,
        eval_n_samples: int = 1,
        eval_temperature: float = 0.0,
        eval_top_p: float = 1.0,
        eval_report_dir: str | None = None,
        kl_coef: float = 0.0,
        kl_estimator: Literal["k1", "k2", "k3"] = "k3",
        use_kl_loss: bool = False,
        grpo_kl_in_reward: bool = False,
        gamma: float = 1.0,
        gae_lambda: float = 1.0,
        gae_injected: Literal["skip", "restart"] = "skip",
        whiten_ppo_advantages: bool = True,
        whiten_eps: float = 1e-8,
        grpo_scale_by_std: bool = True,
        grpo_std_eps: float = 1e-6,
        clip_low: float = 0.2,
        clip_high: float = 0.28,
        dual_clip: float | None = 3.0,
        loss_agg_mode: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                               "seq-mean-token-sum-norm"] = "token-mean",
        value_clip: float | None = 0.2,
        vf_coef: float = 0.5,
        entropy_coef: float = 0.0,
        ppo_epochs: int = 1,
        num_mini_batches: int = 1,
        micro_batch_size: int = 8,
        lr: float = 1e-6,
        critic_lr: float | None = None,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.95),
        warmup_steps: int = 0,
        max_grad_norm: float = 1.0,
        optimizer: Literal["adamw", "deepspeed_cpu_adam"] = "adamw",
        seed: int = 0,
    ):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.rl = RLConfig(**{f.name: self.hparams[f.name] for f in fields(RLConfig)})  # checks n_samples too
        if eval_n_samples < 1:
            raise ValueError(f"eval_n_samples={eval_n_samples}: must be >= 1")
        if rollout_schedule not in ("rounds", "continuous"):
            raise ValueError(f"rollout_schedule={rollout_schedule!r}: choose 'rounds' or 'continuous'")
        if build_toy_base_if_missing:
            ensure_toy_base(model_path, toy_base_settings)
        self.model_path = models.resolve_model_path(model_path)
        self.tokenizer = models.load_tokenizer(self.model_path)
        self.actor: torch.nn.Module | None = None
        self.ref_model: torch.nn.Module | None = None
        self.critic: torch.nn.Module | None = None
        self.runtime = RolloutRuntime(rollout_backend, self.model_path, sandbox_urls, engine_kwargs,
                                      weight_sync_bucket_mb, sandbox_client_kwargs, local_sandbox_options)
        self.sandbox_guard = SandboxErrorGuard(sandbox_urls or ["<embedded local sandbox>"], max_sandbox_error_rate,
                                               sandbox_error_patience)
        self.evaluator = EvalAccumulator()
        # The protocol read by the callbacks (see callbacks/scaling_metrics.py).
        self.rl_step = 0  # index (1-based) of the RL step in progress / last done
        self.rl_steps_done = 0
        self.last_rollout: Trajectories | None = None
        self.last_timings: dict[str, float] = {}
        self.last_update_stats: dict[str, float] = {}
        self._hf_zero3: Any = None  # transformers' ZeRO-3 switch, held while the run lasts (see configure_model)

    # ----- models and optimizer -----
    def setup(self, stage: str) -> None:
        """Before any model loads: a DeepSpeed config or rollout backend that cannot work fails here, naming the fix."""
        hp = self.hparams
        if is_deepspeed(self.trainer):
            check_rollout_backend(is_zero3(self.trainer), self.trainer.world_size, hp.rollout_backend)
            if stage == "fit":
                check_deepspeed_config(self.trainer.strategy.config, hp.max_grad_norm, hp.optimizer)

    def configure_model(self) -> None:
        """Load the actor, and for training the reference (only with kl_coef > 0) and the critic (PPO); idempotent.

        ``validate`` / ``test`` need only the actor: the other models are not loaded, and their weights in a
        checkpoint are ignored (see ``on_load_checkpoint``). Under ZeRO-3 Lightning calls this inside
        ``deepspeed.zero.Init``; transformers' ``HfDeepSpeedConfig`` is made live first so that ``from_pretrained``
        loads into the partitioned parameters (``zerotir.deepspeed_setup.hf_zero3_config``).
        """
        if self.actor is not None:
            return
        hp = self.hparams
        fitting = self._trainer is None or self.trainer.state.fn == TrainerFn.FITTING
        if self._trainer is not None and self._hf_zero3 is None:
            self._hf_zero3 = hf_zero3_config(self.trainer)
        self.actor = models.load_causal_lm(self.model_path, hp.dtype, hp.gradient_checkpointing)
        if fitting and hp.kl_coef > 0:
            self.ref_model = models.load_reference(self.model_path, hp.dtype)
        if fitting and hp.algorithm == "ppo":
            self.critic = models.load_critic(self.model_path, hp.dtype, hp.gradient_checkpointing)

    def train(self, mode: bool = True) -> ZeroTIRModule:
        """Lightning switches the whole module to train mode; the reference model stays frozen in eval mode."""
        super().train(mode)
        if self.ref_model is not None:
            self.ref_model.eval()
        return self

    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        groups = [{"params": [p for p in self.actor.parameters() if p.requires_grad], "lr": hp.lr, "name": "actor"}]
        if self.critic is not None:
            groups.append({"params": list(self.critic.parameters()), "lr": hp.critic_lr or hp.lr, "name": "critic"})
        if hp.optimizer == "deepspeed_cpu_adam":
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            opt = DeepSpeedCPUAdam(groups, betas=tuple(hp.betas), weight_decay=hp.weight_decay, adamw_mode=True)
        else:
            opt = torch.optim.AdamW(groups, betas=tuple(hp.betas), weight_decay=hp.weight_decay)
        warmup = max(hp.warmup_steps, 0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / (warmup + 1)))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def _backward(self, loss: torch.Tensor) -> None:
        """One micro-batch's backward; under DeepSpeed ``begin_micro_batch`` first (or ZeRO-3 keeps only the last)."""
        if is_deepspeed(self.trainer):
            begin_micro_batch(self.trainer.model)
        self.manual_backward(loss)

    def _optimizer_step(self, has_grad: bool) -> float:
        """Clip per parameter group, step, zero the gradients, advance the schedule; returns the actor grad norm.

        Without gradients (``has_grad=False``) every ``.grad`` is None, so the optimizer skips every parameter:
        the step only keeps Lightning's step count and the schedule in line with the RL step. Under DeepSpeed the
        engine's ``step()`` is not called at all then (no backward ran; every rank skips together, the decision is
        global), only Lightning's count advances. DeepSpeed clips inside its step (``gradient_clipping``).
        """
        opt = self.optimizers()
        deepspeed = is_deepspeed(self.trainer)
        norm = 0.0
        if has_grad and self.hparams.max_grad_norm > 0 and not deepspeed:
            norms = [torch.nn.utils.clip_grad_norm_(g["params"], self.hparams.max_grad_norm)
                     for g in opt.optimizer.param_groups]
            norm = float(norms[0])
        if deepspeed and not has_grad:
            count_skipped_step(opt)
        else:
            opt.step()
            opt.zero_grad(set_to_none=True)
        self.lr_schedulers().step()
        if has_grad and deepspeed:
            norm = float(self.trainer.model.get_global_grad_norm() or 0.0)
        return norm

    # ----- runtime (sandbox + engine): started before the loops, so a dead sandbox fails before step 1 -----
    def _start_runtime(self) -> None:
        self.runtime.start(self.actor, self.tokenizer, self.device)
        self.sandbox_guard.urls = self.runtime.urls

    def on_fit_start(self) -> None:
        self._start_runtime()

    on_validation_start = on_test_start = on_fit_start

    # ----- one RL step -----
    def train_params(self) -> SamplingParams:
        hp = self.hparams
        return SamplingParams(n=hp.n_samples, temperature=hp.temperature, top_p=hp.top_p,
                              max_new_tokens=hp.max_response_tokens, seed=hp.seed + self.rl_step)

    def tool_config(self) -> Any:
        from zerotir.rollout.agent_loop import ToolConfig

        hp = self.hparams
        return ToolConfig(max_tool_calls=hp.max_tool_calls, max_response_tokens=hp.max_response_tokens,
                          max_output_chars=hp.max_output_chars, max_output_tokens=hp.max_output_tokens,
                          run_timeout=hp.run_timeout, continuous=hp.rollout_schedule == "continuous")

    def rollout(self, rows: list[dict[str, Any]], params: SamplingParams) -> tuple[Trajectories, dict[str, float]]:
        """Roll out ``rows`` (the datamodule's prompt dicts) and score them; timings of generation, sandbox, reward."""
        from zerotir.reward import score_batch_sync

        self._start_runtime()  # no-op once started
        if self.runtime.stale:  # first rollout of the run, or after a resume: push the actor's weights
            self.runtime.sync(self.actor)
        self.actor.eval()
        traj, timings = self.runtime.rollout(self.tokenizer, [r["prompt_ids"] for r in rows],
                                             [r["answer"] for r in rows], params, self.tool_config())
        start = time.perf_counter()
        rewards = score_batch_sync(traj.response_texts, traj.ground_truths, traj.truncated.tolist())
        traj.rewards = torch.tensor(rewards, dtype=torch.float32)
        timings = dict(timings, reward=time.perf_counter() - start)
        return traj, timings

    def training_step(self, batch: list[dict[str, Any]], batch_idx: int) -> dict[str, Any]:
        start = time.perf_counter()
        self.rl_step = self.rl_steps_done + 1
        tp = self.tensor_parallel_size
        world = self.trainer.world_size
        if tp > 1 and len(batch) % world:
            raise ValueError(f"data.prompts_per_step={len(batch)}: with tensor-parallel engines (tensor_parallel_size="
                             f"{tp}) every rank trains on an equal share, so set it to a multiple of devices x "
                             f"num_nodes = {world}")
        rows = shard_prompts(batch, self.global_rank, world, tp)  # all rows on a single process
        traj, timings = self.rollout(rows, self.train_params())
        if tp > 1:  # the ranks of an engine rolled out the same prompts: each trains on its own share of them
            traj = traj.select(training_share(traj.group_ids, self.global_rank, tp))
        self.sandbox_guard.update(traj, self.rl_step)
        self.last_rollout = traj
        kept = self._filter(traj)
        update_start = time.perf_counter()
        if global_sum(len(kept)) == 0:  # no rank kept anything
            stats = self._skip_update()
        else:
            stats = self._update((kept if len(kept) else placeholder(traj)).to(self.device))
        timings["update"] = time.perf_counter() - update_start
        timings["weight_sync"] = self.runtime.sync(self.actor)
        timings["step"] = time.perf_counter() - start
        self.last_timings, self.last_update_stats = timings, stats
        datamodule = self.trainer.datamodule
        if datamodule is not None and hasattr(datamodule, "mark_consumed") and "batch_index" in batch[0]:
            datamodule.mark_consumed(batch[0]["batch_index"])  # the data position saved with the checkpoint
        version, self.rl_steps_done = self.rl_steps_done, self.rl_step  # the updates the rollout's weights had
        self.log("rl_step", float(self.rl_step), prog_bar=True, logger=False, batch_size=1)
        return dict(batch_fields(rows), rollout=traj, weight_version=version, timings=timings, update_stats=stats)

    @property
    def tensor_parallel_size(self) -> int:
        """GPUs per rollout engine: ``engine_kwargs.tensor_parallel_size`` of a vLLM backend, else 1."""
        if self.hparams.rollout_backend != "vllm":
            return 1
        return int((self.hparams.engine_kwargs or {}).get("tensor_parallel_size", 1))

    def _filter(self, traj: Trajectories) -> Trajectories:
        """Every callback that defines ``on_rollout_scored`` (e.g. ``PassRateFilter``), in order."""
        for cb in self.trainer.callbacks:
            hook = getattr(cb, "on_rollout_scored", None)
            if hook is not None:
                traj = hook(self.trainer, self, traj)
        return traj

    def _update(self, traj: Trajectories) -> dict[str, float]:
        for m in (self.actor, self.critic):
            if m is not None:
                m.eval()  # old log-probs / values without dropout, as the rollout saw them
        batch, stats = prepare_batch(self.rl, traj, self.actor, self.ref_model, self.critic)
        for m in (self.actor, self.critic):
            if m is not None:
                m.train()  # gradient checkpointing is only active in train mode
        gen = torch.Generator().manual_seed(self.hparams.seed + self.rl_step)
        stats.update(ppo_update(self.rl, batch, self.actor, self.critic, self._backward, self._optimizer_step,
                                self.rl_step, gen))
        stats["lr"] = float(self.lr_schedulers().get_last_lr()[0])
        return stats

    def _skip_update(self) -> dict[str, float]:
        """The filter kept nothing: no update, but the same number of (no-op) optimizer steps."""
        for _ in range(self.rl.optimizer_steps_per_rl_step):
            self._optimizer_step(False)
        return {}

    # ----- validation and test: the same rollout path, reports through zerotir.evaluation -----
    def eval_params(self, batch_idx: int) -> SamplingParams:
        hp = self.hparams
        return SamplingParams(n=hp.eval_n_samples, temperature=hp.eval_temperature, top_p=hp.eval_top_p,
                              max_new_tokens=hp.max_response_tokens, seed=hp.seed + batch_idx)

    def _eval_step(self, batch: list[dict[str, Any]], batch_idx: int, dataloader_idx: int) -> dict[str, Any]:
        rows, own = self.runtime.share_rows(batch)  # a tensor-parallel group rolls out its ranks' merged rows
        traj, timings = self.rollout(rows, self.eval_params(batch_idx))
        traj = own_trajectories(traj, own, len(rows), self.hparams.eval_n_samples)  # group ids index ``rows``
        self.evaluator.add(dataloader_idx, traj, [row["id"] for row in rows])
        return dict(batch_fields(rows), rollout=traj, weight_version=self.rl_steps_done, timings=timings)

    def validation_step(self, batch: list[dict[str, Any]], batch_idx: int, dataloader_idx: int = 0) -> dict[str, Any]:
        return self._eval_step(batch, batch_idx, dataloader_idx)

    test_step = validation_step

    def on_validation_epoch_start(self) -> None:
        self.evaluator.reset()

    on_test_epoch_start = on_validation_epoch_start

    def on_validation_epoch_end(self) -> None:
        self.evaluator.finish(self, "val", self.trainer.datamodule.val_names)

    def on_test_epoch_end(self) -> None:
        self.evaluator.finish(self, "test", self.trainer.datamodule.test_names)

    # ----- checkpoints and teardown -----
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["zerotir"] = {"rl_steps_done": self.rl_steps_done, "sandbox_guard": self.sandbox_guard.state_dict()}
        # The reference model is the unchanged base model: reload it from model_path instead of storing it.
        state = checkpoint.get("state_dict")
        if state is not None:
            for key in [k for k in state if k.startswith("ref_model.")]:
                del state[key]

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        saved = checkpoint.get("zerotir", {})
        self.rl_steps_done = self.rl_step = int(saved.get("rl_steps_done", 0))
        self.sandbox_guard.load_state_dict(saved.get("sandbox_guard", {}))
        state = checkpoint.get("state_dict")
        if state is not None:
            if self.ref_model is not None:  # put the frozen weights back for strict loading
                state.update({f"ref_model.{k}": v for k, v in self.ref_model.state_dict().items()})
            if self.critic is None:  # validate / test, or a checkpoint of another algorithm: the actor is enough
                for key in [k for k in state if k.startswith("critic.")]:
                    del state[key]
        self.runtime.stale = True

    def teardown(self, stage: str) -> None:
        self.runtime.close()
        self._hf_zero3 = None  # transformers' ZeRO-3 switch off again (it holds only a weak reference)

    def configure_callbacks(self) -> list[Callback]:
        return [_CloseRuntimeOnException(), PurgeResumedSteps()]


class _CloseRuntimeOnException(Callback):
    """Stops the module's sandbox / engine when fit, validate or test raises (a NaN loss, a dead sandbox...)."""

    def on_exception(self, trainer: Any, pl_module: ZeroTIRModule, exception: BaseException) -> None:
        pl_module.runtime.close()


def ensure_toy_base(model_path: str, settings: dict[str, Any] | None) -> None:
    """Build the toy base model at ``model_path`` unless one made with the same settings is there."""
    from zerotir.toy.pretrain import ensure_toy_base as build

    build(model_path, **(settings or {}))
