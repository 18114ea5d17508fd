"""What a run needs besides its models: the sandbox (configured URLs or an embedded local server), the rollout engine
(the ``model.rollout`` group names it) and the weight push between the trained actor and that engine:

    * ``HFRollout``: ``HFEngine`` wraps the actor module itself (no copy): after an update the engine already
      generates with the new weights, so the push only drops the engine's cached keys / values (``reset_cache``).
    * ``VLLMRollout``: a separate in-process ``VLLMEngine``; after each update the actor's weights are pushed to it
      in buckets by ``zerotir.scale.weight_sync.sync_weights`` (timed as ``time/weight_sync``).

Without tools (``model.tool.max_tool_calls: 0``, the paper's ZeroRL baseline) no sandbox is started or reached.
With a vLLM backend and ``enable_sleep_mode`` (GPU) the engine sleeps (level 2) from the end of each rollout to the
next weight push, so the update has the GPU memory.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import os
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from zerotir.config import HFRollout, PipelineConfig, RolloutBackend, SandboxConfig, ToolConfig, VLLMRollout
from zerotir.rollout.agent_loop import Reward, Schedule
from zerotir.rollout.engine import SamplingParams
from zerotir.rollout.tp_group import TensorParallelGroup
from zerotir.types import Trajectories

log = logging.getLogger(__name__)


class RolloutRuntime:
    """Sandbox + rollout engine of one run; ``start`` before the first rollout, ``close`` at teardown.

    Args:
        backend: the ``model.rollout`` group (which engine, with its settings).
        sandbox: the ``model.sandbox`` group.
        tool: the ``model.tool`` group (without tools no sandbox is started).
        model_path: the HF folder a separate engine loads at start (its weights are replaced by the actor's at once).
        seed: the engine's own seed (requests carry theirs).
        producer_device: ``model.pipeline.producer_device``, where a separate (vLLM) engine runs when not on the
            trainer's device (None without a producer); None: the trainer's.
    """

    def __init__(self, backend: RolloutBackend, sandbox: SandboxConfig, tool: ToolConfig, model_path: str,
                 seed: int = 0, producer_device: str | None = None):
        self.backend = backend
        self.producer_device = producer_device
        self.sandbox_config = sandbox
        self.tool = tool
        self.model_path = model_path
        self.seed = seed
        self.urls: list[str] = []
        self.sandbox: Any = None
        self.engine: Any = None
        self.stale = True  # the engine's weights may differ from the actor's (set after each update and on resume)
        self.asleep = False  # a vLLM engine in sleep mode between its rollout and the next sync
        self.producer: Any = None  # the pipeline's RolloutProducer while it runs (start_producer)
        self._threads_before: int | None = None  # torch's thread count before the producer set its own
        # the ranks sharing this rank's engine (``zerotir.rollout.tp_group``): none until start() builds the group
        self.tp_group = TensorParallelGroup(1)
        self._stack = contextlib.ExitStack()

    @property
    def started(self) -> bool:
        return self.engine is not None

    @property
    def pipelined(self) -> bool:
        """The asynchronous pipeline's producer runs (``start_producer``): rollouts and pushes go through it."""
        return self.producer is not None

    @property
    def schedule(self) -> Schedule:
        """How the tool loop drives the engine (``model.rollout``'s ``schedule`` and round size)."""
        return Schedule(self.backend.schedule, self.backend.round_tokens)

    @property
    def bucket_bytes(self) -> int:
        """Bucket size of a weight push: ``weight_sync_bucket_mb`` of a vLLM backend, else the default."""
        from zerotir.scale.weight_sync import DEFAULT_BUCKET_BYTES

        if isinstance(self.backend, VLLMRollout):
            return self.backend.weight_sync_bucket_mb << 20
        return DEFAULT_BUCKET_BYTES

    def share_rows(self, rows: list[Any]) -> tuple[list[Any], slice]:
        """The rows of every rank sharing this rank's engine (in rank order), and the slice that is this rank's;
        ``rows`` itself without tensor-parallel engines. A collective of the group (see ``rollout``)."""
        return self.tp_group.share_rows(rows)

    def start(self, actor: nn.Module, tokenizer: PreTrainedTokenizerBase, device: Any) -> None:
        """Reach the sandbox (fail fast if it does not answer) and build the engine. Idempotent.

        Both steps are collectives under a process group (every rank starts its runtime at the same hook): a sandbox
        that does not answer one rank, too little free memory for a vLLM engine on one rank's GPU, or an engine that
        fails to build on one rank stops every rank with that rank's error, instead of leaving the others waiting in
        their next collective (vLLM's own start-up all-reduces memory figures over the ranks, so the memory check
        runs, on every rank, before any of them starts building).
        """
        if self.started:
            return
        from zerotir.scale.distributed import fail_together

        separate = isinstance(self.backend, VLLMRollout) and self.producer_device is not None
        engine_device = self.producer_device if separate else device
        with fail_together(Exception):
            if self.tool.enabled:
                self._start_sandbox()
            if isinstance(self.backend, VLLMRollout) and torch.device(engine_device).type == "cuda":
                free, total = torch.cuda.mem_get_info(torch.device(engine_device))
                check_engine_memory(free, total, self.backend.gpu_memory_utilization, engine_device)
        self.tp_group = TensorParallelGroup(self.backend.tensor_parallel_size)
        engine = None
        with fail_together(Exception):
            engine = create_engine(self.backend, actor, tokenizer, engine_device, self.model_path, self.seed)
        self.engine = engine
        self.stale = True

    def _start_sandbox(self) -> None:
        from sandbox import SandboxClient, SandboxUnavailable, local_sandbox

        if self.sandbox_config.urls is None:
            self.urls = list(self._stack.enter_context(local_sandbox(**self.sandbox_config.local_options)))
            log.info("started an embedded local sandbox at %s", ", ".join(self.urls))
        else:
            self.urls = list(self.sandbox_config.urls)
        self.sandbox = SandboxClient(self.urls, **self.sandbox_config.client_options)
        try:
            self.sandbox.check_health()  # SandboxUnavailable names every URL tried and the fix
        except SandboxUnavailable:
            self.close()
            raise

    def rollout(self, tokenizer: PreTrainedTokenizerBase, prompts: list[list[int]], truths: list[str],
                params: SamplingParams, reward: Reward | None = None) -> tuple[Trajectories, dict[str, float]]:
        """Tool-integrated rollouts of ``prompts`` (``params.n`` each), each trajectory scored by ``reward`` as it
        ends (``agent_loop.rollout``); returns trajectories and timings.

        With tensor-parallel engines every rank of a group must call this together with the same prompts (the
        leader's are used: ``share_rows`` merges differing ones first). While the asynchronous pipeline's producer
        runs, the batch runs on its engine (``RolloutProducer.evaluate``, scored by its own reward)."""
        from zerotir.rollout.agent_loop import rollout_sync

        if not self.started:
            raise RuntimeError("RolloutRuntime.rollout before start()")
        if self.asleep:
            raise RuntimeError("RolloutRuntime.rollout: the engine sleeps; call sync(actor) first")
        if self.producer is not None:  # it owns the engine: an evaluation batch after its batch in flight
            return self.producer.evaluate(prompts, truths, params)
        # With a tensor-parallel engine the group's leader runs the tool loop and the other ranks replay its engine
        # calls, so every shard of the engine gets the same requests; all of them return the leader's trajectories.
        out = self.tp_group.rollout(self.engine, lambda engine: rollout_sync(
            engine, tokenizer, self.sandbox, prompts, params, self.tool, truths, self.schedule, reward))
        if isinstance(self.backend, VLLMRollout) and self.backend.enable_sleep_mode:
            # Hand the GPU memory to the update. Level 2 drops the weights too: sync() sends the new ones anyway.
            self.engine.sleep(level=2)
            self.asleep = self.stale = True
        return out

    def sync(self, actor: nn.Module) -> float:
        """Make the engine generate with the actor's current weights; returns the seconds it took."""
        start = time.perf_counter()
        if self.asleep:  # weights first, then the KV cache, to keep the peak low
            self.engine.wake_up(tags=["weights"])
        if isinstance(self.backend, VLLMRollout):
            from zerotir.scale.weight_sync import sync_weights

            sync_weights(actor, self.engine, self.bucket_bytes)
        else:  # the same module object: nothing to copy, but cached keys / values belong to the old weights
            self.engine.reset_cache()
        if self.asleep:
            self.engine.wake_up(tags=["kv_cache"])
            self.asleep = False
        self.stale = False
        return time.perf_counter() - start

    def start_producer(self, actor: nn.Module, tokenizer: PreTrainedTokenizerBase, device: Any,
                       pipeline: PipelineConfig, batches: Callable[[int], list[dict[str, Any]]],
                       params: Callable[[int], SamplingParams], reward: Reward | None, first_step: int,
                       first_batch: int, version: int) -> Any:
        """Start the asynchronous pipeline's ``RolloutProducer`` (``zerotir.rollout.producer``) with its own engine:
        a transformers copy of ``actor`` (on ``pipeline.producer_device``), or this runtime's vLLM engine, handed to
        it with the actor's weights (this runtime's ``rollout`` refuses to run while the producer lives). Torch's
        process-wide thread count becomes ``pipeline.threads`` until ``close``."""
        from zerotir.rollout.producer import RolloutProducer

        if self.producer is not None:
            raise RuntimeError("start_producer: a producer runs already")
        threads = pipeline.threads or max(1, len(os.sched_getaffinity(0)) // 2)
        self._threads_before = torch.get_num_threads()
        torch.set_num_threads(threads)
        if isinstance(self.backend, HFRollout):
            from zerotir.rollout.hf_engine import HFEngine

            model = copy.deepcopy(actor).eval().requires_grad_(False)
            b = self.backend
            engine = HFEngine(model, tokenizer, device=pipeline.producer_device or device,
                              max_batch_size=b.max_batch_size, num_threads=threads, tokens_per_step=b.tokens_per_step)
        else:
            if self.stale or self.asleep:
                self.sync(actor)
            engine = self.engine
        make_sandbox = None
        if self.tool.enabled:
            from sandbox import SandboxClient

            urls, options = list(self.urls), self.sandbox_config.client_options
            make_sandbox = lambda: SandboxClient(urls, **options)  # noqa: E731 - built in the producer's thread
        self.producer = RolloutProducer(
            engine, tokenizer, self.tool, self.schedule, reward,
            make_sandbox, batches, params, pipeline.max_staleness, pipeline.producer_timeout, first_step, first_batch,
            version)
        self.producer.start()
        self.stale = False  # the producer's engine holds the actor's weights; pushes go through it from now on
        log.info("rollout producer started at step %d (batch %d, weights version %d, max_staleness %d, %d torch "
                 "threads)", first_step, first_batch, version, pipeline.max_staleness, threads)
        return self.producer

    def take(self, step: int) -> Any:
        """The producer's batch of RL step ``step`` (``RolloutProducer.take``: a ``Produced``)."""
        if self.producer is None:
            raise RuntimeError("RolloutRuntime.take without a producer; start_producer first")
        return self.producer.take(step)

    def push_weights(self, actor: nn.Module, version: int) -> float:
        """After an update: the actor's weights to the engine that generates next (the producer's, between two of
        its steps, as ``version``; else this runtime's, as ``sync``); returns the seconds it took."""
        if self.producer is None:
            return self.sync(actor)
        from zerotir.scale.weight_sync import sync_weights

        bucket = self.bucket_bytes
        return self.producer.push(lambda engine: sync_weights(actor, engine, bucket), version)

    def close(self) -> None:
        """Stop the producer (if any), the embedded sandbox (if any) and release the engine."""
        if self.producer is not None:
            self.producer.close()
            self.producer = None
        if self._threads_before is not None:
            torch.set_num_threads(self._threads_before)
            self._threads_before = None
        self.sandbox = None
        self.engine = None
        self.asleep = False
        self._stack.close()
        self._stack = contextlib.ExitStack()


def check_engine_memory(free: int, total: int, gpu_memory_utilization: float, device: Any) -> None:
    """Refuse to build a vLLM engine that cannot get its share of ``device``: vLLM takes ``gpu_memory_utilization``
    x total memory and fails at start-up (after other ranks have entered its collectives) when less is free.

    Args:
        free, total: bytes free and in all on the device (``torch.cuda.mem_get_info``).
        gpu_memory_utilization: ``model.rollout.init_args.gpu_memory_utilization``.
        device: the engine's device, named in the message.
    """
    share = gpu_memory_utilization
    wanted = math.ceil(total * share)
    if free < wanted:
        gib = 1 << 30
        raise ValueError(
            f"model.rollout.init_args.gpu_memory_utilization={share}: the vLLM engine on {device} needs "
            f"{wanted / gib:.2f} GiB ({share} x {total / gib:.2f} GiB) but only {free / gib:.2f} GiB are free "
            f"(other processes, or the trainer's models, hold the rest). Lower gpu_memory_utilization to at most "
            f"{math.floor(free / total * 100) / 100}, or free the device")


def create_engine(backend: RolloutBackend, actor: nn.Module, tokenizer: PreTrainedTokenizerBase, device: Any,
                  model_path: str, seed: int) -> Any:
    """The engine ``backend`` names, with its settings (a ``RolloutEngine``)."""
    if isinstance(backend, HFRollout):
        from zerotir.rollout.hf_engine import HFEngine

        return HFEngine(actor, tokenizer, device=device, max_batch_size=backend.max_batch_size,
                        num_threads=backend.num_threads, tokens_per_step=backend.tokens_per_step)
    if isinstance(backend, VLLMRollout):
        from zerotir.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(model_path, dtype=backend.dtype, gpu_memory_utilization=backend.gpu_memory_utilization,
                          enable_sleep_mode=backend.enable_sleep_mode, tensor_parallel_size=backend.tensor_parallel_size,
                          max_model_len=backend.max_model_len, seed=seed, enforce_eager=backend.enforce_eager,
                          cpu_kv_cache_gib=backend.cpu_kv_cache_gib, serving_threads=backend.serving_threads,
                          distributed_executor_backend=backend.distributed_executor_backend, device=device,
                          enable_prefix_caching=backend.enable_prefix_caching, **backend.llm_kwargs)
    raise TypeError(f"model.rollout: {type(backend).__name__} is not a known engine; use zerotir.config.HFRollout or "
                    "zerotir.config.VLLMRollout")
