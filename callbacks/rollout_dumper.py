"""Every rollout on disk, and a few of them in TensorBoard: what the model writes, step by step.

What it reads: the ``StepResult`` (``zerotir.rl.step``) that ``training_step`` (and ``validation_step`` /
``test_step``) return as ``outputs["step"]`` of ``on_*_batch_end``: its ``rl_step``, ``rollout`` (the scored
trajectories, before pass-rate filtering), ``batch`` (the prompt text, data id and source name of each group id,
and the ``weight_version``: how many updates the weights that generated it had seen) and ``filter`` (the decision:
each record names the rules that removed it, ``filtered_by``).

The callback only hands them to a background thread (``zerotir.rollout_log.writer``), which builds the records,
writes ``<dirpath>/step_<k>.jsonl.gz`` (``val_step_<k>`` / ``test_step_<k>`` for evaluations, one file for all
their batches), deletes the oldest files beyond ``keep_last`` and puts the best, the worst and a failed-execution
trajectory of the step in TensorBoard as Markdown text (``samples/best``, ``samples/worst``,
``samples/exec_error``; ``val_samples/...`` for validation; a ``TrackioLogger`` gets them too). A sampled share of
the trajectories (``token_samples`` per training step, ``eval_token_samples`` per evaluation) carries its tokens:
ids, text, log-probs of the engine and of the trainer, advantages, loss weights, weight versions and span kinds
(``zerotir.rollout_log.tokens``); on the training thread only those rows are copied to CPU. A step waits for the disk only when the writer is
``max_pending`` files behind. A failed write stops the run at the next step, with the cause; the queue is drained at
the end of every fit / validate / test and on an exception.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn

from zerotir.rollout_log import records as R
from zerotir.rollout_log import tokens as T
from zerotir.rollout_log.render import markdown_sample, pick_samples
from zerotir.rollout_log.trackio_logger import TrackioLogger
from zerotir.rollout_log.writer import BackgroundWriter
from zerotir.rl.step import StepResult

log = logging.getLogger(__name__)


class RolloutDumper(Callback):
    """Write each RL step's trajectories (and each evaluation's) to gzipped JSONL; show a few in TensorBoard.

    Args:
        enabled: False turns the callback off entirely (nothing written, no thread started).
        dirpath: the folder of the files; default ``<trainer.default_root_dir>/rollouts``.
        every_n_steps: write RL step k when k is a multiple of this (1: every step).
        keep_last: keep only the files of the latest this many steps per split (None: keep all).
        evaluation: also write validation and test rollouts.
        tensorboard_samples: put the best / worst / failed-execution trajectories of each written step in every
            ``TensorBoardLogger`` as Markdown text.
        max_pending: files that may wait for the disk before a step blocks on the writer.
        token_samples: trajectories of each training step written with their tokens (a sample seeded by the step;
            None: all of them; 0: none).
        eval_token_samples: the same per evaluation batch (None, the default: every evaluation trajectory).
    """

    def __init__(self, enabled: bool = True, dirpath: str | None = None, every_n_steps: int = 1,
                 keep_last: int | None = None, evaluation: bool = True, tensorboard_samples: bool = True,
                 max_pending: int = 4, token_samples: int | None = 4, eval_token_samples: int | None = None) -> None:
        if not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise ValueError(f"RolloutDumper: every_n_steps must be an int >= 1, got {every_n_steps!r}")
        if keep_last is not None and (not isinstance(keep_last, int) or keep_last < 1):
            raise ValueError(f"RolloutDumper: keep_last must be None (keep all) or an int >= 1, got {keep_last!r}")
        if not isinstance(max_pending, int) or max_pending < 1:
            raise ValueError(f"RolloutDumper: max_pending must be an int >= 1, got {max_pending!r}")
        for name, value in (("token_samples", token_samples), ("eval_token_samples", eval_token_samples)):
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"RolloutDumper: {name} must be None (every trajectory) or an int >= 0, got "
                                 f"{value!r}")
        self.token_samples = token_samples
        self.eval_token_samples = eval_token_samples
        self._tokenizer: Any = None
        self.enabled = enabled
        self.dirpath = dirpath
        self.every_n_steps = every_n_steps
        self.keep_last = keep_last
        self.evaluation = evaluation
        self.tensorboard_samples = tensorboard_samples
        self.max_pending = max_pending
        self.folder: Path | None = None
        self._writer: BackgroundWriter | None = None
        self._eval_parts: list[dict[str, Any]] = []

    # ----- lifecycle: one writer thread per fit / validate / test -----
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if not self.enabled:
            return
        self.folder = Path(self.dirpath) if self.dirpath else Path(trainer.default_root_dir) / "rollouts"
        self._tokenizer = pl_module.tokenizer  # decodes the sampled rows' tokens on the writer thread
        loggers = trainer.loggers
        if self.tensorboard_samples and not any(isinstance(lg, TensorBoardLogger) for lg in loggers):
            rank_zero_warn(f"RolloutDumper: tensorboard_samples needs a TensorBoardLogger, and the loggers are "
                           f"{[type(lg).__name__ for lg in loggers]}: the rollouts go to {self.folder} only (set "
                           "tensorboard_samples: false to say so)")
        if self._writer is None or not self._writer.alive:
            self._writer = BackgroundWriter(self.max_pending)

    def _close(self, raise_errors: bool = True) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close(raise_errors)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._close()

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.state.fn == TrainerFn.VALIDATING:
            self._close()  # the end of a validate run (inside fit the writer lives on)

    def on_test_end(self, trainer: Any, pl_module: Any) -> None:
        self._close()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Drain what is queued (the steps before the failure are on disk), without hiding the run's exception."""
        try:
            self._close()
        except Exception as error:  # noqa: BLE001 - the run's own exception propagates; this one is logged
            log.error("RolloutDumper: %s (while the run failed with %s)", error, type(exception).__name__)

    # ----- training -----
    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if not self.enabled:
            return
        result = _step_result(outputs, "training_step")
        if result.rl_step % self.every_n_steps == 0:
            part = _step_outputs(result, self.token_samples)
            self._submit(trainer, "train", part["step"], [part])

    # ----- evaluation: the batches of one run go into one file -----
    def _eval_batch_end(self, outputs: Any, hook: str) -> None:
        if self.enabled and self.evaluation:
            self._eval_parts.append(_step_outputs(_step_result(outputs, hook), self.eval_token_samples))

    def _eval_epoch_end(self, trainer: Any, pl_module: Any, split: str) -> None:
        parts, self._eval_parts = self._eval_parts, []
        if parts and not trainer.sanity_checking:
            self._submit(trainer, split, parts[-1]["step"], parts)

    def on_validation_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._eval_parts = []

    def on_test_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._eval_parts = []

    def on_validation_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        self._eval_batch_end(outputs, "validation_step")

    def on_test_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int,
                          dataloader_idx: int = 0) -> None:
        self._eval_batch_end(outputs, "test_step")

    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._eval_epoch_end(trainer, pl_module, "val")

    def on_test_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._eval_epoch_end(trainer, pl_module, "test")

    # ----- the job handed to the writer thread -----
    def _submit(self, trainer: Any, split: str, step: int, parts: list[dict[str, Any]]) -> None:
        if self._writer is None or self.folder is None:
            raise RuntimeError("RolloutDumper: no writer (the callback was not set up by the Trainer)")
        rank, world = trainer.global_rank, trainer.world_size
        path = self.folder / R.file_name(split, step, rank, world)
        writers = []
        if self.tensorboard_samples and trainer.is_global_zero:
            writers = [lg.experiment for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]
        trackers = [lg for lg in trainer.loggers if isinstance(lg, TrackioLogger)] if trainer.is_global_zero else []
        prefix = "samples" if split == "train" else f"{split}_samples"
        keep_last, folder, tokenizer = self.keep_last, self.folder, self._tokenizer

        def job() -> None:
            records = [r for part in parts for r in _part_records(part, tokenizer, step, split, rank)]
            for i, record in enumerate(records):  # one index over all batches of an evaluation
                record["index"] = i
            R.write_records(path, records)
            if keep_last is not None:
                R.prune(folder, split, keep_last)
            for kind, record in pick_samples(records).items():
                text = markdown_sample(record, f"{kind}, step {step}")
                for experiment in writers:
                    experiment.add_text(f"{prefix}/{kind}", text, global_step=step)
            for tracker in trackers:
                tracker.log_samples(prefix, step, pick_samples(records))

        self._writer.submit(job)


def _step_result(outputs: Any, hook: str) -> StepResult:
    """A step's ``outputs["step"]``, or a TypeError naming the hook that broke the protocol."""
    result = outputs.get("step") if isinstance(outputs, Mapping) else None
    if not isinstance(result, StepResult):
        got = sorted(outputs) if isinstance(outputs, Mapping) else type(outputs).__name__
        raise TypeError(f"RolloutDumper: `{hook}` must return {{'step': StepResult}} (see zerotir/rl/step.py); "
                        f"got {got}")
    return result


def _step_outputs(result: StepResult, token_samples: int | None) -> dict[str, Any]:
    """What the writer needs of a step (see the module doc); the token-sampled rows are copied to CPU here, on the
    training thread, so the job holds no reference to the step's device tensors beyond the rollout."""
    info = result.batch
    rows = T.pick_rows(len(result.rollout), token_samples, result.rl_step)
    return {"step": result.rl_step, "rollout": result.rollout, "prompts": info.prompts,
            "problem_ids": info.problem_ids, "sources": info.sources, "weight_version": info.weight_version,
            "removed": result.filter.removed if result.filter is not None else None,
            "tokens": T.capture(result, rows) if rows else None, "advantages": T.advantage_sums(result)}


def _part_records(part: dict[str, Any], tokenizer: Any, step: int, split: str, rank: int) -> list[dict[str, Any]]:
    """The records of one part (writer thread): ``trajectory_records`` with each row's advantage, and the tokens of
    the sampled rows."""
    records = R.trajectory_records(part["rollout"], part["prompts"], part["problem_ids"], part["sources"], step=step,
                                   split=split, weight_version=part["weight_version"], rank=rank,
                                   removed=part["removed"])
    for record, total in zip(records, part["advantages"]):  # the mean over the row's action tokens
        record["advantage"] = None if total is None else round(total / max(record["sampled_tokens"], 1), 4)
    captured = part["tokens"]
    if captured is not None:
        for j, row in enumerate(captured["rows"]):
            records[row]["tokens"] = T.token_fields(captured, j, tokenizer)
    return records
