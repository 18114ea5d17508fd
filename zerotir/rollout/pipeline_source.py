"""The asynchronous pipeline's rollout source (``model.pipeline.max_staleness`` set): the batches of the next steps
are generated ahead by a ``RolloutProducer`` (``zerotir.rollout.producer``: a thread with an engine and weights of
its own), under the capacity rule, while the trainer updates on this one.

The source's engine keeps its own weights (``own_weights``: a frozen copy of the actor for transformers, the vLLM
engine on ``model.pipeline.producer_device``). The producer starts with the first training batch a run asks for (the
first of a run, or the first unconsumed one on a resume), with the weights of the updates done so far, and takes the
engine over: from then on evaluation batches run on it too (after its batch in flight) and every update's weights
are pushed into it between two of its steps. Before that (a sanity check, ``validate``) the source rolls out in line.
Torch's thread count is process-wide: the producer's ``model.pipeline.threads`` hold from its start to ``close``.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from zerotir.config import PipelineConfig, RolloutBackend, SamplingConfig, SandboxConfig, ToolConfig
from zerotir.rl.staleness import check_staleness, staleness_stats
from zerotir.rollout.agent_loop import Reward
from zerotir.rollout.engine import SamplingParams
from zerotir.rollout.producer import RolloutProducer
from zerotir.rollout.source import EngineSource, RolloutBatch, Stream, batch_seed, sampling_params
from zerotir.types import PromptRow

log = logging.getLogger(__name__)


class PipelineSource(EngineSource):
    """Rollouts through the pipeline's producer (see the module doc); the ``RolloutSource`` of a pipelined run.

    Args:
        pipeline: the ``model.pipeline`` group (``max_staleness`` set).
        The others: as ``EngineSource``'s.
    """

    def __init__(self, pipeline: PipelineConfig, backend: RolloutBackend, sandbox: SandboxConfig, tool: ToolConfig,
                 sampling: SamplingConfig, reward: Reward | None, model_path: str, seed: int):
        self.threads = pipeline.threads or max(1, len(os.sched_getaffinity(0)) // 2)  # process-wide, from the start
        super().__init__(backend, sandbox, tool, sampling, reward, model_path, seed,
                         engine_device=pipeline.producer_device, own_weights=True, engine_threads=self.threads)
        self.pipeline = pipeline
        self.producer: RolloutProducer | None = None
        self._stream: Stream | None = None
        self._devices: tuple[Any, ...] = ()  # the trainer's and the engine's, synchronized around a push
        self._threads_before: int | None = None  # torch's thread count before the producer set its own

    def check_trainer(self, world_size: int, zero3: bool) -> None:
        """The producer serves one trainer process and copies whole parameters."""
        if world_size > 1:
            raise ValueError(f"model.pipeline.max_staleness={self.pipeline.max_staleness} with {world_size} training "
                             "processes: the in-process producer serves one trainer process; run the pipeline on "
                             "the rollout fleet (model.fleet.engines >= 1), which serves every rank, set "
                             "max_staleness: null, or train on one device")
        if zero3:
            raise ValueError("model.pipeline.max_staleness with DeepSpeed ZeRO-3: the in-process producer's copy of "
                             "the weights needs whole parameters; run the pipeline on the rollout fleet "
                             "(model.fleet.engines >= 1), use ZeRO stage 1 / 2, or max_staleness: null")

    def start(self, actor: nn.Module, tokenizer: PreTrainedTokenizerBase, device: Any, stream: Stream | None) -> None:
        super().start(actor, tokenizer, device, stream)
        self._stream, self._devices = stream, (device, self.engine_device or device)

    def batch(self, step: int, rows: list[PromptRow], first_row: int) -> RolloutBatch:
        """The producer's next batch, for ``step`` (starting the producer at the first one; ``step`` again: a refill
        batch of it); it must hold the prompts the loader gave, and its tokens must be within ``max_staleness``
        versions."""
        if self.producer is None:
            self._start_producer(step, rows[0]["batch_index"], first_row)
        produced = self.producer.take(step)
        same_rows = [r["id"] for r in produced.rows] == [r["id"] for r in rows]
        if produced.batch_index != rows[0]["batch_index"] or not same_rows:
            raise RuntimeError(f"step {step}: the producer generated batch {produced.batch_index} but the loader gave "
                               f"batch {rows[0]['batch_index']}; the training stream and the producer disagree")
        traj = produced.rollout
        check_staleness(staleness_stats(traj.versions, traj.action_mask, step), step, self.pipeline.max_staleness)
        return RolloutBatch(produced.rows, traj, produced.timings, self.sandbox.names)

    def evaluate(self, rows: list[PromptRow], params: SamplingParams) -> RolloutBatch:
        """On the producer's engine once it runs (after its batch in flight, with the latest weights), else in line."""
        if self.producer is None:
            return super().evaluate(rows, params)
        traj, timings = self.producer.evaluate([r["prompt_ids"] for r in rows], [r["answer"] for r in rows], params)
        return RolloutBatch(rows, traj, timings, self.sandbox.names)

    def after_update(self, actor: nn.Module, version: int) -> float:
        """The new weights into the producer's engine between two of its steps, as ``version``; in line before the
        producer starts."""
        if self.producer is None:
            return self.load_weights(actor)
        return self.producer.push(lambda engine: engine.load_weights_from(actor), version)

    def _start_producer(self, step: int, batch_index: int, first_row: int) -> None:
        """Start the producer at ``step`` (its batch is ``batch_index``), its engine holding version ``step - 1``."""
        if self._stream is None:
            raise ValueError("model.pipeline.max_staleness: the producer reads the batches of the next steps from "
                             "zerotir's PromptDataModule (train_batch); use it as the run's datamodule")
        pipeline, threads = self.pipeline, self.threads
        self._threads_before = torch.get_num_threads()
        torch.set_num_threads(threads)
        n = self.sampling.n
        self.producer = RolloutProducer(
            self.engine, self._tokenizer, self.tool, self.schedule, self.reward, self.sandbox.client_factory(),
            self._stream, lambda b: sampling_params(self.sampling, batch_seed(self.seed, b, first_row, n)),
            pipeline.max_staleness, pipeline.producer_timeout, step, batch_index, step - 1, self._devices)
        self.producer.start()
        log.info("rollout producer started at step %d (batch %d, weights version %d, max_staleness %d, %d torch "
                 "threads)", step, batch_index, step - 1, pipeline.max_staleness, threads)

    def close(self) -> None:
        """Stop the producer (its rollout in flight ends at its next engine step), restore torch's threads, then
        the engine and the sandbox."""
        if self.producer is not None:
            self.producer.close()
            self.producer = None
        if self._threads_before is not None:
            torch.set_num_threads(self._threads_before)
            self._threads_before = None
        super().close()
