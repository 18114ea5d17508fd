"""The rollout source of the fleet (``model.hosts.engines`` >= 1): each batch is rolled out by engine processes of
their own (Ray actors running ``EngineHost``), and every update's weights are broadcast to them over the weight
group (docs/fleet.md). Three parts, each of one idea, composed here: the engines (``fleet.hosts``: start, health,
restart and the calls made again), their weights (``fleet.weights``: the weight group, pushes, versions) and the
schedule (``fleet.schedule``: the capacity rule, the groups that have ended, staleness drops). The source scores
each prompt group on the trainer as it comes back from an engine, while the others generate (``EarlyScores``), and
checks the batch against the staleness bound. Rank 0 drives the fleet for every training rank
(``zerotir.fleet.ranks``). Each engine host builds and starts its tools once; where their python tool runs code is
the trainer's sandbox (``SandboxService``, started only when the tools include python), reached at its URLs, or
on a cluster of several nodes one server per node (``zerotir.fleet.sandboxes``), each engine reaching its node's.
Every wait is bounded by ``model.hosts.timeout_s``; an error names the engine, what it was doing and the step.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from zerotir.config import HostsConfig, RolloutBackend, SamplingConfig, SandboxConfig, ToolConfig
from zerotir.fleet.engine_host import HostSettings
from zerotir.fleet.hosts import FleetHosts
from zerotir.fleet.ranks import TrainerRanks, split_batch
from zerotir.fleet.schedule import FleetSchedule
from zerotir.fleet.shares import Submitted
from zerotir.fleet.transport import RayTransport, Transport
from zerotir.fleet.weight_group import WeightGroupError
from zerotir.lora import is_adapted, log_weight_path
from zerotir.rewards.protocol import Reward
from zerotir.rl.staleness import check_staleness, staleness_stats
from zerotir.rollout.engine import SamplingParams, pad_id
from zerotir.rewards.protocol import Reward
from zerotir.rollout.scoring import EarlyScores, score_trajectories
from zerotir.rollout.source import RolloutBatch, TrainStream
from zerotir.tools.python import sandbox_needed
from zerotir.tools.sandbox_service import SandboxService
from zerotir.types import PromptRow

log = logging.getLogger(__name__)


class FleetSource:
    """Rollouts on the fleet's engine processes (see the module doc); the ``RolloutSource`` of a fleet run: the
    engines (``FleetHosts``), their weights (``FleetWeights``) and the schedule (``FleetSchedule``) composed, the
    trajectories scored here.

    Args:
        fleet: the ``model.hosts`` group (``max_staleness`` set: the schedule; ``engines``: where the hosts run,
            with ``transport``).
        backend, sandbox, tool, sampling: the ``model.*`` groups of those names.
        reward: the ``model.reward`` plug-in, scoring on the trainer each prompt group as an engine returns it, while
            the others generate (``EarlyScores``, ``score_trajectories``).
        model_path: the HF folder every engine process loads.
        seed: the run's seed (training batch b samples with ``batch_seed``).
        transport: how the hosts run (``zerotir.fleet.transport``); None: Ray actors.
        dtype: the run's ``model.base.dtype``: the dtype of a transformers engine host's own copy of the actor.
    """

    def __init__(self, fleet: HostsConfig, backend: RolloutBackend, sandbox: SandboxConfig, tool: ToolConfig,
                 sampling: SamplingConfig, reward: Reward | None, model_path: str, seed: int,
                 transport: Transport | None = None, dtype: str = "float32"):
        if 0 < fleet.max_in_flight < sampling.n:
            raise ValueError(f"model.hosts.max_in_flight={fleet.max_in_flight} with model.sampling.n={sampling.n}: a "
                             f"prompt group streams whole; set max_in_flight >= {sampling.n} (or 0: no streaming)")
        self.fleet, self.max_staleness = fleet, fleet.max_staleness
        self.backend, self.tool, self.sampling, self.reward = backend, tool, sampling, reward
        self.model_path, self.seed, self.dtype = model_path, seed, dtype
        self.sandbox = SandboxService(sandbox)  # the engines' python tool's: started only when the tools include it
        self.needs_sandbox = sandbox_needed(tool)
        self.transport = transport if transport is not None else RayTransport()
        self.ranks = TrainerRanks()  # read again at start, once the trainer's process group exists
        self.pool = FleetHosts(fleet, self.transport)
        self.weights = self.transport.weights(fleet, self.ranks)
        self.schedule = FleetSchedule(fleet, fleet.max_staleness, sampling, seed, self.pool)
        # RolloutSource.steps_take: streaming, a step takes the groups that ended, whatever their batch
        self.steps_take = "rows" if fleet.max_in_flight else "ahead"
        self._actor: nn.Module | None = None
        self._tokenizer: PreTrainedTokenizerBase | None = None
        self._stream: TrainStream | None = None
        self._step = 0  # the step in progress, named by errors
        self._stats: dict[str, float] = {}  # a following rank's copy of rank 0's counters
        self._occupancy: dict[str, float] = {}  # the engines', as of the last training batch
        self._aborted: dict[str, float] = {}  # the engines' abort counts so far, as of the last training batch
        self._restore = lambda: None  # puts the trainer's threads and cores back (zerotir.fleet.cores)
        self._early = EarlyScores(reward)  # each group scored on the trainer as it comes back from an engine

    @property
    def hosts(self) -> list[Any]:
        """The engine processes' Ray actor handles, in engine order; [] before start and after close."""
        return self.pool.handles

    @property
    def version(self) -> int | None:
        """The version of the last push the engines received; None: the folder's weights."""
        return self.weights.version

    @property
    def restarts(self) -> int:
        """Engine processes that died and were restarted."""
        return self.pool.restarts

    @property
    def sandbox_names(self) -> list[str]:
        """Where the engines' python tool runs code (the sandbox's URLs), named when it fails; [] without it."""
        return self.sandbox.names if self.needs_sandbox else []

    # ------------------------------------------------------------------------------------------- start and stop
    def check_trainer(self, world_size: int, zero3: bool) -> None:
        """The transport's: Ray serves any trainer (rank 0 drives the fleet for every rank), a thread one process."""
        self.transport.check_trainer(world_size, zero3)

    def start(self, actor: nn.Module, tokenizer: PreTrainedTokenizerBase, device: Any,
              stream: TrainStream | None) -> None:
        """The sandbox (with the python tool), the cluster, the engine processes (each starts its tools) and the
        weight group; idempotent. The first push happens
        with the first batch (its step gives the version) or evaluation batch."""
        if self.hosts or self._actor is not None:
            return
        self.ranks = self.weights.ranks = TrainerRanks()
        self._actor, self._tokenizer, self._stream = actor, tokenizer, stream
        if not self.ranks.lead:
            return  # rank 0 drives the fleet; this rank follows it (``batch``, ``evaluate``, ``after_update``)
        fleet = self.fleet
        fleet.check_trainer_device(torch.device(device).type)
        cores, apply, plan = self.transport.plan(fleet, self.ranks.world)
        on_nodes = fleet.sandbox_on_each_node(self.sandbox.config, self.tool)
        if self.needs_sandbox and not on_nodes:
            self.sandbox.start()
        self.transport.up(fleet, self.sandbox.config, self.tool)
        if on_nodes:
            self._start_trainer_sandbox()
        settings = self.transport.settings(HostSettings(
            self.model_path, self.backend, self.tool, self.seed, tuple(self.sandbox.urls),
            self.sandbox.config.client_options, fleet.engine_threads, fleet.engine_device, fleet.max_in_flight,
            2 * fleet.timeout_s, dtype=self.dtype, max_staleness=fleet.max_staleness),
            device)  # a call outlives the wait
        started = time.perf_counter()
        self.pool.start(settings, cores)
        self._check_adapters(actor)
        self._restore = apply()
        address = self.weights.form(self.pool)
        log.info("rollout fleet: %d engine hosts up in %.1f s, weight group at %s; %s", len(self.hosts),
                 time.perf_counter() - started, address, plan)

    def _start_trainer_sandbox(self) -> None:
        """The trainer's client on its node's server (started by ``transport.up``); the cluster stopped if it
        does not answer."""
        try:
            self.sandbox.start(self.transport.trainer_sandbox)
        except BaseException:
            self.transport.down()
            raise

    def close(self) -> None:
        """End the engine processes (a batch in flight is dropped: it was never trained), the weight group, the
        cluster (a local one) and the sandbox; idempotent."""
        started = bool(self.hosts) or self.transport.trainer_sandbox is not None  # the cluster is up
        self._actor = None
        self.schedule.clear()
        self._early.cancel()
        try:
            self.pool.kill()
            self.weights.close()
        finally:
            if started:
                self.transport.down()
            self.sandbox.close()
            self._restore()
            self._restore = lambda: None

    def _check_adapters(self, actor: nn.Module) -> None:
        """A LoRA actor reaches the engines as adapter tensors (``weight_push.push_adapter``, or the thread host's
        ``load_weights_from``); say so at start, or refuse engines that declare no adapter path."""
        if not is_adapted(actor):
            return
        paths = set(self.pool.adapter_paths)
        if paths != {"adapter"}:
            raise ValueError(f"model.base.lora: the fleet's engines ({type(self.backend).__name__}) take no adapters "
                             f"(adapter paths {sorted(paths)}); use zerotir.config.HFRollout or VLLMRollout, or set "
                             "model.base.lora: null")
        log_weight_path("adapter", f"the {len(self.hosts)} engine host(s) of the fleet")

    # ----------------------------------------------------------------------------------------------- the step
    def batch(self, step: int) -> RolloutBatch:
        """This rank's part of the next batch of ``step`` (``step`` again: a refill batch of it). Rank 0 takes the
        global batch (submitted now or earlier under the capacity rule), scores it, checks it against the staleness
        bound and hands every rank its share (``zerotir.fleet.ranks``) with every rank's consumed rows."""
        start = time.perf_counter()
        if self.ranks.lead:
            with self.ranks.leading():
                whole = self._global_batch(step)
            share = len(whole.rows) // self.ranks.world
            part, _ = self.ranks.scatter(self._parts(whole, [share] * self.ranks.world, self.sampling.n))
        else:
            self.ranks.follow(self._join_push)
            part, self._stats = self.ranks.scatter(None)
        part.timings["wait_for_rollout"] = time.perf_counter() - start
        return part

    def _global_batch(self, step: int) -> RolloutBatch:
        """The global batch of ``step``, collected, scored and checked (rank 0): the stream's next batch, or
        (streaming) the first ``prompts_per_step`` groups to end."""
        self._step, schedule = step, self.schedule
        if schedule.cursor is None:
            if not self.hosts:
                raise RuntimeError("FleetSource.batch before start (RolloutSource.start)")
            schedule.begin(step, self._stream, self.steps_take)
            if self.version != step - 1:  # the engines get version ``step - 1``
                self._push(self._actor, step - 1)
        index = schedule.take(step)
        schedule.top_up(self.version)
        pad = pad_id(self._tokenizer)
        rows, traj, timings = schedule.ended_batch(step, index, self._stream.prompts_per_step, self.version, pad,
                                                   self._recover, self._early)
        taken = [(r["batch_index"], r["position"]) for r in rows]
        timings["reward"] = score_trajectories(self.reward, traj, rows, self._early)
        check_staleness(staleness_stats(traj.versions, traj.action_mask, step), step, self.max_staleness)
        self._occupancy = self._step_figures(self.pool.occupancy())
        schedule.cursor.handed(step)
        schedule.top_up(self.version)  # the next batches generate while this one trains (S >= 1)
        return RolloutBatch(rows, traj, timings, self.sandbox_names, taken)

    def evaluate(self, rows: list[PromptRow], params: SamplingParams) -> RolloutBatch:
        """An evaluation batch on the engines, after the batches submitted before it, with the latest weights: the
        rows of every rank in one batch (rank 0's), each rank's part handed back to it."""
        every = self.ranks.gather(rows)
        if not self.ranks.lead:
            self.ranks.follow(self._join_push)
            part, self._stats = self.ranks.scatter(None)
            return part
        with self.ranks.leading():
            if self.version is None:
                self._push(self._actor, 0)  # before any training batch (a sanity check, validate): the actor's
            merged = [row for part in every for row in part]
            submitted = self.schedule.submit(-1, merged, params)
            traj, timings = self.pool.collect(submitted, "an evaluation batch", pad_id(self._tokenizer),
                                              self._recover)
            timings["reward"] = score_trajectories(self.reward, traj, merged)
        whole = RolloutBatch(merged, traj, timings, self.sandbox_names)
        return self.ranks.scatter(self._parts(whole, [len(r) for r in every], params.n))[0]

    def after_update(self, actor: nn.Module, version: int) -> float:
        """Broadcast ``actor``'s weights as ``version`` (it waits for the batches submitted before it), then submit
        the batches the rule now lets start; returns the push's seconds. The other ranks join its gathers."""
        start = time.perf_counter()
        if not self.ranks.lead:
            self.ranks.follow(self._join_push)
            return time.perf_counter() - start
        with self.ranks.leading():
            self._push(actor, version)
            self.schedule.top_up(self.version)
        return self.weights.last().seconds

    def stats(self) -> dict[str, float]:
        """The fleet's counters for the step's metrics: engine restarts so far and the last push's size (MB); on
        the other ranks, rank 0's as of their last batch."""
        if not self.ranks.lead:
            return dict(self._stats)
        last, schedule = self.weights.last(), self.schedule
        more = {"fleet_regenerated": schedule.regenerated, "fleet_spread": schedule.spread} \
            if self.steps_take == "rows" else {}
        return {"fleet_restarts": float(self.restarts), "push_mb": (last.bytes if last else 0) / 2**20,
                **self._occupancy, **more}

    def _step_figures(self, occupancy: dict[str, float]) -> dict[str, float]:
        """The engines' figures for the step: their shares of time as they are, their abort counts (so far) as
        the aborts since the last training batch. A restarted engine counts from 0 again: what the dead one
        counted since then is lost, never negative."""
        counts = {key: occupancy[key] for key in ("fleet_aborted_groups", "fleet_aborted_tokens") if key in occupancy}
        step = {key: max(0.0, value - self._aborted.get(key, 0.0)) for key, value in counts.items()}
        self._aborted = counts
        return {**occupancy, **step}

    def _parts(self, whole: RolloutBatch, counts: list[int], n: int) -> list[tuple[RolloutBatch, dict[str, float]]]:
        """Each rank's part of ``whole`` with rank 0's counters (``stats``), what ``scatter`` hands out."""
        stats = self.stats()
        return [(part, stats) for part in split_batch(whole, counts, n)]

    def _join_push(self, version: int) -> None:
        self.weights.join_push(self._actor, version)

    # ------------------------------------------------------------------------------------------------ helpers
    def _push(self, actor: nn.Module, version: int) -> None:
        """``actor``'s weights to every engine as ``version`` (``FleetWeights.push``); an engine that dies meanwhile
        is recovered (``_recover``), which pushes again."""
        from zerotir.fleet.cluster import EngineDied

        try:
            self.weights.push(self.pool, actor, version)
        except (EngineDied, WeightGroupError) as exc:
            self._recover(exc, list(self.schedule.submitted.values()), version)

    def _recover(self, cause: Exception, batches: list[Submitted], version: int | None = None) -> None:
        """After an engine died: the restarted engines (``FleetHosts.restarted``: counted, bounded by
        ``model.hosts.max_restarts``), a new weight group of every engine, the actor's weights pushed as
        ``version`` (None: the engines' last), and the shares the dead engines held of ``batches`` and of every batch
        ahead submitted again (with the same seeds: the same trajectories where the weights are the same)."""
        dead = self.pool.restarted(cause, self._step)
        self.weights.reform(self.pool, dead)
        self._push(self._actor, self.version if version is None else version)
        self.pool.resubmit(dead, [*batches, *self.schedule.submitted.values()])
