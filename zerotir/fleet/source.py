"""The rollout source of the fleet (``model.fleet.engines`` >= 1): each batch is rolled out by engine processes of
their own (Ray actors running ``EngineHost``), and every update's weights are broadcast to them over the weight
group (docs/fleet.md).

    trainer:  take(k) -> update k -> push(version k) -> take(k + 1) -> ...
    engines:  batch i starts once the pushes have reached version latest_step(i) - 1 - S (the capacity rule,
              ``zerotir.rl.staleness.StreamCursor``); batch shares one at a time, or streamed group by group

With S = 0 each batch is submitted when its step asks for it, after the previous update's push (the in-line run's
rollouts and parameters); with S >= 1 the next steps' batches go out as soon as the rule lets them, each after the
push before it has reached every engine. A batch goes out in shares (``zerotir.fleet.shares``): one contiguous
share per engine, a step taking its own batch; or, streaming, one call per prompt group, a step taking the first
groups in stream order among those that have ended, whatever their batch (one over the bound is generated again),
so no step waits for a slow group. Every trajectory samples with its row's seed (``source.batch_seed``); the
trainer scores them and checks their versions against the bound. Rank 0 drives the fleet for every training rank
(``zerotir.fleet.ranks``). The sandbox is the trainer's (``SandboxService``), reached by the engines at its URLs.
Every wait is bounded by ``model.fleet.timeout_s``; an error names the engine, what it was doing and the step.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from zerotir.config import FleetConfig, PipelineConfig, RolloutBackend, SamplingConfig, SandboxConfig, ToolConfig
from zerotir.fleet.cluster import mean_occupancy
from zerotir.fleet.cores import available_cores, plan_cores
from zerotir.fleet.engine_host import HostSettings
from zerotir.fleet.ranks import Discard, TrainerRanks, same_rows, split_batch
from zerotir.fleet.shares import Ended, EndedGroups, Submitted, collect_ended, cut_shares, merge
from zerotir.fleet.weight_group import GroupAddress, WeightGroupError, form_weight_group, free_port
from zerotir.fleet.weight_push import PushStats, WeightSender, push_weights
from zerotir.rl.staleness import StreamCursor, check_staleness, staleness_stats
from zerotir.rollout.agent_loop import Reward
from zerotir.rollout.engine import SamplingParams, pad_id
from zerotir.rollout.sandbox_service import SandboxService
from zerotir.rollout.source import RolloutBatch, Stream, batch_seed, sampling_params
from zerotir.rollout.sync import run_sync
from zerotir.scale.weight_sync import DEFAULT_BUCKET_BYTES, sync_weights
from zerotir.types import PromptRow, Trajectories

log = logging.getLogger(__name__)


class FleetSource:
    """Rollouts on the fleet's engine processes (see the module doc); the ``RolloutSource`` of a fleet run.

    Args:
        fleet: the ``model.fleet`` group (``engines`` >= 1).
        pipeline: the ``model.pipeline`` group (``max_staleness`` set: the schedule).
        backend, sandbox, tool, sampling: the ``model.*`` groups of those names.
        reward: scores the trajectories the engines return (``zerotir.reward.score_batch``).
        model_path: the HF folder every engine process loads.
        seed: the run's seed (training batch b samples with ``batch_seed``).
    """

    def __init__(self, fleet: FleetConfig, pipeline: PipelineConfig, backend: RolloutBackend, sandbox: SandboxConfig,
                 tool: ToolConfig, sampling: SamplingConfig, reward: Reward | None, model_path: str, seed: int):
        if 0 < fleet.max_in_flight < sampling.n:
            raise ValueError(f"model.fleet.max_in_flight={fleet.max_in_flight} with model.sampling.n={sampling.n}: a "
                             f"prompt group streams whole; set max_in_flight >= {sampling.n} (or 0: no streaming)")
        self.fleet, self.max_staleness = fleet, pipeline.max_staleness
        self.backend, self.tool, self.sampling, self.reward = backend, tool, sampling, reward
        self.model_path, self.seed = model_path, seed
        self.sandbox = SandboxService(sandbox, tool)
        self.hosts: list[Any] = []
        self.sender: WeightSender | None = None
        self.version: int | None = None  # of the last push the engines received; None: the folder's weights
        self._actor: nn.Module | None = None
        self._tokenizer: PreTrainedTokenizerBase | None = None
        self._stream: Stream | None = None
        self._submitted: dict[int, Submitted] = {}  # training batches on the engines, by stream index
        self._cursor: StreamCursor | None = None  # set by the first training batch
        self._next_submit = 0  # the next batch of the stream to submit
        self._where: list[dict[str, Any]] = []  # per engine: its describe() (node, pid) when it last started
        self._step = 0  # the step in progress, named by errors
        self.restarts = 0  # engine processes that died and were restarted
        self.regenerated = 0  # streaming: prompt groups dropped over the staleness bound and generated again
        self._ended = EndedGroups()  # streaming: groups that have ended, not yet taken by a step
        self._spread = 0  # streaming: the stream batches the last step's groups came from
        self.ranks = TrainerRanks()  # read again at start, once the trainer's process group exists
        self._stats: dict[str, float] = {}  # a following rank's copy of rank 0's counters
        self._occupancy: dict[str, float] = {}  # the engines', as of the last training batch
        self._restore = lambda: None  # puts the trainer's threads and cores back (zerotir.fleet.cores)

    # ------------------------------------------------------------------------------------------- start and stop
    def check_trainer(self, world_size: int, zero3: bool) -> None:
        """Any trainer: rank 0 drives the fleet for every rank (``zerotir.fleet.ranks``), and the engines have
        weights of their own, so neither several ranks nor ZeRO-3's partitioned parameters constrain them."""

    def start(self, actor: nn.Module, tokenizer: PreTrainedTokenizerBase, device: Any, stream: Stream | None) -> None:
        """The sandbox, the cluster, the engine processes and the weight group; idempotent. The first push happens
        with the first batch (its step gives the version) or evaluation batch."""
        if self.hosts or self._actor is not None:
            return
        from zerotir.fleet.cluster import describe_hosts, fleet_cluster, spawn_hosts

        self.ranks = TrainerRanks()
        self._actor, self._tokenizer, self._stream = actor, tokenizer, stream
        if not self.ranks.lead:
            return  # rank 0 drives the fleet; this rank follows it (``batch``, ``evaluate``, ``after_update``)
        fleet = self.fleet
        fleet.check_trainer_device(torch.device(device).type)
        budget = plan_cores(fleet, available_cores(), fleet.address is None and self.ranks.world == 1)
        self.sandbox.start()
        fleet_cluster(fleet, self.sandbox.config, self.tool)
        settings = HostSettings(self.model_path, self.backend, self.tool, self.seed, tuple(self.sandbox.urls),
                                self.sandbox.config.client_options, fleet.engine_threads, fleet.device,
                                fleet.max_in_flight, fleet.timeout_s)
        self.hosts = spawn_hosts(fleet.engines, settings, fleet.cpus_per_engine, fleet.gpus_per_engine,
                                 fleet.max_restarts, budget.engine_cores)
        if self.ranks.world == 1:  # several training ranks share the node's cores as their launcher placed them
            self._restore = budget.apply_to_trainer()
        started = time.perf_counter()
        self._where = describe_hosts(self.hosts, fleet.timeout_s, "starting (loading the model)")
        address = self._form_group(fleet.weight_port)
        log.info("rollout fleet: %d engine processes up in %.1f s, weight group at %s; %s", len(self.hosts),
                 time.perf_counter() - started, address, budget.describe())

    def _form_group(self, port: int) -> GroupAddress:
        """A weight group of this process (the sender) and every engine, at ``port`` (0: a free one)."""
        from zerotir.fleet.cluster import ray_get

        fleet = self.fleet
        address = GroupAddress(fleet.weight_host, port or free_port(fleet.weight_host))
        world = 1 + len(self.hosts)
        joined = [h.join_weights.remote(address, r + 1, world, fleet.timeout_s) for r, h in enumerate(self.hosts)]
        self.sender = WeightSender(form_weight_group(address, 0, world, fleet.device, fleet.timeout_s))
        ray_get(joined, fleet.timeout_s, "joining the weight group")
        return address

    def close(self) -> None:
        """End the engine processes (a batch in flight is dropped: it was never trained), the weight group, the
        cluster (a local one) and the sandbox; idempotent."""
        from zerotir.fleet.cluster import kill_hosts, stop_cluster

        hosts, self.hosts = self.hosts, []
        sender, self.sender = self.sender, None
        self._actor = None
        self._submitted.clear()
        self._ended.clear()
        try:
            if hosts:
                kill_hosts(hosts)
            if sender is not None:
                sender.group.abandon()  # its receivers were killed: none would leave in order
        finally:
            if hosts:
                stop_cluster()
            self.sandbox.close()
            self._restore()
            self._restore = lambda: None

    # ----------------------------------------------------------------------------------------------- the step
    def batch(self, step: int, rows: list[PromptRow], first_row: int) -> RolloutBatch:
        """This rank's part of the batch of ``step`` (``step`` again: a refill batch of it). Rank 0 takes the global
        batch (submitted now or earlier under the capacity rule), scores it, checks it against the staleness bound
        and hands every rank its share (``zerotir.fleet.ranks``); each rank checks its rows against its loader's."""
        start = time.perf_counter()
        if self.ranks.lead:
            with self.ranks.leading():
                whole = self._global_batch(step, rows[0]["batch_index"], len(rows) * self.ranks.world)
            share = len(whole.rows) // self.ranks.world
            part, _ = self.ranks.scatter(self._parts(whole, [share] * self.ranks.world, self.sampling.n))
        else:
            self.ranks.follow(self._join_push)
            part, self._stats = self.ranks.scatter(None)
        part.timings["wait_for_rollout"] = time.perf_counter() - start
        return same_rows(part, rows, f"step {step}, stream batch {rows[0]['batch_index']}")

    def _global_batch(self, step: int, index: int, size: int) -> RolloutBatch:
        """The global batch of ``step`` (``size`` prompts; the loader's is batch ``index`` of the stream),
        collected, scored and checked (rank 0): batch ``index`` itself, or (streaming) the first groups to end."""
        self._step = step
        if self._cursor is None:
            self._begin(step, index)
        expected, _ = self._cursor.take(step)
        if index != expected:
            raise RuntimeError(f"step {step}: the loader gave batch {index} but the fleet's stream is at batch "
                               f"{expected}; the training stream and the fleet disagree")
        self._top_up()
        if self.fleet.max_in_flight:
            rows, traj, timings = self._ended_batch(step, size)
            taken = [(r["batch_index"], r["position"]) for r in rows]
        else:
            submitted = self._submitted.pop(index)
            rows, taken = submitted.rows, None
            traj, timings = self._collect(submitted, f"the batch of step {step} (stream batch {index})")
        check_staleness(staleness_stats(traj.versions, traj.action_mask, step), step, self.max_staleness)
        self._occupancy = mean_occupancy(self.hosts, self.fleet.timeout_s, self._occupancy)
        self._cursor.handed(step)
        self._top_up()  # the next batches generate while this one trains (S >= 1)
        return RolloutBatch(rows, traj, timings, self.sandbox.names, taken)

    def _ended_batch(self, step: int, size: int) -> tuple[list[PromptRow], Trajectories, dict[str, float]]:
        """Streaming: the first ``size`` prompt groups in stream order among those that have ended, scored. One over
        the bound for ``step`` is generated again with the newest weights (``regenerated``); a dead engine recovered."""
        deadline, took = time.monotonic() + self.fleet.timeout_s, {}
        while True:
            self._top_up()
            while len(self._ended) + sum(len(b.shares) for b in self._submitted.values()) < size:
                self._submit_next()  # a resumed run's first batches lack the rows trained before its checkpoint
            for group in self._ended.stale(step, self.max_staleness):
                self.regenerated += 1
                self._submit_rows(group.row["batch_index"], [group.row])
            if len(self._ended) >= size:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"step {step}: {len(self._ended)} of its {size} prompt groups had ended within "
                                   f"{self.fleet.timeout_s:g} s (model.fleet.timeout_s)")
            ended, died = collect_ended(self._submitted, left, f"rolling out the groups of step {step}")
            for row, traj, timings in ended:
                self._ended.add(Ended.of(row, traj))
                took = {key: max(took.get(key, 0.0), value) for key, value in timings.items()}
            if died is not None:
                self._recover(died, self.version, [])
        groups = self._ended.take(size)
        traj, timings = merge([(g.trajectories, took) for g in groups], list(range(size)), pad_id(self._tokenizer))
        timings["reward"] = self._score(traj)
        self._spread = len({group.row["batch_index"] for group in groups})
        return [group.row for group in groups], traj, timings

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
            traj, timings = self._collect(self._submit(-1, merged, params), "an evaluation batch")
        whole = RolloutBatch(merged, traj, timings, self.sandbox.names)
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
            self._top_up()
        return self.sender.pushes[-1].seconds

    def stats(self) -> dict[str, float]:
        """The fleet's counters for the step's metrics: engine restarts so far and the last push's size (MB); on
        the other ranks, rank 0's as of their last batch."""
        if not self.ranks.lead:
            return dict(self._stats)
        last = self.sender.pushes[-1].bytes if self.sender is not None and self.sender.pushes else 0
        more = {"fleet_regenerated": self.regenerated, "fleet_spread": self._spread} if self.fleet.max_in_flight else {}
        return {"fleet_restarts": float(self.restarts), "push_mb": last / 2**20, **self._occupancy, **more}

    def _parts(self, whole: RolloutBatch, counts: list[int], n: int) -> list[tuple[RolloutBatch, dict[str, float]]]:
        """Each rank's part of ``whole`` with rank 0's counters (``stats``), what ``scatter`` hands out."""
        stats = self.stats()
        return [(part, stats) for part in split_batch(whole, counts, n)]

    def _join_push(self, version: int) -> None:
        """A rank >= 1's side of rank 0's push: the same bucket gathers (ZeRO-3 collectives), nothing sent."""
        sync_weights(self._actor, Discard(), DEFAULT_BUCKET_BYTES)

    # ------------------------------------------------------------------------------------------------ helpers
    def _begin(self, step: int, index: int) -> None:
        """The first training batch: the stream cursor starts at it, and the engines get version ``step - 1``."""
        if not self.hosts:
            raise RuntimeError("FleetSource.batch before start (RolloutSource.start)")
        if self._stream is None:
            raise ValueError("model.fleet.engines: the fleet reads the batches of the next steps from zerotir's "
                             "PromptDataModule (train_batch); use it as the run's datamodule")
        self._cursor, self._next_submit = StreamCursor(step, index), index
        if self.version != step - 1:
            self._push(self._actor, step - 1)

    def _top_up(self) -> None:
        """Submit every next batch of the stream the capacity rule lets start with the engines' weights."""
        while self._cursor.may_start(self._next_submit, self.version, self.max_staleness):
            self._submit_next()

    def _submit_next(self) -> None:
        """Submit the rows of the stream's next batch that no step trained (``Stream``)."""
        self._submit_rows(self._next_submit, self._stream(self._next_submit))
        self._next_submit += 1

    def _submit_rows(self, index: int, rows: list[PromptRow]) -> None:
        """Submit ``rows`` of training batch ``index``, held until collected beside the shares of that batch held
        already (streaming: a group generated again)."""
        params = sampling_params(self.sampling, batch_seed(self.seed, index, 0, self.sampling.n))
        submitted = self._submit(index, rows, params, self.fleet.max_in_flight > 0)
        held = self._submitted.setdefault(index, Submitted(index, []))
        for share in submitted.shares:
            share.lo += len(held.rows)
        held.rows, held.shares = held.rows + submitted.rows, held.shares + submitted.shares

    def _submit(self, index: int, rows: list[PromptRow], params: SamplingParams, per_group: bool = False) -> Submitted:
        """``rows`` cut into shares (``shares.cut_shares``), each rolled out by one call to its engine."""
        shares = cut_shares(rows, params, len(self.hosts), per_group)
        for share in shares:
            share.ref = self.hosts[share.engine].roll_out.remote(*share.args)
        return Submitted(index, rows, shares)

    def _collect(self, submitted: Submitted, what: str) -> tuple[Trajectories, dict[str, float]]:
        """The engines' shares of one batch, in row order (group ids shifted to the batch's rows), scored."""
        from zerotir.fleet.cluster import EngineDied, ray_get

        while True:
            try:
                results = ray_get([share.ref for share in submitted.shares], self.fleet.timeout_s,
                                  f"rolling out {what}", [share.engine for share in submitted.shares])
                break
            except EngineDied as died:
                self._recover(died, self.version, [submitted])
        traj, timings = merge(results, [share.lo for share in submitted.shares], pad_id(self._tokenizer))
        timings["reward"] = self._score(traj)
        return traj, timings

    def _score(self, traj: Trajectories) -> float:
        """Fill ``traj.rewards`` with the run's reward; its seconds (0 without a reward: rewards stay 0)."""
        if self.reward is None:
            return 0.0
        start = time.perf_counter()
        scores = run_sync(self.reward(traj.response_texts, traj.ground_truths, traj.truncated.tolist()),
                          "the fleet's reward")
        traj.rewards = torch.tensor(scores, dtype=torch.float32)
        return time.perf_counter() - start

    def _push(self, actor: nn.Module, version: int) -> PushStats:
        """``actor``'s weights to every engine as ``version``, bucket by bucket; waits until each has them. An engine
        that dies meanwhile interrupts the push (``cluster.watch_push``) and is recovered (``_recover``), which
        pushes again."""
        from zerotir.fleet.cluster import EngineDied, ray_get, watch_push

        received = [h.receive_weights.remote() for h in self.hosts]
        self.ranks.announce_push(version)  # every rank joins the gathers, which run to the end whatever fails
        try:
            with watch_push(received, self.sender.group):  # a dead engine interrupts the push at once
                push_weights(self.sender, actor, version)
                got = ray_get(received, self.fleet.timeout_s, f"receiving the weights of version {version}")
        except (EngineDied, WeightGroupError) as exc:
            self._recover(exc, version, list(self._submitted.values()))
            return self.sender.pushes[-1]
        if got != [version] * len(self.hosts):
            raise RuntimeError(f"weight push {version}: the engines report versions {got}")
        self.version = version
        stats = self.sender.pushes[-1]
        log.debug("weight push %d: %.2f s, %.1f MB in %d buckets", version, stats.seconds, stats.bytes / 2**20,
                  stats.buckets)
        return stats

    def _recover(self, cause: Exception, version: int, batches: list[Submitted]) -> None:
        """After an engine died: wait for Ray's restart, count it (past ``model.fleet.max_restarts`` the run stops,
        naming the engine, its node and the step), form a new weight group of every engine, push the actor's
        weights as ``version``, and submit again the shares of ``batches`` and of every batch ahead that the dead
        engines held (with the same seeds: the same trajectories where the weights are the same)."""
        from zerotir.fleet.cluster import EngineDied, describe_hosts

        try:
            now = describe_hosts(self.hosts, self.fleet.timeout_s, "restarting after an engine died", wait=True)
        except EngineDied as died:
            where = self._where[died.engine]
            raise RuntimeError(f"engine process {died.engine} of the fleet (node {where['node']}, pid "
                               f"{where['pid']}) died at step {self._step} and Ray could not restart it: {died}; "
                               f"first failure: {cause}") from cause
        dead = [k for k, (old, new) in enumerate(zip(self._where, now)) if old["pid"] != new["pid"]]
        if not dead:  # every engine is the one that started: not a death (a push that timed out, say)
            raise cause
        self.restarts += len(dead)
        if self.restarts > self.fleet.max_restarts:
            names = ", ".join(f"{k} (node {self._where[k]['node']}, pid {self._where[k]['pid']})" for k in dead)
            raise RuntimeError(f"engine process {names} of the fleet died at step {self._step}: {self.restarts} "
                               f"restarts, past model.fleet.max_restarts={self.fleet.max_restarts}: {cause}") from cause
        log.warning("rollout fleet: engine %s died at step %d (%s); restarted (%d of %d restarts allowed)", dead,
                    self._step, cause, self.restarts, self.fleet.max_restarts)
        self._where = now
        self.sender.group.abandon()
        for k, host in enumerate(self.hosts):
            if k not in dead:
                host.leave_weights.remote()  # after its calls in flight, before it joins the new group
        self._form_group(self.fleet.weight_port)  # the abandoned group's store no longer holds the port
        self._push(self._actor, version)
        pending = {id(b): b for b in [*batches, *self._submitted.values()]}
        for submitted in pending.values():
            for share in submitted.shares:
                if share.engine in dead:
                    share.ref = self.hosts[share.engine].roll_out.remote(*share.args)
