"""What ``ZeroTIRModule`` does differently under Lightning's ``DeepSpeedStrategy``.

    * ``check_deepspeed_config``: the DeepSpeed JSON must agree with the module's settings, checked in ``setup``
      (before any model is loaded), each mismatch named with its fix. Lightning refuses ``trainer.gradient_clip_val``
      with manual optimization, so the clipping lives in the JSON; DeepSpeed's *managed* gradient accumulation at
      ``gradient_accumulation_steps = 1`` keeps only the last micro-batch's gradient under ZeRO-2.
    * ``hf_zero3_config``: under ZeRO-3 ``from_pretrained`` must know it loads into partitioned parameters. Lightning
      calls ``configure_model`` inside ``deepspeed.zero.Init``; without a live ``HfDeepSpeedConfig`` transformers
      loads the checkpoint into parameters of size 0 and fails with size mismatches
      (https://github.com/Lightning-AI/pytorch-lightning/issues/19259).
    * ``count_skipped_step``: a skipped update must not call the DeepSpeed engine's ``step()`` (no backward ran, so
      there is nothing to reduce), but Lightning's step count must still advance.
    * ``begin_micro_batch``: Lightning runs the whole ``training_step`` (every micro-batch's backward and the
      optimizer step) inside ONE ``DeepSpeedEngine.forward``. ZeRO-3 advances its micro-step counter only in
      ``clear_backward_seen_flag()``, which only ``engine.forward`` calls, and overwrites (instead of adding to) its
      gradient partitions while that counter is 0, so without this call it trains on the last micro-batch alone.
    * ``release_gathered_params`` / ``release_for_push``: under ZeRO-3, nothing left in flight before a push gathers
      the weights, wherever a push may happen (after an update; a fleet's first push and its recovery push inside
      ``training_step``; an evaluation batch's), on every rank.
    * ``check_rollout_backend``: the transformers engine under ZeRO-3 with several ranks deadlocks; refused.
    * ``check_fit_setup``: half-precision parameters train only where DeepSpeed keeps fp32 master weights, and
      the DeepSpeed JSON agrees with the module (``check_deepspeed_config``).

DeepSpeed and transformers' DeepSpeed glue are imported only inside the functions that need them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from zerotir.config import HFRollout, RolloutBackend

CONFIG_FIELD = "trainer.strategy.init_args.config"
OFFLOAD_DEVICES = ("cpu", "nvme")


class DeepSpeedConfigError(ValueError):
    """The DeepSpeed config disagrees with the module's settings; the message names the field and the fix."""


def is_deepspeed(trainer: Any) -> bool:
    """True when ``trainer`` runs Lightning's ``DeepSpeedStrategy`` (or a subclass)."""
    return any(cls.__name__ == "DeepSpeedStrategy" for cls in type(trainer.strategy).__mro__)


def is_zero3(trainer: Any) -> bool:
    """True under DeepSpeed ZeRO stage 3 (parameters partitioned over the ranks)."""
    return is_deepspeed(trainer) and trainer.strategy.zero_stage_3


def check_deepspeed_config(config: Mapping[str, Any], max_grad_norm: float, optimizer: str) -> None:
    """Raise ``DeepSpeedConfigError`` when the DeepSpeed config disagrees with the module's settings.

    Args:
        config: the strategy's DeepSpeed config (``trainer.strategy.config``).
        max_grad_norm: ``model.optim.max_grad_norm`` (0 = no clipping).
        optimizer: ``model.optim.optimizer`` ("adamw" or "deepspeed_cpu_adam").

    Raises:
        DeepSpeedConfigError: ``managed_gradient_accumulation`` is not false; ``gradient_clipping`` differs from
            ``max_grad_norm``; the config has its own ``optimizer`` / ``scheduler``; or the optimizer offload and
            ``model.optim.optimizer`` do not match.
    """
    problems = []
    if config.get("managed_gradient_accumulation") is not False:
        problems.append(
            f"managed_gradient_accumulation={config.get('managed_gradient_accumulation')!r}: the module runs one "
            "backward per micro-batch and one optimizer step per mini-batch; with DeepSpeed's managed accumulation "
            "ZeRO-2 keeps only the last micro-batch's gradient. Fix: set \"managed_gradient_accumulation\": false "
            "(as configs/deepspeed/*.json do)."
        )
    clipping = float(config.get("gradient_clipping", 0.0) or 0.0)
    if not math.isclose(clipping, float(max_grad_norm), rel_tol=1e-6, abs_tol=1e-12):
        problems.append(
            f"gradient_clipping={config.get('gradient_clipping')!r} but model.optim.max_grad_norm={max_grad_norm}: under "
            "DeepSpeed the clipping happens in DeepSpeed's step (Lightning refuses trainer.gradient_clip_val with "
            f"manual optimization). Fix: set \"gradient_clipping\": {float(max_grad_norm)} in the DeepSpeed config, "
            f"or model.optim.max_grad_norm: {clipping}."
        )
    for section in ("optimizer", "scheduler"):
        if section in config:
            problems.append(
                f"{section}: the DeepSpeed config defines its own {section}, which would replace the module's "
                "(actor / critic parameter groups, warmup). Fix: remove the section and set model.optim.lr, "
                "model.optim.critic_lr, model.optim.warmup_steps and model.optim.optimizer instead."
            )
    offload = (config.get("zero_optimization") or {}).get("offload_optimizer") or {}
    offloaded = str(offload.get("device", "none")).lower() in OFFLOAD_DEVICES
    if offloaded and optimizer != "deepspeed_cpu_adam":
        problems.append(
            f"zero_optimization.offload_optimizer.device={offload.get('device')!r} with model.optim.optimizer="
            f"{optimizer!r}: the offloaded optimizer steps on the CPU. Fix: set model.optim.optimizer: deepspeed_cpu_adam."
        )
    if optimizer == "deepspeed_cpu_adam" and not offloaded:
        problems.append(
            "model.optim.optimizer='deepspeed_cpu_adam' without zero_optimization.offload_optimizer: DeepSpeedCPUAdam needs "
            "the optimizer states on the CPU. Fix: add \"offload_optimizer\": {\"device\": \"cpu\"} to "
            "zero_optimization, or set model.optim.optimizer: adamw."
        )
    if problems:
        raise DeepSpeedConfigError(
            f"the DeepSpeed config ({CONFIG_FIELD}) does not fit the module:\n  - " + "\n  - ".join(problems)
        )


def hf_zero3_config(trainer: Any) -> Any | None:
    """A ``transformers.integrations.HfDeepSpeedConfig`` of the strategy's config under ZeRO-3, else None.

    transformers keeps only a weak reference to it: the caller must hold the returned object for as long as
    ``from_pretrained`` (and ZeRO-3-aware generation) should see ZeRO-3; dropping it turns that off again.
    """
    if not is_zero3(trainer):
        return None
    from transformers.integrations import HfDeepSpeedConfig

    return HfDeepSpeedConfig(trainer.strategy.config)


def begin_micro_batch(engine: Any) -> None:
    """Before a micro-batch's backward: what ``DeepSpeedEngine.forward`` does before each forward of its own.

    DeepSpeed 0.19's ZeRO optimizers close a backward in ``clear_backward_seen_flag()``, called at the start of the
    *next* ``engine.forward`` (so that every phase of a reentrant-checkpointed backward sees the same state). ZeRO-3
    increments ``micro_step_id`` there, and ``partition_grads`` copies instead of accumulating while it is 0; ZeRO-1/2
    drop the previous backward's ``grad_accum`` there. Under Lightning all micro-batches of a step run inside one
    ``engine.forward`` (``Strategy.training_step`` goes through ``_forward_redirection``), so the module calls this
    before each ``manual_backward``: the engine then sees exactly the sequence of a plain ``forward, backward,
    forward, backward, step`` loop. Before the first backward of a step it changes nothing (no backward ran since
    ``engine.forward`` / ``zero_grad``). No-op for an engine without a ZeRO optimizer.

    Args:
        engine: the ``deepspeed.DeepSpeedEngine`` (``trainer.model`` under Lightning's ``DeepSpeedStrategy``).
    """
    from deepspeed.runtime.base_optimizer import ZeROOptimizer

    if isinstance(engine.optimizer, ZeROOptimizer):
        engine.optimizer.clear_backward_seen_flag()


def release_gathered_params(engine: Any) -> None:
    """After an update, before anything gathers the parameters outside a forward (a weight push): under ZeRO-3 wait
    for the parameters DeepSpeed's coordinator prefetched and partition every gathered one again
    (``DeepSpeedEngine.empty_partition_cache``).

    Under Lightning a whole RL step runs inside one ``engine.forward``, so the coordinator prefetches by the trace of
    the step's many passes and can leave parameters in flight when the update ends; ``GatheredParameters`` skips
    those and then fails to partition them ("Cannot partition a param in flight"). The next forward gathers what it
    needs again. Call it under ZeRO-3 only.

    Args:
        engine: the ``deepspeed.DeepSpeedEngine`` (``trainer.model`` under Lightning's ``DeepSpeedStrategy``).
    """
    engine.empty_partition_cache()


def release_for_push(trainer: Any) -> None:
    """Before anything that may push the weights (a push gathers every parameter outside a forward): under ZeRO-3,
    ``release_gathered_params`` of the trainer's engine, on the rank that calls it (every rank calls it: each joins
    the push's gathers). A fleet pushes inside ``training_step`` too, i.e. inside ``DeepSpeedEngine.forward``, where
    the prefetch leaves parameters in flight (its first batch's push, the push to an engine restarted mid-batch).
    Nothing without ZeRO-3."""
    if is_zero3(trainer):
        release_gathered_params(trainer.model)


def check_rollout_backend(zero3: bool, world_size: int, backend: RolloutBackend) -> None:
    """Refuse the transformers rollout engine under ZeRO-3 with several ranks.

    Under ZeRO-3 every forward of the actor all-gathers its parameters, a collective all ranks must join. The
    transformers engine decodes with the actor itself, and ranks stop decoding after different numbers of tokens
    (their samples end at different lengths, their tool calls return at different times): a rank that is done waits
    in the next collective while another still gathers for its decode step, and the run hangs.

    Raises:
        ValueError: ``model.rollout`` is ``HFRollout`` with ZeRO-3 and ``world_size > 1``.
    """
    if zero3 and world_size > 1 and isinstance(backend, HFRollout):
        raise ValueError(
            f"model.rollout=HFRollout with DeepSpeed ZeRO-3 on {world_size} ranks: the transformers engine decodes "
            "with the partitioned actor, every decode step all-gathers its parameters, and ranks decode different "
            "numbers of steps, so the run would deadlock. Fix: set model.rollout.class_path: "
            "zerotir.config.VLLMRollout (a separate engine per rank, weights synced after each update), or use "
            "ZeRO-2 (configs/deepspeed/zero2.json) or one rank."
        )


def check_fit_setup(trainer: Any, dtype: str, max_grad_norm: float, optimizer: str) -> None:
    """Before a fit loads anything: ``check_half_precision``, and under DeepSpeed ``check_deepspeed_config``."""
    check_half_precision(dtype, is_deepspeed(trainer))
    if is_deepspeed(trainer):
        check_deepspeed_config(trainer.strategy.config, max_grad_norm, optimizer)


def check_half_precision(dtype: str, deepspeed: bool) -> None:
    """Refuse ``model.base.dtype`` bfloat16 / float16 for training without DeepSpeed.

    Plain AdamW on half-precision parameters adds each update to weights that keep 8 (bf16) or 11 (fp16) bits of
    mantissa: at RL's learning rates most updates round away (measured: 1.9% of the weights moved after 10 steps
    at lr 1e-6, against 99.99% in float32). DeepSpeed's bf16 / fp16 modes keep fp32 master weights and step those.

    Raises:
        ValueError: a half-precision ``dtype`` and no DeepSpeed strategy, naming both fixes.
    """
    if dtype in ("bfloat16", "float16") and not deepspeed:
        raise ValueError(f"model.base.dtype={dtype} without DeepSpeed: the optimizer would step the {dtype} weights "
                         "themselves and round most RL-sized updates away. Set model.base.dtype: float32 (with "
                         "trainer.precision: bf16-mixed to compute in bfloat16), or train with a DeepSpeed strategy "
                         "(trainer.strategy: configs/deepspeed/*.json with \"bf16\": {\"enabled\": true}), which "
                         "keeps fp32 master weights")


def count_skipped_step(optimizer: Any) -> None:
    """Advance Lightning's optimizer-step count for a step that is not taken.

    Under manual optimization Lightning counts ``LightningOptimizer.step()`` calls through the hooks it injects
    around the real step (``_on_before_step`` / ``_on_after_step``; ``trainer.global_step`` is that count). Calling
    the hooks without the step keeps ``global_step``, ``max_steps`` and ``every_n_train_steps`` in line with the RL
    step while the DeepSpeed engine is left alone.
    """
    optimizer._on_before_step()
    optimizer._on_after_step()
