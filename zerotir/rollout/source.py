"""Where a training step's rollouts come from: one interface, one implementation per mode.

    source.start(actor, tokenizer, device, stream)   before the first rollout (the tools, the engine, its weights)
    source.batch(step)                               the step's next batch of the stream, rolled out and scored
    source.evaluate(rows, params)                    an evaluation batch, on the same engine
    source.after_update(actor, version)              the new weights, as ``version`` (updates done); seconds taken
    source.stats()                                   its own counters for the step's metrics (the fleet's)
    source.close()                                   stop everything it started

The source owns the training stream (``TrainStream``, the run's ``PromptDataModule``): ``batch`` reads the
step's next batch, and again for a refill round, and returns the rows this rank trains and every rank's consumed
``(batch index, position)`` pairs, the data position the module records. ``InlineSource``
(``model.hosts.max_staleness: null``) generates each step's batch when the step asks for it, on the trainer's
engine with the trainer's weights. ``zerotir.fleet.source.FleetSource`` hands out the batches engine
hosts with weights of their own generated ahead, under the capacity rule: one in a thread of the trainer's process
(``model.hosts`` alone) or Ray actors (``model.hosts``). ``zerotir.sources.make_rollout_source`` picks one from
the ``model.hosts`` and ``model.hosts`` groups; nothing outside the sources asks which mode runs.

What both share lives in ``EngineSource``: the run's tools (a ``Toolbox`` built and started once, at ``start``, and
closed at ``close``: the python tool reaches or starts its sandbox there), the engine (built by the typed factory
``engines.create_engine`` from the ``model.rollout`` group; the engine owns how new weights reach it,
``load_weights_from``) and the tensor-parallel group of a sharded vLLM engine (``tp_group``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from zerotir.config import RolloutBackend, SamplingConfig, SandboxConfig, ToolConfig
from zerotir.rollout.agent_loop import Schedule, rollout_sync
from zerotir.rollout.engine import RolloutEngine, SamplingParams
from zerotir.lora import is_adapted, log_weight_path
from zerotir.rollout.engines import check_engine_fits, create_engine
from zerotir.rewards.protocol import Reward
from zerotir.rollout.scoring import EarlyScores, score_trajectories
from zerotir.rollout.tp_group import TensorParallelGroup, own_trajectories
from zerotir.parallel.deepspeed_setup import check_rollout_backend
from zerotir.parallel.distributed import fail_together, rank_and_world_size, shard_prompts
from zerotir.tools.python import sandbox_urls
from zerotir.tools.registry import Toolbox
from zerotir.types import PromptRow, Trajectories

log = logging.getLogger(__name__)


class TrainStream(Protocol):
    """The run's training stream as a rollout source reads it (``zerotir.data.datamodule.PromptDataModule``)."""

    prompts_per_step: int  # P, the prompts of a batch (every rank's)

    def train_batches(self, steps_take: str) -> Iterator[list[PromptRow]]:
        """The global batches in order from the first not consumed, as steps taking the stream as ``steps_take``
        train them (``RolloutSource.steps_take``)."""
        ...

    def train_batch(self, batch_index: int) -> list[PromptRow]:
        """The rows of batch ``batch_index`` no step consumed yet (an engine host reads ahead by index)."""
        ...


@dataclass
class RolloutBatch:
    """One batch of scored trajectories and what it stands for.

    Attributes:
        rows: the prompt rows the trajectories' group ids index (an evaluation batch of a tensor-parallel group:
            the group's merged rows).
        trajectories: scored, with ``versions`` (B, T) stamped: the weight version of every sampled token.
        timings: seconds per phase (generation, sandbox, reward; the pipeline's waits).
        sandbox: the sandbox the code ran on (its URLs), named when it fails.
        taken: the stream rows ``(batch index, position)`` a training batch consumed, every rank's (streaming takes
            prompt groups as they end, from several batches); [] for an evaluation batch.
    """

    rows: list[PromptRow]
    trajectories: Trajectories
    timings: dict[str, float] = field(default_factory=dict)
    sandbox: list[str] = field(default_factory=list)
    taken: list[tuple[int, int]] = field(default_factory=list)


class RolloutSource(Protocol):
    """What the module asks of a rollout source (see the module doc).

    Attributes:
        steps_take: how its steps take the training stream (``zerotir.data.stream.Consumption.STEPS``): "batch",
            the next batch when the step asks; "ahead", the batches generated ahead, in order; "rows", prompt groups
            of several batches as they end (``RolloutBatch.taken``).
    """

    steps_take: str

    def check_trainer(self, world_size: int, zero3: bool) -> None:
        """Refuse a trainer this source cannot serve (before any model loads), naming the fix."""
        ...

    def start(self, actor: nn.Module, tokenizer: PreTrainedTokenizerBase, device: Any,
              stream: TrainStream | None) -> None:
        """Start the tools (the python tool's sandbox), build the engine and give it ``actor``'s weights; idempotent.
        ``stream``: the run's training stream (None: no ``PromptDataModule``, nothing to train on)."""
        ...

    def batch(self, step: int) -> RolloutBatch:
        """The next batch of the stream for RL step ``step``, scored: the rows this rank trains, their
        trajectories (samples seeded by the rows' place in the stream, ``batch_seed``) and every rank's consumed rows
        (``taken``). With refill (``model.filters.refill``) a step asks again, for the next batch of the stream."""
        ...

    def evaluate(self, rows: list[PromptRow], params: SamplingParams) -> RolloutBatch:
        """An evaluation batch with the latest weights."""
        ...

    def after_update(self, actor: nn.Module, version: int) -> float:
        """The weights of ``actor`` after an update, as ``version`` (updates done); returns the seconds it took."""
        ...

    def stats(self) -> dict[str, float]:
        """The source's own counters for the step's metrics (``pipeline/<key>``); {} where it has none."""
        ...

    def close(self) -> None:
        """Stop what ``start`` started; idempotent."""
        ...


def batch_seed(seed: int, batch_index: int, first_row: int, n: int) -> int:
    """The rollout seed of training batch ``batch_index`` of the stream for the rank whose share starts at row
    ``first_row``: ``seed + batch_index + 1 + first_row * n`` (trajectory ``k`` of the share then samples with that
    + k, the seed of its global row on any number of ranks). Seeded by the data, not the step: with refill a step
    generates several batches, each with its own seed, the same again on a resume; without refill step k generates
    batch k - 1, so its seed is ``seed + k`` (+ the row offset)."""
    return seed + batch_index + 1 + first_row * n


def rank_share(batch: list[PromptRow], tensor_parallel_size: int) -> tuple[list[PromptRow], int]:
    """This rank's share of a step's global batch (``shard_prompts``' contiguous share; all of it on one process)
    and the index in the batch of its first row: the rollout seeds trajectory ``k`` of the share with ``seed + k``,
    so that offset makes every trajectory's seed that of its global row (the same with 1 or N ranks)."""
    tp, (rank, world) = tensor_parallel_size, rank_and_world_size()
    if tp > 1 and len(batch) % world:
        raise ValueError(f"data.prompts_per_step={len(batch)}: with tensor-parallel engines (tensor_parallel_size="
                         f"{tp}) every rank trains on an equal share, so set it to a multiple of devices x "
                         f"num_nodes = {world}")
    return shard_prompts(batch, rank, world, tp), rank // tp * (len(batch) // (world // tp))


def sampling_params(sampling: SamplingConfig, seed: int) -> SamplingParams:
    """The engine's parameters of a ``model.sampling`` / ``model.eval.sampling`` group, with ``seed``."""
    return SamplingParams(n=sampling.n, temperature=sampling.temperature, top_p=sampling.top_p,
                          max_new_tokens=sampling.max_response_tokens, seed=seed)


class EngineSource:
    """The tools, the engine and the tensor-parallel group of a source, with the in-line rollout on them.

    Args:
        backend: the ``model.rollout`` group (the engine and its settings).
        sandbox: the ``model.tool.sandbox`` group (where the python tool's code runs).
        tool: the ``model.tool`` group (the tools, built once at ``start``).
        sampling: the ``model.sampling`` group (training rollouts).
        reward: the ``model.reward`` plug-in, scoring each trajectory as it finishes (``EarlyScores``).
        model_path: the HF folder a separate engine loads at start.
        seed: the run's seed: the engine's own, and the base of every training batch's (``batch_seed``).
    """

    def __init__(self, backend: RolloutBackend, sandbox: SandboxConfig, tool: ToolConfig, sampling: SamplingConfig,
                 reward: Reward | None, model_path: str, seed: int):
        self.backend, self.tool, self.sampling, self.reward = backend, tool, sampling, reward
        self.model_path, self.seed = model_path, seed
        if sandbox != tool.sandbox:  # the group given is where the python tool's code runs
            self.tool = replace(tool, sandbox=sandbox)
        self.toolbox: Toolbox | None = None  # built and started by start, closed by close
        self.schedule = Schedule(backend.schedule, backend.round_tokens)
        self.engine: RolloutEngine | None = None
        self.tp_group = TensorParallelGroup(1)  # the ranks sharing this rank's engine: built by start
        self.stream: TrainStream | None = None  # the training stream: given by start
        self._batches: Iterator[list[PromptRow]] | None = None  # the stream as in-line steps read it (first batch)
        self._tokenizer: PreTrainedTokenizerBase | None = None

    def check_trainer(self, world_size: int, zero3: bool) -> None:
        """An engine on every rank: the transformers engine decodes with the actor itself, which under ZeRO-3 on
        several ranks deadlocks (``check_rollout_backend``)."""
        check_rollout_backend(zero3, world_size, self.backend)

    def start(self, actor: nn.Module, tokenizer: PreTrainedTokenizerBase, device: Any,
              stream: TrainStream | None) -> None:
        """The tools (built once; the python tool reaches or starts its sandbox), then the engine with ``actor``'s
        weights; ``stream`` (the training stream) kept. Each phase is
        a collective under a process group (``fail_together``): a tool or sandbox that fails on one rank, too little
        free memory on one rank's GPU or an engine that fails to build on one rank stops every rank with that rank's
        error, instead of leaving the others waiting in their next collective (the memory check runs on every rank
        before any builds, as vLLM's own start-up all-reduces memory figures over the ranks)."""
        if self.engine is not None:
            return
        self.stream = stream
        with fail_together(Exception):
            self._start_tools()
            check_engine_fits(self.backend, device)
        self.tp_group = TensorParallelGroup(self.backend.tensor_parallel_size)
        engine = None
        with fail_together(Exception):
            engine = create_engine(self.backend, actor, tokenizer, device, self.model_path, self.seed)
        self.engine, self._tokenizer = engine, tokenizer
        if is_adapted(actor):  # a LoRA run: how the actor's weights reach the engine, said at start
            log_weight_path(engine.adapter_path(actor), f"the in-line {type(engine).__name__}")
        engine.load_weights_from(actor)  # a resumed actor, or a separate engine loaded from model_path

    def _start_tools(self) -> None:
        """The run's toolbox, built and started once (a retried start builds it again only after a failure)."""
        if self.toolbox is None:
            toolbox = Toolbox.build(self.tool)
            toolbox.start()  # closes what it started before raising
            self.toolbox = toolbox

    @property
    def sandbox_names(self) -> list[str]:
        """Where the python tool's code runs (its sandbox's URLs), named when it fails; [] without it."""
        return sandbox_urls(self.toolbox) if self.toolbox is not None else []

    def roll_out(self, rows: list[PromptRow], params: SamplingParams) -> tuple[Trajectories, dict[str, float]]:
        """The tool loop over ``rows`` on this source's engine, each trajectory scored as it finishes and the rest
        after (``EarlyScores``, ``score_trajectories``). A
        collective of the tensor-parallel group: its leader runs the loop and the other ranks replay its engine
        calls; all return the leader's trajectories."""
        if self.engine is None:
            raise RuntimeError("rollout before the source started (RolloutSource.start)")
        prompts, truths = [r["prompt_ids"] for r in rows], [r["answer"] for r in rows]
        early = EarlyScores(self.reward, rows, self._tokenizer)  # each trajectory scored as it finishes
        try:
            traj, timings = self.tp_group.rollout(self.engine, lambda engine: rollout_sync(
                engine, self._tokenizer, None, prompts, params, self.tool, truths, self.schedule,
                tools=self.toolbox, on_end=early.finished))
        except BaseException:
            early.cancel()
            raise
        timings["reward"] = score_trajectories(self.reward, traj, rows, early)
        return traj, timings

    def evaluate(self, rows: list[PromptRow], params: SamplingParams) -> RolloutBatch:
        """An evaluation batch in line. With a tensor-parallel engine the group first merges its ranks' rows (their
        validation samplers give each rank other rows), rolls them out together and each rank keeps its own."""
        group_rows, own = self.tp_group.share_rows(rows)
        traj, timings = self.roll_out(group_rows, params)
        traj = own_trajectories(traj, own, len(group_rows), params.n)  # group ids index ``group_rows``
        return RolloutBatch(group_rows, traj, timings, self.sandbox_names)

    def load_weights(self, actor: nn.Module) -> float:
        """``actor``'s weights into this source's engine, in line; the seconds it took."""
        start = time.perf_counter()
        self.engine.load_weights_from(actor)
        return time.perf_counter() - start

    def stats(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.close()  # now, not whenever the garbage collector gets to it (EngineWeights.close)
        toolbox, self.toolbox = self.toolbox, None
        if toolbox is not None:
            toolbox.close()


class InlineSource(EngineSource):
    """Each step's batch generated when the step asks, with the trainer's current weights (version ``step - 1``)."""

    steps_take = "batch"  # RolloutSource.steps_take

    def batch(self, step: int) -> RolloutBatch:
        if self.stream is None:
            raise ValueError("training reads its prompts from zerotir's PromptDataModule (the stream of data."
                             "train_files); use it as the run's datamodule")
        if self._batches is None:  # at the first batch: a resumed run's data position is loaded by now
            self._batches = self.stream.train_batches(self.steps_take)
        batch = next(self._batches)
        rows, first_row = rank_share(batch, self.tp_group.size)
        params = sampling_params(self.sampling, batch_seed(self.seed, rows[0]["batch_index"], first_row,
                                                           self.sampling.n))
        traj, timings = self.roll_out(rows, params)
        self.engine.rest()  # until after_update: the update may have its memory
        traj.versions = torch.where(traj.action_mask, step - 1, -1)
        if self.tp_group.shared:  # the ranks of an engine rolled out the same prompts: each trains on its share
            traj = traj.select(self.tp_group.training_share(traj.group_ids))
        taken = [(row["batch_index"], row["position"]) for row in batch]
        return RolloutBatch(rows, traj, timings, self.sandbox_names, taken)

    def after_update(self, actor: nn.Module, version: int) -> float:
        return self.load_weights(actor)
