"""What one engine process of the rollout fleet runs: an engine with weights of its own, the tool loop on it and the
tools (a ``Toolbox`` built and started once per host, closed with it), fed new weights by the trainer's pushes.

``EngineHost`` is a plain class, so it runs in any process: a Ray actor of the fleet (``zerotir.fleet.cluster``
wraps it with ``ray.remote``), threads of the trainer's process (``zerotir.fleet.thread_host``) or a spawned
process in a test. It is built from ``HostSettings`` alone (plain,
picklable values: the model folder, the ``model.rollout`` group, the ``model.tool`` group, the seed, the sandbox's
URLs, torch threads, the device), because a Ray actor receives its arguments pickled and loads everything else
itself: the tokenizer and the engine from the model folder (weights of its own, apart from the trainer's), and its
own tools: its python tool reaches the sandbox at ``HostSettings.sandbox_urls`` (the trainer's), the one seam where
a host is told where code runs.

    host = EngineHost(settings)
    host.join_weights(address, rank, world_size, timeout_s)   # rank 1..K of the trainer's weight group
    host.receive_weights()                                    # one push into the engine: its version (None: stopped)
    host.load_weights(actor, version)                         # or, in the trainer's process, a copy of the actor
    host.roll_out(prompt_ids, truths, params)                 # the tool loop: (Trajectories on the CPU, timings)
    host.collect(host.queue(calls), i)                        # or several calls queued at once, each collected
    host.close()

Rewards are left at 0 (no reward function crosses to the host): the trainer scores the trajectories it gets back.
Tokens sampled after a push are stamped with its version (``Trajectories.versions``); before the first push the
engine has the folder's weights and nothing is stamped.
"""

from __future__ import annotations

import functools
import itertools
import os
import socket
import uuid
from collections.abc import Hashable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from zerotir.config import RolloutBackend, ToolConfig, VLLMRollout
from zerotir.fleet.cores import pin_process
from zerotir.fleet.weight_group import DEFAULT_TIMEOUT_S, SENDER, GroupAddress, WeightGroup, form_weight_group
from zerotir.fleet.stream import GroupStream, Job, StreamStats
from zerotir.fleet.versioned import synchronize_devices
from zerotir.fleet.weight_push import receive_push
from zerotir.models import freeze, load_causal_lm, load_tokenizer
from zerotir.rollout.agent_loop import Schedule
from zerotir.rollout.engine import EngineWeights, RolloutEngine, SamplingParams, pad_id
from zerotir.rollout.engines import create_engine
from zerotir.tools.python import sandbox_needed
from zerotir.tools.registry import Toolbox
from zerotir.types import Trajectories


@dataclass(frozen=True)
class HostSettings:
    """Everything an engine process is built from; plain values, so it pickles to a Ray actor.

    Attributes:
        model_path: the HF folder (config, weights, tokenizer) the engine and the tokenizer load.
        rollout: the ``model.rollout`` group (``HFRollout`` / ``VLLMRollout``): the engine and its settings.
        tool: the ``model.tool`` group; with the python tool among its tools ``sandbox_urls`` must be given.
        seed: the engine's own seed (each rollout's requests carry theirs, ``SamplingParams.seed``).
        sandbox_urls: the sandbox servers (``python -m sandbox serve``) the host's python tool sends code to.
        sandbox_options: further ``sandbox.SandboxClient`` keywords (``SandboxConfig.client_options``).
        threads: torch intra-op threads of the process (None: torch's); also a transformers engine's when its group
            leaves ``num_threads`` unset.
        device: where the engine runs and the weight group's tensors live ("cpu": gloo, "cuda": NCCL).
        max_in_flight: what the host's stream (``zerotir.fleet.stream``) admits: > 0: every prompt group of every
            ``roll_out`` call is a tool loop of its own, admitted while the trajectories in flight stay within this;
            0: each ``roll_out`` call is one tool loop over its whole share, one call at a time. Either way pushes
            land between engine steps (its Ray actor takes calls side by side: ``cluster.spawn_hosts``).
        stream_timeout_s: the bound on a ``roll_out`` call's wait for its rollouts (``model.hosts.timeout_s``).
        max_staleness: S of ``model.hosts``: a prompt group in flight that a push leaves more than S versions
            behind is aborted and generated again (``zerotir.fleet.hub``); None: none is.
        cores: the cores the process is pinned to (``zerotir.fleet.cores``); None: the OS places it.
        own_process: the host has its process to itself (a Ray actor): ``threads`` are set process-wide. False: a
            thread of the trainer's process (``zerotir.fleet.thread_host``): ``threads`` are its engine's alone.
        dtype: the parameter dtype of a transformers engine's own copy of the actor, the run's ``model.base.dtype``
            (a float32 copy of a bfloat16 7B actor would take 28 GiB of the GPU it shares with training).
    """

    model_path: str
    rollout: RolloutBackend
    tool: ToolConfig
    seed: int = 0
    sandbox_urls: tuple[str, ...] = ()
    sandbox_options: dict[str, Any] = field(default_factory=dict)
    threads: int | None = None
    device: str = "cpu"
    max_in_flight: int = 0
    stream_timeout_s: float = DEFAULT_TIMEOUT_S
    cores: tuple[int, ...] | None = None
    own_process: bool = True
    dtype: str = "float32"
    max_staleness: int | None = None

    def check(self) -> None:
        """Refuse settings the host cannot run, naming the setting and the fix."""
        if not (Path(self.model_path) / "config.json").is_file():
            raise FileNotFoundError(f"HostSettings.model_path={self.model_path!r}: no HF model folder there (no "
                                    "config.json); give the folder the trainer loaded its actor from")
        if not isinstance(self.rollout, RolloutBackend):
            raise TypeError(f"HostSettings.rollout={self.rollout!r}: give the model.rollout group "
                            "(zerotir.config.HFRollout or zerotir.config.VLLMRollout)")
        if sandbox_needed(self.tool) and not self.sandbox_urls:
            raise ValueError("HostSettings.sandbox_urls is empty but model.tool.tools include python: give the URLs "
                             "of the sandbox servers the engine processes reach (python -m sandbox serve), or drop "
                             "python from model.tool.tools (or set model.tool.max_tool_calls=0: no tool)")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"HostSettings.threads={self.threads}: must be >= 1, or None for torch's setting")
        if self.max_in_flight < 0:
            raise ValueError(f"HostSettings.max_in_flight={self.max_in_flight}: >= 1 to stream, or 0")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ValueError(f"HostSettings.max_staleness={self.max_staleness}: >= 0 (model.hosts.max_staleness), "
                             "or None: no group aborted at a push")


Call = tuple[list[list[int]], list[str] | None, SamplingParams]  # one ``roll_out``'s prompts, truths and params


class JobsLost(RuntimeError):
    """``EngineHost.collect`` of jobs another host queued: they are gone with its process (recovered as its death:
    ``zerotir.fleet.cluster.ray_get`` raises ``EngineDied``)."""


class EngineHost:
    """One engine process of the fleet: engine, tool loop and tools (see the module doc).

    Args:
        settings: what to load and how; checked first (``HostSettings.check``).

    Raises:
        FileNotFoundError, TypeError, ValueError: bad settings, naming the setting and the fix.
        sandbox.SandboxUnavailable: with the python tool, no sandbox server answered (every URL named).
        ValueError: another tool failed to start (an MCP server), naming the setting.
    """

    def __init__(self, settings: HostSettings):
        settings.check()
        self.settings = settings
        if settings.cores is not None:
            pin_process(settings.cores)  # before torch starts its pools, which inherit it
        if settings.threads is not None and settings.own_process:
            torch.set_num_threads(settings.threads)  # the process is the host's own
        self.tokenizer = load_tokenizer(settings.model_path)
        self.schedule = Schedule(settings.rollout.schedule, settings.rollout.round_tokens)
        self.toolbox = Toolbox.build(settings.tool, sandbox_urls=settings.sandbox_urls)
        self.toolbox.start()  # once per host: a dead sandbox or server fails the host now, naming it
        try:
            self._build(settings)
        except BaseException:
            self.toolbox.close()
            raise

    def _build(self, settings: HostSettings) -> None:
        """The engine and the stream that runs the tool loop on it."""
        actor = _engine_model(settings.rollout, settings.model_path, settings.dtype)
        self.engine: RolloutEngine | None = create_engine(
            settings.rollout, actor, self.tokenizer, settings.device, settings.model_path, settings.seed,
            threads=settings.threads)  # the model loaded here is the host's own
        self.group: WeightGroup | None = None
        self.version: int | None = None  # of the last push received; None: the folder's weights
        self._process = uuid.uuid4().hex[:12]  # this host's own: a key queued by another process is never taken here
        self._calls = itertools.count()  # with it, tags the jobs of each roll_out call
        self.stream = GroupStream(self.engine, self.tokenizer, settings.tool, self.schedule, self.toolbox,
                                  settings.max_in_flight, settings.device, settings.max_staleness)

    def describe(self) -> dict[str, Any]:
        """What the host runs: its engine's type, context length, how a LoRA actor's pushes reach it
        (``RolloutEngine.adapter_path``), the version of its weights and where it runs (node name, process id).
        Cheap, so a caller waits on it for a new actor to be built (loading the engine) before it forms the weight
        group."""
        engine = self._engine()
        return {"engine": type(engine).__name__, "context_length": engine.context_length,
                "adapter_path": engine.adapter_path(None), "version": self.version, "node": socket.gethostname(),
                "pid": os.getpid()}

    def join_weights(self, address: GroupAddress, rank: int, world_size: int,
                     timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """Join the trainer's weight group as receiver ``rank`` (1..world_size - 1); returns once every rank has
        joined (the trainer's sender forms it at ``address`` as rank 0 at the same time).

        Raises:
            ValueError: rank 0 (the sender's) or a bad rank / world size.
            RuntimeError: the host already is in a group, or it is closed.
            zerotir.fleet.weight_group.WeightGroupError: the group did not form within ``timeout_s``.
        """
        self._engine()
        if rank == SENDER:
            raise ValueError(f"EngineHost.join_weights(rank={rank}): rank {SENDER} is the trainer's sender; give "
                             f"each engine process its own rank, 1..world_size - 1")
        if self.group is not None and not self.group.closed:
            raise RuntimeError(f"EngineHost.join_weights: already in the {self.group}; the sender's stop ends it")
        self.group = form_weight_group(address, rank, world_size, self.settings.device, timeout_s)

    def receive_weights(self) -> int | None:
        """Receive one push into the engine, bucket by bucket (``receive_push``); the push's version, or None when
        the sender stopped the group (the host then has none, and may join another).

        Raises:
            RuntimeError: no group joined (``join_weights`` first), or the host is closed.
            zerotir.fleet.weight_group.WeightGroupError: the push was aborted, broken or timed out.
        """
        engine = self._engine()
        if self.group is None or self.group.closed:
            raise RuntimeError("EngineHost.receive_weights before join_weights: join the trainer's weight group "
                               "first (join_weights(address, rank, world_size))")
        # between two engine steps of the stream, which goes on with the new weights
        version = self._stream().push(lambda inner: receive_push(self.group, inner), self.group.timeout_s)
        if version is None:
            self.group = None
        else:
            self.version = version
        return version

    def load_weights(self, actor: nn.Module, version: int) -> int:
        """The thread transport's push: ``actor``'s weights (in this process) copied into the engine between two of
        its steps as ``version``, the devices synchronized around the copy (``GroupStream.push``); returns
        ``version``."""

        def copy(engine: EngineWeights) -> int:
            engine.load_weights_from(actor)
            return version

        self.version = self._stream().push(copy, self.settings.stream_timeout_s)
        return version

    def leave_weights(self) -> None:
        """Leave the weight group without the ordered goodbye (``WeightGroup.abandon``): another of its processes
        died, so the trainer forms a new group, which the host then joins; nothing if it is in none."""
        group, self.group = self.group, None
        if group is not None:
            group.abandon()

    def roll_out(self, prompts: list[list[int]], truths: list[str] | None,
                 params: SamplingParams) -> tuple[Trajectories, dict[str, float]]:
        """The tool loop over ``prompts`` (token ids) on this host's stream, code on its sandbox; ``params.n``
        trajectories per prompt, rewards 0, collected in order (``queue`` then ``collect``). Returns the
        trajectories on the CPU, each segment's tokens stamped with the weights' version when it was submitted, and
        the tool loop's timings (seconds; of several jobs, the slowest's)."""
        return self.collect(self.queue([(prompts, truths, params)]), 0)

    def queue(self, calls: list[Call]) -> list[list[Hashable]]:
        """Queue the jobs of ``calls`` (each the arguments of a ``roll_out``) on the host's stream in one submit,
        behind those queued before; each call's keys. The stream admits jobs in the order they were queued, so a
        caller that queues in the order it made its calls gets its groups started in that order (the thread host
        queues in the caller's thread). Queued together, the calls' groups start in the stream's same turn and
        prefill in the engine's same steps, where calls queued one by one would each wait for its next turn.

        Streaming (``max_in_flight`` > 0) each prompt is a job of its own, seeded as row i of its call (trajectory
        k of a call samples with ``params.seed + k``); else each call is one job, as the in-line rollout runs it."""
        each = [self._jobs(*call) for call in calls]
        self._stream().submit([job for jobs in each for job in jobs])
        return [[job.key for job in jobs] for jobs in each]

    def _jobs(self, prompts: list[list[int]], truths: list[str] | None, params: SamplingParams) -> list[Job]:
        n, tag = params.n, (self._process, next(self._calls))
        truths = truths if truths is not None else [""] * len(prompts)
        if self.settings.max_in_flight:
            return [Job((tag, i), [p], [t], params if params.seed is None else
                        replace(params, seed=params.seed + i * n)) for i, (p, t) in enumerate(zip(prompts, truths))]
        return [Job((tag, 0), prompts, truths, params)]

    def collect(self, queued: list[list[Hashable]], index: int) -> tuple[Trajectories, dict[str, float]]:
        """The trajectories of call ``index`` of one ``queue`` (``queued``: what it returned), waiting for its last
        job, in one batch (group ids in row order) with the slowest job's timings.

        Raises:
            JobsLost: the keys were queued by another host (Ray restarted this actor after its ``queue`` call ran
                there, and sent the ``collect`` here): its jobs died with that process.
        """
        keys = queued[index]
        foreign = sorted({key[0][0] for key in keys} - {self._process})
        if foreign:
            raise JobsLost(f"the jobs of this call were queued on engine process {foreign[0]}, not this one "
                           f"({self._process}): they were lost when that process died")
        parts = self._stream().take_timed(keys, self.settings.stream_timeout_s)
        for i, (part, _) in enumerate(parts):
            part.group_ids = part.group_ids + i
        timings = {key: max(took[key] for _, took in parts) for key in parts[0][1]}  # the jobs ran side by side
        return Trajectories.cat([part for part, _ in parts], pad_id(self.tokenizer)), timings

    def occupancy(self) -> dict[str, float]:
        """How busy the engine has been since the host started: ``busy``, the share of wall time with a rollout in
        flight, and (streaming) ``fill``, the mean trajectories in flight over ``max_in_flight``, and
        ``fill_waiting``, the same mean over only the time at least one job waited to be admitted (1 while none has
        waited yet: the room was never short of the work there was), with the counts so far of the groups aborted at
        a push (``aborted_groups``) and of their wasted tokens (``aborted_tokens``). ``fill`` counts the time the
        trainer gave no work; ``fill_waiting`` only how full the room stayed while there was some. A batch share
        keeps the engine busy until its slowest trajectory ends, however few still run by then, which ``fill``
        shows; nothing is in flight at its pushes, so nothing is aborted."""
        return stream_occupancy(self._stream().stats(), self.settings.max_in_flight)

    def close(self) -> None:
        """Close the engine, leave the weight group and close the tools; idempotent."""
        stream, self.stream = self.stream, None
        if stream is not None:
            stream.close()
        engine, self.engine = self.engine, None
        group, self.group = self.group, None
        try:
            if engine is not None:
                engine.close()
        finally:
            if group is not None:
                group.close()
            self.toolbox.close()

    def _stream(self) -> GroupStream:
        self._engine()
        return self.stream

    def _engine(self) -> RolloutEngine:
        if self.engine is None:
            raise RuntimeError("EngineHost is closed (close() ran); start a new host")
        return self.engine


def stream_occupancy(stats: StreamStats, max_in_flight: int) -> dict[str, float]:
    """``EngineHost.occupancy`` of a stream's ``stats`` with room for ``max_in_flight`` trajectories (0: whole
    shares, ``busy`` alone)."""
    wall = max(stats.wall, 1e-9)
    busy = {"busy": stats.busy / wall}
    if not max_in_flight:  # whole shares: no room to fill
        return busy
    waiting = stats.trajectory_seconds_waiting / (stats.waiting * max_in_flight) if stats.waiting else 1.0
    return {**busy, "fill": stats.trajectory_seconds / (wall * max_in_flight), "fill_waiting": waiting,
            "aborted_groups": float(stats.aborted_groups), "aborted_tokens": float(stats.aborted_tokens)}


COUNTS = ("aborted_groups", "aborted_tokens")  # the occupancy figures that add up over hosts; the others average


def combine_occupancy(each: list[dict[str, float]]) -> dict[str, float]:
    """The hosts' ``EngineHost.occupancy`` as the fleet's ``fleet_<key>``: the mean of the shares of time over the
    hosts, the sum of the counts (``COUNTS``)."""
    return {f"fleet_{key}": sum(e[key] for e in each) / (1 if key in COUNTS else len(each)) for key in each[0]}


@functools.singledispatch
def _engine_model(backend: RolloutBackend, model_path: str, dtype: str) -> nn.Module | None:
    """The module an engine of ``backend`` generates with: loaded from ``model_path`` in ``dtype``, the host's own."""
    return freeze(load_causal_lm(model_path, dtype))


@_engine_model.register
def _vllm_model(backend: VLLMRollout, model_path: str, dtype: str) -> nn.Module | None:
    return None  # a vLLM engine loads ``model_path`` itself, in ``model.rollout.init_args.dtype``
