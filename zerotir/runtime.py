"""What a run needs besides its models: the sandbox (configured URLs or an embedded local server), the rollout engine
(transformers or vLLM) and the weight sync between the trained actor and that engine.

Backends:
    * ``hf`` wraps the actor module itself (no copy): after an update the engine already generates with the new
      weights, so the weight sync only drops the engine's cached keys / values (they belong to the old weights).
    * ``vllm`` runs a separate in-process vLLM engine; after each update the actor's weights are pushed to it in
      buckets by ``zerotir.weight_sync.sync_weights`` (timed as ``time/weight_sync``). With
      ``engine_kwargs.enable_sleep_mode`` (GPU) the engine sleeps (level 2) from the end of each rollout to the next
      sync, so the update has the GPU memory.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

from torch import nn
from transformers import PreTrainedTokenizerBase

from zerotir.rollout.engine import SamplingParams
from zerotir.rollout.tp_group import TensorParallelGroup
from zerotir.types import Trajectories

log = logging.getLogger(__name__)

BACKENDS = ("hf", "vllm")


class RolloutRuntime:
    """Sandbox + rollout engine of one run; ``start`` before the first rollout, ``close`` at teardown.

    Args:
        backend: "hf" or "vllm".
        model_path: the HF folder the vLLM engine loads at start (its weights are replaced by the actor's at once).
        sandbox_urls: sandbox servers; None starts an embedded local sandbox for the run.
        engine_kwargs: extra keyword arguments of the engine class (e.g. ``max_batch_size`` for HF,
            ``gpu_memory_utilization`` for vLLM).
        weight_sync_bucket_mb: bucket size of the vLLM weight sync.
        sandbox_kwargs: extra keyword arguments of ``SandboxClient`` (``max_concurrency``, ``retries``, ...).
        local_sandbox_options: keyword arguments of ``sandbox.local_sandbox`` for the embedded server
            (``workers``, ``run_timeout``, ...).
    """

    def __init__(self, backend: str = "hf", model_path: str | None = None, sandbox_urls: Sequence[str] | None = None,
                 engine_kwargs: dict[str, Any] | None = None, weight_sync_bucket_mb: int = 256,
                 sandbox_kwargs: dict[str, Any] | None = None, local_sandbox_options: dict[str, Any] | None = None):
        if backend not in BACKENDS:
            raise ValueError(f"rollout_backend={backend!r}: choose one of {BACKENDS}")
        self.backend = backend
        self.model_path = model_path
        self.configured_urls = list(sandbox_urls) if sandbox_urls else None
        self.engine_kwargs = dict(engine_kwargs or {})
        self.bucket_bytes = int(weight_sync_bucket_mb) << 20
        self.sandbox_kwargs = dict(sandbox_kwargs or {})
        self.local_sandbox_options = dict(local_sandbox_options or {})
        self.urls: list[str] = []
        self.sandbox: Any = None
        self.engine: Any = None
        self.stale = True  # the engine's weights may differ from the actor's (set after each update and on resume)
        self.asleep = False  # a vLLM engine in sleep mode between its rollout and the next sync
        # the ranks sharing this rank's engine (``zerotir.rollout.tp_group``): none until start() builds the group
        self.tp_group = TensorParallelGroup(1)
        self._stack = contextlib.ExitStack()

    @property
    def started(self) -> bool:
        return self.engine is not None

    @property
    def tensor_parallel_size(self) -> int:
        """Ranks per engine: ``engine_kwargs.tensor_parallel_size`` of the vLLM backend, else 1."""
        return int(self.engine_kwargs.get("tensor_parallel_size", 1)) if self.backend == "vllm" else 1

    def share_rows(self, rows: list[Any]) -> tuple[list[Any], slice]:
        """The rows of every rank sharing this rank's engine (in rank order), and the slice that is this rank's;
        ``rows`` itself without tensor-parallel engines. A collective of the group (see ``rollout``)."""
        return self.tp_group.share_rows(rows)

    def start(self, actor: nn.Module, tokenizer: PreTrainedTokenizerBase, device: Any) -> None:
        """Reach the sandbox (fail fast if it does not answer) and build the engine. Idempotent.

        The sandbox check is a collective under a process group (every rank starts its runtime at the same hook): a
        sandbox that does not answer one rank stops every rank with that rank's error, instead of leaving the others
        waiting in their first collective.
        """
        if self.started:
            return
        from zerotir.distributed import fail_together

        with fail_together(Exception):
            self._start_sandbox()
        self.tp_group = TensorParallelGroup(self.tensor_parallel_size)
        if self.backend == "hf":
            from zerotir.rollout.hf_engine import HFEngine

            self.engine = HFEngine(actor, tokenizer, device=device, **self.engine_kwargs)
        else:
            from zerotir.rollout.vllm_engine import VLLMEngine

            if self.model_path is None:
                raise ValueError("rollout_backend='vllm' needs model_path (the HF folder vLLM loads)")
            self.engine = VLLMEngine(self.model_path, device=device, **self.engine_kwargs)
        self.stale = True

    def _start_sandbox(self) -> None:
        from sandbox import SandboxClient, SandboxUnavailable, local_sandbox

        if self.configured_urls is None:
            self.urls = list(self._stack.enter_context(local_sandbox(**self.local_sandbox_options)))
            log.info("started an embedded local sandbox at %s", ", ".join(self.urls))
        else:
            self.urls = list(self.configured_urls)
        self.sandbox = SandboxClient(self.urls, **self.sandbox_kwargs)
        try:
            self.sandbox.check_health()  # SandboxUnavailable names every URL tried and the fix
        except SandboxUnavailable:
            self.close()
            raise

    def rollout(self, tokenizer: PreTrainedTokenizerBase, prompts: list[list[int]], truths: list[str],
                params: SamplingParams, tool: Any) -> tuple[Trajectories, dict[str, float]]:
        """Tool-integrated rollouts of ``prompts`` (``params.n`` each); returns trajectories and timings.

        With tensor-parallel engines every rank of a group must call this together with the same prompts (the
        leader's are used: ``share_rows`` merges differing ones first)."""
        from zerotir.rollout.agent_loop import rollout_sync

        if not self.started:
            raise RuntimeError("RolloutRuntime.rollout before start()")
        if self.asleep:
            raise RuntimeError("RolloutRuntime.rollout: the engine sleeps; call sync(actor) first")
        # With a tensor-parallel engine the group's leader runs the tool loop and the other ranks replay its engine
        # calls, so every shard of the engine gets the same requests; all of them return the leader's trajectories.
        out = self.tp_group.rollout(
            self.engine, lambda engine: rollout_sync(engine, tokenizer, self.sandbox, prompts, params, tool, truths))
        if getattr(self.engine, "sleep_mode", False):
            # Hand the GPU memory to the update. Level 2 drops the weights too: sync() sends the new ones anyway.
            self.engine.sleep(level=2)
            self.asleep = self.stale = True
        return out

    def sync(self, actor: nn.Module) -> float:
        """Make the engine generate with the actor's current weights; returns the seconds it took."""
        start = time.perf_counter()
        if self.backend == "hf":
            # Same module object: nothing to copy, but cached prefixes hold keys / values of the old weights.
            self.engine.update_weights({})
        else:
            from zerotir.weight_sync import sync_weights

            if self.asleep:  # weights first, then the KV cache, to keep the peak low
                self.engine.wake_up(tags=["weights"])
            sync_weights(actor, self.engine, self.bucket_bytes)
            if self.asleep:
                self.engine.wake_up(tags=["kv_cache"])
                self.asleep = False
        self.stale = False
        return time.perf_counter() - start

    def close(self) -> None:
        """Stop the embedded sandbox (if any) and release the engine."""
        self.sandbox = None
        self.engine = None
        self.asleep = False
        self._stack.close()
        self._stack = contextlib.ExitStack()
