"""Validation and test of a ZeroTIR run: gather per-trajectory records per benchmark, then compute the metrics
(``zerotir.eval.report``), write a JSON + Markdown report per benchmark and a summary, and log the curves to every
logger at the RL step.

The rollouts themselves go through the module's training rollout path (same engine, same tool loop, same reward),
only with the evaluation sampling settings.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_info

from zerotir.eval import report as evaluation
from zerotir.parallel.distributed import gather_objects
from zerotir.types import Trajectories


class EvalAccumulator:
    """Records of one validation / test epoch, per dataloader (one dataloader = one benchmark)."""

    def __init__(self) -> None:
        self.records: dict[int, list[evaluation.EvalRecord]] = defaultdict(list)

    def reset(self) -> None:
        self.records = defaultdict(list)

    def add(self, dataloader_idx: int, traj: Trajectories, problem_ids: list[str]) -> None:
        """Add a scored batch; ``problem_ids[g]`` is the id of the prompt with group id ``g``."""
        self.records[dataloader_idx].extend(evaluation.records_from_trajectories(traj, problem_ids))

    def results(self, names: list[str]) -> dict[str, dict[str, float]]:
        """Benchmark name -> metrics, for every dataloader that produced records on any rank (a collective call when
        data-parallel: every rank evaluates its share of each benchmark)."""
        merged: dict[int, list[evaluation.EvalRecord]] = defaultdict(list)
        for rank_records in gather_objects(dict(self.records)):
            for idx, records in rank_records.items():
                merged[idx].extend(records)
        out = {}
        for idx, records in sorted(merged.items()):
            if idx >= len(names):
                raise IndexError(f"evaluation dataloader {idx} has no name (names: {names})")
            if records:
                out[names[idx]] = evaluation.benchmark_metrics(records)
        return out

    def finish(self, module: Any, split: str, names: list[str], out_dir: Path, meta: dict[str, Any],
               step: int) -> dict[str, dict[str, float]]:
        """Compute, report and log the epoch's metrics at RL step ``step``; returns them (empty when nothing was
        evaluated).

        Reports go to ``out_dir``: ``<split>[_step<k>]_<name>`` (.json / .md) per benchmark and
        ``<split>[_step<k>]_summary`` for all of them; ``meta`` (run details) is kept with the numbers.
        """
        trainer = module.trainer
        if trainer.sanity_checking:
            self.reset()
            return {}
        results = self.results(names)
        if not results:
            return {}
        scalars = evaluation.tensorboard_scalars(results)
        for name, value in scalars.items():
            module.log(name, value, logger=False, add_dataloader_idx=False, batch_size=1)
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(scalars, step=step)
            prefix = split if split == "test" else f"{split}_step{step}"
            meta = dict(meta, split=split, rl_step=step, ckpt_path=trainer.ckpt_path)
            for name, metrics in results.items():
                evaluation.write_report({name: metrics}, out_dir, meta, stem=f"{prefix}_{name}")
            json_path, _ = evaluation.write_report(results, out_dir, meta, stem=f"{prefix}_summary")
            rank_zero_info(f"{split} reports written to {json_path.parent}\n{evaluation.markdown_table(results)}")
        self.reset()
        return results
