"""The paper's Figure-4 statistics, written once per RL step: rollout behaviour, update statistics and time split.

What it reads: the ``StepResult`` (``zerotir.rl.step``) that ``training_step`` returns, as ``outputs["step"]`` of
``on_train_batch_end``: its ``rl_step`` (the x axis of every tag here), ``rollout`` (all trajectories of the step,
scored, *before* pass-rate filtering), ``timings`` (seconds per phase: generation, sandbox, reward, update,
weight_sync, step; with the asynchronous pipeline also wait_for_rollout and wait_for_trainer), ``pipeline`` (the
batch's staleness), ``refill`` (how the batch was filled: generation rounds, prompts consumed, ...), ``filter`` (the
decision: each removal rule's share of the trajectories, ``filter/<name>_fraction``) and ``stats`` (kl, entropy,
policy_loss, value_loss, clip_fraction, grad_norm, lr; empty when the update was skipped). It logs
them under the names of ``zerotir.metric_names``. Keys outside those lists are logged as ``time/<key>`` and
``train/<key>``, never dropped. The callback only observes: no loss math here.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger

from callbacks.logging_utils import log_scalars
from zerotir import metric_names as mn
from zerotir.choice_metrics import choice_metrics
from zerotir.eval.text_metrics import repeat_score
from zerotir.rl.step import StepResult
from zerotir.tools.stats import tool_metrics
from zerotir.types import Trajectories

TIMING_NAMES = {
    "generation": mn.TIME_GENERATION,
    "sandbox": mn.TIME_SANDBOX,
    "reward": mn.TIME_REWARD,
    "update": mn.TIME_UPDATE,
    "weight_sync": mn.TIME_WEIGHT_SYNC,
    "step": mn.TIME_STEP,
    "wait_for_rollout": mn.TIME_WAIT_ROLLOUT,
    "wait_for_trainer": mn.TIME_WAIT_TRAINER,
}
PIPELINE_NAMES = {"staleness_mean": mn.STALENESS_MEAN, "staleness_max": mn.STALENESS_MAX,
                  "fleet_restarts": mn.FLEET_RESTARTS, "push_mb": mn.PUSH_MB, "fleet_busy": mn.FLEET_BUSY,
                  "fleet_fill": mn.FLEET_FILL, "fleet_regenerated": mn.FLEET_REGENERATED,
                  "fleet_spread": mn.FLEET_SPREAD}
REFILL_NAMES = {
    "generation_rounds": mn.GENERATION_ROUNDS,
    "prompts_consumed": mn.PROMPTS_CONSUMED,
    "exhausted_steps": mn.EXHAUSTED_STEPS,
    "empty_steps_in_a_row": mn.EMPTY_STEPS_IN_A_ROW,
}
UPDATE_NAMES = {
    "kl": mn.KL,
    "entropy": mn.ENTROPY,
    "policy_loss": mn.POLICY_LOSS,
    "value_loss": mn.VALUE_LOSS,
    "clip_fraction": mn.CLIP_FRACTION,
    "dual_clip_fraction": mn.DUAL_CLIP_FRACTION,
    "grad_norm": mn.GRAD_NORM,
    "lr": mn.LEARNING_RATE,
    "engine_logprob_diff": mn.ENGINE_LOGPROB_DIFF,
    "is_ratio_mean": mn.IS_RATIO_MEAN,
    "is_capped_fraction": mn.IS_CAPPED_FRACTION,
    "is_weight_mean": mn.IS_WEIGHT_MEAN,
}


def _ratio(numerator: torch.Tensor, denominator: torch.Tensor) -> float:
    """numerator.sum() / denominator.sum(), 0.0 when the denominator is 0 (e.g. no executions: no errors)."""
    den = float(denominator.sum().item())
    return float(numerator.sum().item()) / den if den > 0 else 0.0


def rollout_metrics(batch: Trajectories, repeat_ngram: int | None = None) -> dict[str, float]:
    """Rollout statistics of one RL step, keyed by ``zerotir.metric_names``.

    Means are over trajectories; the execution rates are per call (errors / calls, 0 when no tool was called);
    tool-in-correct is the share of correct trajectories that called a tool, any tool (0 when none is correct). The
    repeat score is the mean of ``repeat_score(text, repeat_ngram)`` over the response texts.

    Args:
        batch: the scored trajectories of the step (before filtering), with one response text per row.
        repeat_ngram: passed to ``repeat_score`` (None: all substring lengths, as in the paper's code).

    Returns:
        One float per rollout tag of ``metric_names`` (the calls histogram aside), and the per-tool tags of the tools
        called (``zerotir.tools.stats``).
    """
    size = len(batch)
    if size == 0:
        raise ValueError("rollout_metrics needs a non-empty batch (pass the rollout before pass-rate filtering)")
    if len(batch.response_texts) != size:
        raise ValueError(
            f"batch.response_texts has {len(batch.response_texts)} entries for {size} trajectories; "
            "the rollout must fill one decoded response per row"
        )
    correct, used = batch.correct, batch.used_tool
    calls = batch.num_calls
    metrics = {
        mn.REWARD_MEAN: float(batch.rewards.double().mean().item()),
        mn.ACCURACY: float(correct.double().mean().item()),
        mn.TOOL_CALL_RATE: float(used.double().mean().item()),
        mn.TOOL_IN_CORRECT: _ratio(correct & used, correct),
        mn.CALLS_PER_RESPONSE: float(calls.double().mean().item()),
        mn.RESPONSE_LENGTH: float(batch.response_lens.double().mean().item()),
        mn.REPEAT_SCORE: sum(repeat_score(text, repeat_ngram) for text in batch.response_texts) / size,
        mn.EXEC_ERROR_RATE: _ratio(batch.num_exec_errors, calls),
        mn.TIMEOUT_RATE: _ratio(batch.num_timeouts, calls),
        mn.SANDBOX_ERROR_RATE: _ratio(batch.num_sandbox_errors, calls),
        mn.TRUNCATION_RATE: float(batch.truncated.double().mean().item()),
        mn.TOOLS_INFRA_FAILED: float(batch.infra_failed.double().mean().item()),
    }
    buckets = (calls == 0, calls == 1, calls == 2, calls >= 3)
    for name, bucket in zip(mn.CORRECT_BY_CALLS, buckets):
        metrics[name] = float((correct & bucket).sum().item())
    metrics.update(tool_metrics(batch.tool_calls))  # tools/<name>/<metric>: one set per tool called
    return metrics


def filter_fractions(result: StepResult) -> dict[str, float]:
    """``filter/<name>_fraction``: the share of the step's trajectories (this rank's) that each removal rule of its
    decision matched (``FilterDecision.removed``); nothing without a decision or a rule."""
    removed = result.filter.removed if result.filter is not None else {}
    return {mn.FILTER_FRACTIONS.get(name, f"filter/{name}_fraction"): float(matched.double().mean().item())
            for name, matched in removed.items() if len(matched)}


def named_stats(stats: dict[str, float], names: dict[str, str], prefix: str) -> dict[str, float]:
    """Map the module's short keys to metric names; unknown keys become ``prefix/key``."""
    return {names.get(key, f"{prefix}/{key}"): float(value) for key, value in stats.items()}


class ScalingMetrics(Callback):
    """Log the rollout metrics, the calls histogram, the update statistics and the phase timings of each RL step.

    Args:
        repeat_ngram: n-gram length for the repeat score; None counts every substring length (the paper's measure).
        histogram: also write the calls-per-response histogram (needs a ``TensorBoardLogger``; others are skipped).
    """

    def __init__(self, repeat_ngram: int | None = None, histogram: bool = True) -> None:
        if repeat_ngram is not None and (not isinstance(repeat_ngram, int) or repeat_ngram < 1):
            raise ValueError(f"ScalingMetrics: repeat_ngram must be None or an int >= 1, got {repeat_ngram!r}")
        self.repeat_ngram = repeat_ngram
        self.histogram = histogram

    def step_metrics(self, result: StepResult) -> dict[str, float]:
        """All scalars of the step: rollout metrics, update statistics and timings."""
        metrics = rollout_metrics(result.rollout, self.repeat_ngram)
        metrics.update(choice_metrics(result.rollout, result.batch.kinds))  # tools/<tool>/first, kinds/<kind>/...
        metrics.update(named_stats(result.stats, UPDATE_NAMES, "train"))
        metrics.update(named_stats(result.timings, TIMING_NAMES, "time"))
        metrics.update(named_stats(result.pipeline, PIPELINE_NAMES, "pipeline"))
        metrics.update(named_stats(result.refill, REFILL_NAMES, "filter"))
        metrics.update(filter_fractions(result))
        metrics.update(result.data)  # data.curriculum's, named in full (data/stage, ...)
        return metrics

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        result: StepResult = outputs["step"]
        log_scalars(trainer, pl_module, self.step_metrics(result), result.rl_step)
        if self.histogram and trainer.is_global_zero:
            calls = result.rollout.num_calls.detach().cpu()
            for logger in trainer.loggers:
                if isinstance(logger, TensorBoardLogger):
                    logger.experiment.add_histogram(mn.CALLS_HIST, calls, global_step=result.rl_step)
        # As Lightning does after its own logging: each finished step reaches the disk (a live TensorBoard sees it;
        # a killed run keeps it; the CSV logger writes its rows).
        for logger in trainer.loggers:
            logger.save()
