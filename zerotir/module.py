"""``ZeroTIRModule``: the LightningModule of a ZeroTIR run. One training step is one RL step:

    the rollout source's batch (the next prompts of the training stream it reads, this rank's share rolled out
    with tools, n per prompt, scored as they end: ``zerotir.rollout.source``) -> sandbox guard -> the keep decision
    of ``model.filters`` -> ``zerotir.rl.step.rl_step`` (old log-probs / reference / values, advantages, the
    PPO-epoch update) -> the source's after-update (the new weights to the engine that generates next) ->
    ``StepResult`` returned to the callbacks (``outputs["step"]`` of ``on_train_batch_end``).

The module owns what Lightning must own: the actor, critic and reference models, the one optimizer, the DeepSpeed
hooks, checkpoints, the data position. Its settings are the typed groups of ``zerotir.config``.

Steps: optimization is manual with ONE optimizer (actor and critic are two parameter groups; Lightning's DeepSpeed
strategy accepts a single optimizer). Lightning's ``trainer.global_step`` counts ``optimizer.step()`` calls, and each
RL step makes exactly ``ppo_epochs * num_mini_batches`` of them (a skipped update makes as many no-op steps), so
``global_step == rl_step * ppo_epochs * num_mini_batches``. With the defaults (1, 1) the two are equal and
``trainer.max_steps`` / ``ModelCheckpoint(every_n_train_steps=...)`` count RL steps. ``rl_step`` is also kept
(saved in checkpoints) and is the x axis of every TensorBoard tag.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, is_dataclass, replace
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule
from lightning.pytorch.trainer.states import TrainerFn

from zerotir import lora, models
from zerotir.config import (
    BaseModelConfig, EvalConfig, FilterConfig, HFRollout, HostsConfig, OptimConfig, RLConfig,
    RolloutBackend, SamplingConfig, ToolConfig, as_plain)
from zerotir.data.curriculum import outcomes
from zerotir.data.datamodule import PromptDataModule, batch_fields
from zerotir.eval.loop import EvalAccumulator
from zerotir.filters.decide import decide
from zerotir.filters.trajectory import FilterContext
from zerotir.rewards import MathReward, Reward
from zerotir.rl.guards import SandboxErrorGuard
from zerotir.rl.refill import BatchFill, FilledBatch, FillWatch, Round
from zerotir.rl.staleness import staleness_stats
from zerotir.rl.step import BatchInfo, FilterDecision, Models, StepOptimizer, StepResult, rl_step
from zerotir.rollout.engine import pad_id
from zerotir.rollout.source import sampling_params
from zerotir.sources import make_rollout_source
from zerotir.parallel.deepspeed_setup import (
    begin_micro_batch, check_fit_setup, count_skipped_step, hf_zero3_config, release_for_push, is_deepspeed, is_zero3)
from zerotir.parallel.distributed import gather_objects
from zerotir.parallel.peer_watch import CloseOnException, WatchPeers
from zerotir.tools.formats import FormatWatch, format_label
from zerotir.types import PromptRow, Trajectories

log = logging.getLogger(__name__)


class ZeroTIRModule(LightningModule):
    """Train a base causal LM by outcome-reward RL with a code sandbox (ZeroTIR).

    Args:
        base: the base model (``path``, ``dtype``, ``gradient_checkpointing``, ``attn_implementation``, ``lora``); the
            actor, reference and critic start from it (under ``lora`` the reference is the actor's adapters off).
        rl: the RL algorithm (advantages, KL, clipping, epochs, mini-batches).
        optim: the optimizer and its schedule.
        tool: the tools (call budget, output caps, timeout, format, the tool list) and ``sandbox``, where the python
            tool's code runs (URLs, or the embedded server's options) and how many sandbox failures stop a run;
            ``max_tool_calls: 0`` trains without tools.
        sampling: sampling of training rollouts.
        eval: validation / test: their ``sampling`` (avg@k and pass@k with k = its n) and ``report_dir``.
        rollout: the rollout engine, a ``class_path``: ``zerotir.config.HFRollout`` (transformers, the default) or
            ``zerotir.config.VLLMRollout``, each with its own ``init_args``.
        reward: the reward, a ``class_path`` (``zerotir.rewards``): ``MathReward`` (the paper's: last boxed answer
            and math-verify, the default), ``JudgeReward`` (an LLM judge), ``WeightedReward`` (a weighted sum, e.g.
            with ``ToolCallCost``) or a ``Reward`` subclass of your own; it gives each trajectory a score and
            whether it counts as correct (what the filters and the evaluation count).
        hosts: asynchronous rollouts: engine hosts with their own engine and weights generating the next batches
            while the trainer updates, at most ``max_staleness`` weight versions behind; ``engines: 0``: one host in
            a thread of the trainer's process (``zerotir.fleet.thread_host``), K >= 1: K Ray actors fed every
            update's weights over a process group of their own (``zerotir.fleet``); ``max_staleness: null`` (the
            default): none, each batch generated in line.
        filters: which trajectories and prompt groups leave the loss (trajectory rules, overlong handling,
            correct-with-errors downsampling), all off by default (``zerotir.filters``), and ``refill``: dynamic
            sampling, up to ``max_rounds`` batches per step, and how many steps in a row may train nothing before
            the run stops (``zerotir.rl.refill``).
        seed: seed of rollout sampling (training batch b samples with ``seed + b + 1``: step k's, without refill,
            with ``seed + k``), so a resumed run repeats a step exactly.
    """

    def __init__(
        self,
        base: BaseModelConfig,
        rl: RLConfig = RLConfig(),
        optim: OptimConfig = OptimConfig(),
        tool: ToolConfig = ToolConfig(),
        sampling: SamplingConfig = SamplingConfig(),
        eval: EvalConfig = EvalConfig(),  # noqa: A002 (the key model.eval; never kept as self.eval, nn.Module's)
        rollout: RolloutBackend = HFRollout(),
        reward: Reward = MathReward(),
        hosts: HostsConfig = HostsConfig(),
        filters: FilterConfig = FilterConfig(),
        seed: int = 0,
    ):
        super().__init__()
        self.save_hyperparameters()
        self._plain_hparams()
        self.automatic_optimization = False
        self.base = replace(base, path=models.resolve_model_path(base.path, "model.base.path"))
        self.model_path = self.base.path
        rl = rl.for_run(hosts.max_staleness, sampling)  # checked, its off-policy correction's default for S
        self.rl, self.optim, self.tool, self.sampling, self.eval_config = rl, optim, tool, sampling, eval
        rollout = rollout.for_lora(base.lora.rank if base.lora else None)  # the engine serves the actor's adapters
        self.backend, self.sandbox_config, self.seed = rollout, tool.sandbox, seed
        filters.check_run(rl, sampling, tool)
        self.filters = filters
        self.reward = reward
        self.tokenizer = models.load_tokenizer(self.model_path)
        self.actor: torch.nn.Module | None = None
        self.ref_model: torch.nn.Module | None = None
        self.critic: torch.nn.Module | None = None
        self.source = make_rollout_source(hosts, rollout, tool.sandbox, tool, sampling, reward,
                                          self.model_path, seed, base.dtype)
        self.sandbox_guard = SandboxErrorGuard(tool.sandbox.max_error_rate, tool.sandbox.error_patience)
        self.refill, self.fill_watch = filters.refill, FillWatch(filters.refill, format_label(tool.format))
        self.format_watch = FormatWatch(tool)  # warns once: calls written in the other format
        self.evaluator = EvalAccumulator()
        self.rl_steps_done = 0  # RL steps finished (saved in checkpoints); the step in progress is rl_steps_done + 1
        self.step_changing_state = False  # the step in progress changes saved state: no checkpoint of half a step
        self._hf_zero3: Any = None  # transformers' ZeRO-3 switch, held while the run lasts (see configure_model)

    def _plain_hparams(self) -> None:
        """Groups as plain dicts in ``hparams`` (as the CLI gives them), so checkpoints load with ``weights_only``."""
        for key, value in list(self.hparams.items()):
            if is_dataclass(value) and not isinstance(value, type):
                plain = asdict(value)
                if isinstance(value, RolloutBackend):
                    plain = {"class_path": f"zerotir.config.{type(value).__qualname__}", "init_args": plain}
                elif isinstance(value, Reward):
                    plain = {"class_path": f"{type(value).__module__}.{type(value).__qualname__}", "init_args": plain}
                self.hparams[key] = plain

    # ----- models and optimizer -----
    def setup(self, stage: str) -> None:
        """Before any model loads: a DeepSpeed config, rollout backend or rollout source that cannot work with this
        trainer fails here, naming the fix."""
        self.source.check_trainer(self.trainer.world_size, is_deepspeed(self.trainer) and is_zero3(self.trainer))
        if stage == "fit":  # half-precision weights need DeepSpeed's fp32 masters; its JSON must agree with ours
            check_fit_setup(self.trainer, lora.trained_dtype(self.base.dtype, self.base.lora, self.rl.uses_critic),
                            self.optim.max_grad_norm, self.optim.optimizer)

    def configure_model(self) -> None:
        """Load the actor, and for training the reference (only with kl_coef > 0) and the critic (``rl.uses_critic``);
        idempotent.

        ``validate`` / ``test`` need only the actor (the others' weights in a checkpoint are ignored). Under ZeRO-3
        Lightning calls this inside ``deepspeed.zero.Init``; transformers' ``HfDeepSpeedConfig`` is made live first
        so that ``from_pretrained`` loads into the partitioned parameters (``deepspeed_setup.hf_zero3_config``).
        """
        if self.actor is not None:
            return
        fitting = self._trainer is None or self.trainer.state.fn == TrainerFn.FITTING
        if self._trainer is not None and self._hf_zero3 is None:
            self._hf_zero3 = hf_zero3_config(self.trainer)
        base = self.base
        self.actor = models.load_causal_lm(base.path, base.dtype, base.gradient_checkpointing, base.attn_implementation)
        if base.lora is not None:  # the reference is then the actor with its adapters off (lora.AdaptersOff)
            self.actor = lora.add_adapters(self.actor, base.lora)
        elif fitting and self.rl.kl_coef > 0:
            self.ref_model = models.load_reference(base.path, base.dtype, base.attn_implementation)
        if fitting and self.rl.uses_critic:
            self.critic = models.load_critic(base.path, base.dtype, base.gradient_checkpointing,
                                             base.attn_implementation)
            self.critic = lora.add_critic_adapters(self.critic, base.lora) if base.lora else self.critic

    def train(self, mode: bool = True) -> ZeroTIRModule:
        """Lightning switches the whole module to train mode; the reference model stays frozen in eval mode."""
        super().train(mode)
        if self.ref_model is not None:
            self.ref_model.eval()
        return self

    @property
    def _reference(self) -> Any:
        """The reference of the KL: ``ref_model``, or under LoRA the actor with its adapters off (None: no KL)."""
        return lora.reference(self.actor, self.ref_model, self.rl.kl_coef)

    def configure_optimizers(self) -> dict[str, Any]:
        o = self.optim
        groups = [{"params": lora.trainable(self.actor), "lr": o.lr, "name": "actor"}]
        if self.critic is not None:  # under LoRA: the adapters and the value head
            groups.append({"params": lora.trainable(self.critic), "lr": o.critic_lr or o.lr, "name": "critic"})
        if o.optimizer == "deepspeed_cpu_adam":
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            opt = DeepSpeedCPUAdam(groups, betas=tuple(o.betas), weight_decay=o.weight_decay, adamw_mode=True)
        else:
            opt = torch.optim.AdamW(groups, betas=tuple(o.betas), weight_decay=o.weight_decay)
        warmup = o.warmup_steps
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
        if has_grad and self.optim.max_grad_norm > 0 and not deepspeed:
            norms = [torch.nn.utils.clip_grad_norm_(g["params"], self.optim.max_grad_norm)
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

    # ----- the rollout source (tools + engine): started before the loops, so a dead sandbox fails before step 1 ------
    def _start_source(self) -> None:
        datamodule = self.trainer.datamodule  # the training stream the source reads its batches from
        stream = datamodule if isinstance(datamodule, PromptDataModule) else None
        if not self._reward_open:  # an unreachable judge stops the run before step 1, like the sandbox's check
            self.reward.start()
            self._reward_open = True
        self.source.start(self.actor, self.tokenizer, self.device, stream)  # it says how a LoRA actor's pushes go

    def on_fit_start(self) -> None:
        datamodule = self.trainer.datamodule
        if isinstance(datamodule, PromptDataModule):  # a curriculum deciding on results needs batches drawn in line
            datamodule.check_steps_take(self.source.steps_take)
        self._start_source()

    def on_validation_start(self) -> None:
        self._start_source()

    on_test_start = on_validation_start

    # ----- one RL step -----
    def training_step(self, tick: int) -> dict[str, StepResult]:
        """One RL step (``tick``: the train loader's, which only counts Lightning's steps): the rollout source reads
        the step's prompts from the training stream; the ``StepResult`` goes to the callbacks as ``outputs["step"]``."""
        start = time.perf_counter()
        step = self.rl_steps_done + 1
        filled, sandbox, taken = self._fill(step)
        traj, timings = filled.trajectories, filled.timings
        self.sandbox_guard.update(traj, step, sandbox)
        self.format_watch.update(step, traj.response_texts, traj.num_calls)
        update_start = time.perf_counter()
        result = rl_step(self.rl, traj, filled.decision, Models(self.actor, self.critic, self._reference),
                         StepOptimizer(self._backward, self._optimizer_step), step, self.seed, self.device,
                         max_response_tokens=self.sampling.max_response_tokens, temperature=self.sampling.temperature,
                         top_p=self.sampling.top_p)
        timings["update"] = time.perf_counter() - update_start
        release_for_push(self.trainer)  # the push gathers outside a forward
        timings["weight_sync"] = self.source.after_update(self.actor, step)  # the weights of `step` updates
        timings["step"] = time.perf_counter() - start
        staleness = staleness_stats(traj.versions, traj.action_mask, step)
        refill = self.fill_watch.update(step, filled, result.skipped)  # warns; stops a run that keeps training nothing
        datamodule = self.trainer.datamodule
        if isinstance(datamodule, PromptDataModule):  # the data position saved with the checkpoint
            datamodule.mark_rows(taken)
        lr = {"lr": float(self.lr_schedulers().get_last_lr()[0])} if result.stats else {}
        result = replace(result, stats={**result.stats, **lr}, timings=timings,
                         batch=BatchInfo(**batch_fields(filled.rows), weight_version=self.rl_steps_done),
                         pipeline={**{key: staleness[key] for key in ("staleness_mean", "staleness_max")},
                                   **self.source.stats(), **self.reward.stats()}, refill=refill,
                         data=datamodule.step_metrics() if isinstance(datamodule, PromptDataModule) else {})
        self.rl_steps_done, self.step_changing_state = step, False
        self.log("rl_step", float(step), prog_bar=True, logger=False, batch_size=1)
        return {"step": result}

    def _fill(self, step: int) -> tuple[FilledBatch, list[str], list[tuple[int, int]]]:
        """The step's batch: the source's next batch of the stream, decided, then (``model.filters.refill``) more
        until the kept groups fill it (``rl.refill.BatchFill``); the sandbox the code ran on; the stream rows ``(batch
        index, position)`` the step consumed, every rank's (``RolloutBatch.taken``)."""
        fill: BatchFill | None = None
        taken: list[tuple[int, int]] = []
        while True:
            release_for_push(self.trainer)  # the source may push (its first batch, an engine recovered)
            rolled = self.source.batch(step)
            traj = rolled.trajectories
            self.step_changing_state = True  # from here on the step's results enter saved state
            self._observe(rolled.rows, traj)
            fill = fill or BatchFill(len(rolled.taken), self.refill.max_rounds)
            taken += rolled.taken
            if fill.add(Round(rolled.rows, traj, self._decide(traj), rolled.timings)):
                return fill.result(pad_id(self.tokenizer)), rolled.sandbox, taken

    def _observe(self, rows: list[PromptRow], traj: Trajectories) -> None:
        """A rolled-out batch's results, every rank's, as plain data to ``data.curriculum`` (before the next batch
        is drawn: what it may depend on)."""
        datamodule = self.trainer.datamodule
        if isinstance(datamodule, PromptDataModule) and datamodule.curriculum is not None:
            mine = outcomes(rows, traj.group_ids.tolist(), traj.correct.tolist())
            datamodule.observe([o for rank in gather_objects(mine) for o in rank])

    def _decide(self, traj: Trajectories) -> FilterDecision | None:
        """The keep decision of one batch: the rules of ``model.filters`` (``zerotir.filters.decide``; None with
        every rule off: everything trains)."""
        context = FilterContext.of(self.tool, self.sampling.max_response_tokens)
        return decide(self.filters, traj, context, step=self.rl_steps_done + 1, seed=self.seed)

    # ----- validation and test: the same rollout path, reports through zerotir.eval -----
    def _eval_step(self, batch: list[PromptRow], batch_idx: int, dataloader_idx: int) -> dict[str, StepResult]:
        """An evaluation batch; its ``StepResult`` (no update: ``stats`` empty, every row kept) goes to the callbacks
        as ``outputs["step"]``, at the RL step of the weights."""
        release_for_push(self.trainer)  # the source may push (a batch before any training batch)
        rolled = self.source.evaluate(batch, sampling_params(self.eval_config.sampling, self.seed + batch_idx))
        traj, rows = rolled.trajectories, rolled.rows  # a tensor-parallel group's merged rows: group ids index them
        self.evaluator.add(dataloader_idx, traj, [row["id"] for row in rows])
        info = BatchInfo(**batch_fields(rows), weight_version=self.rl_steps_done)
        kept = torch.ones(len(traj), dtype=torch.bool)
        return {"step": StepResult(self.rl_steps_done, traj, kept, None, {}, rolled.timings, info)}

    def validation_step(self, batch: list[PromptRow], batch_idx: int, dataloader_idx: int = 0) -> dict[str, StepResult]:
        return self._eval_step(batch, batch_idx, dataloader_idx)

    test_step = validation_step

    def on_validation_epoch_start(self) -> None:
        self.evaluator.reset()

    on_test_epoch_start = on_validation_epoch_start

    def on_validation_epoch_end(self) -> None:
        self._finish_eval("val", self.trainer.datamodule.val_names)

    def on_test_epoch_end(self) -> None:
        self._finish_eval("test", self.trainer.datamodule.test_names)

    def _finish_eval(self, split: str, names: list[str]) -> None:
        out = Path(self.eval_config.report_dir or Path(self.trainer.default_root_dir) / "eval")
        meta = {"model_path": self.model_path, "sampling": as_plain(self.eval_config.sampling),
                "max_tool_calls": self.tool.max_tool_calls}
        self.evaluator.finish(self, split, names, out, meta, self.rl_steps_done)

    # ----- checkpoints and teardown -----
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["zerotir"] = {"rl_steps_done": self.rl_steps_done, "sandbox_guard": self.sandbox_guard.state_dict(),
                                 "refill": self.fill_watch.state_dict()}
        # The reference model is the unchanged base model: reload it from model_path instead of storing it.
        state = checkpoint.get("state_dict")
        if state is not None:
            for key in [k for k in state if k.startswith("ref_model.")]:
                del state[key]

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        saved = checkpoint.get("zerotir", {})
        self.rl_steps_done = int(saved.get("rl_steps_done", 0))
        self.sandbox_guard.load_state_dict(saved.get("sandbox_guard", {}))
        self.fill_watch.load_state_dict(saved.get("refill", {}))
        state = checkpoint.get("state_dict")
        if state is not None:
            if self.ref_model is not None:  # put the frozen weights back for strict loading
                state.update({f"ref_model.{k}": v for k, v in self.ref_model.state_dict().items()})
            if self.critic is None:  # validate / test, or a checkpoint of another algorithm: the actor is enough
                for key in [k for k in state if k.startswith("critic.")]:
                    del state[key]

    def teardown(self, stage: str) -> None:
        self.close_run()
        self._hf_zero3 = None  # transformers' ZeRO-3 switch off again (it holds only a weak reference)

    _reward_open = False  # the reward started and not yet closed

    def close_run(self) -> None:
        """Release what the run started, on every exit path (``teardown``; ``on_exception`` when fit, validate or
        test raises, where Lightning calls no teardown): the source's tools (its MCP servers, its sandbox) and engine,
        and the reward (once per start: a judge's client)."""
        self.source.close()
        if self._reward_open:
            self._reward_open = False
            self.reward.close()

    def configure_callbacks(self) -> list[Callback]:
        """The module's own callbacks, on what it owns (the source); those of ``callbacks/`` are the CLI's
        (``zerotir.cli.app.RUN_CALLBACKS``): nothing of ``zerotir/`` imports them."""
        return [CloseOnException(self.close_run), WatchPeers(self.source.close)]
