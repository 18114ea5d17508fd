"""The weights half of the vLLM engine: new weights in place, LoRA adapters, the KV-cache reset after either, and
sleep mode around a training update. ``VLLMWeights`` is a base of ``zerotir.rollout.vllm_engine.VLLMEngine``, which
builds the ``vllm.LLM`` and holds the generation half.

Weight updates run the worker's ``reload_weights`` (vLLM's in-place layerwise reload) through ``collective_rpc`` with
a function (``vllm_reload.reload_in_worker``, which also cleans up after a failed load and puts back the LoRA adapter
vLLM's reload unregisters), then ``reset_cache``: the prefix cache is dropped *with* the running requests' blocks
(vLLM preempts them; they recompute their prompt and the tokens sampled so far under the new weights and go on
sampling), because vLLM refuses to reset a cache any running request holds a block of, and the usual state of a push
into a streaming engine host is requests running. vLLM fuses some HF tensors into one layer (``q_proj``/``k_proj``/
``v_proj`` into ``qkv_proj``, ``gate_proj``/``up_proj`` into ``gate_up_proj``) and rebuilds a fused layer only when
*all* its parts arrive in the same reload; a part sent alone leaves that layer with uninitialised memory. So every
``update_weights`` call must hold whole layers (``zerotir.parallel.weight_sync`` buckets whole decoder layers); a call
that splits one raises after the fact, naming the layer, instead of generating garbage silently. With ``lora_rank``
the engine keeps its base weights and a push swaps only the LoRA adapter (``zerotir.rollout.vllm_lora``).

Sleep level (``zerotir.parallel.memory_plan.sleep_level``, the one the memory plan counts with): a full-weight engine
sleeps at level 2 (weights and KV cache freed; the push after the update rewrites every weight). A LoRA engine
sleeps at level 1: vLLM copies its weights to CPU memory and restores them on wake, because its push carries the
adapter only, and at level 2 it would decode with that adapter on freed memory.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from zerotir.rollout.engine import AdapterPath, torch_threads
from zerotir.rollout.vllm_lora import actor_adapter, adapter_request, load_adapter_in_worker
from zerotir.rollout.vllm_reload import PackedTracker, quiet_reload_logs, reload_in_worker
from zerotir.parallel.memory_plan import sleep_level


class VLLMWeights:
    """The weight methods of ``VLLMEngine`` (``EngineWeights``, the protocol's weights half). The engine sets the attributes read
    here: ``llm`` (the ``vllm.LLM``), ``packed_modules``, ``bucket_bytes``, ``lora_rank``, ``sleep_mode``,
    ``serving_threads``, ``cuda_index``, ``_asleep`` and ``_adapter`` (the requests' ``LoRARequest``, None until the
    first ``update_adapter``)."""

    llm: Any
    packed_modules: dict[str, list[str]]
    bucket_bytes: int
    lora_rank: int | None
    sleep_mode: bool
    serving_threads: int | None
    cuda_index: int | None
    _asleep: bool
    _adapter: Any

    def reset_cache(self) -> None:
        """Drop every cached key / value: the prefix cache, and the blocks of the running requests, which vLLM
        preempts; they recompute their ids (prompt + tokens sampled so far) with the current weights at their next
        step and go on sampling (module doc).

        Raises:
            RuntimeError: vLLM refused the reset (it returns False, e.g. a request waiting for remote keys / values);
                the cache may then serve keys / values of other weights, so the engine must not go on.
        """
        if not self.llm.reset_prefix_cache(reset_running_requests=True):
            raise RuntimeError("VLLMEngine.reset_cache: vLLM refused to reset its prefix cache, so it would serve keys"
                               " / values computed under the previous weights; stop the run (see vLLM's log)")

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor]) -> None:
        """Load ``(HF name, tensor)`` pairs into the engine in place, then drop every cached key / value
        (``reset_cache``: running requests recompute theirs under the new weights). A LoRA engine keeps serving its
        adapter over the new base.

        The iterable is consumed lazily inside vLLM's reload, so a generator that gathers tensors on the fly never
        has more than what vLLM holds to finish one layer. No reference is kept after the call. Each call must
        contain every part of the layers it touches (module docstring); tensors may be any dtype / device.

        Raises:
            ValueError: the call held only some parts of a fused layer (that layer is now invalid; resend it whole),
                or (from vLLM) a name the model does not have.
            RuntimeError: (from vLLM) a tensor whose shape does not fit (after any error the layers loaded before it
                hold new values and the others old ones: send all weights again); the cache reset was refused.
        """
        items = iter(named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)
        first = next(items, None)
        if first is not None:
            tracker = PackedTracker(self.packed_modules)
            stream = tracker.watch(itertools.chain([first], items))
            with quiet_reload_logs(), self._computing():
                self.llm.collective_rpc(reload_in_worker, args=(stream,))
            tracker.check()
        self.reset_cache()

    def update_adapter(self, tensors: Mapping[str, torch.Tensor], config: dict[str, Any]) -> None:
        """Serve every request from now on through this LoRA adapter (peft-named ``tensors``, ``config`` from
        ``vllm_lora.adapter_config``) over the base weights, then drop every cached key / value (``reset_cache``:
        running requests recompute theirs under the new adapter). The tensors go to the worker by reference. Raises
        RuntimeError without ``lora_rank``, ValueError for an adapter vLLM cannot serve (``load_adapter_in_worker``).
        """
        if self.lora_rank is None:
            raise RuntimeError("VLLMEngine.update_adapter: the engine was started without lora_rank, so it serves no "
                               "adapter; start it with lora_rank=<the adapter's rank>")
        with self._computing():
            self.llm.collective_rpc(load_adapter_in_worker, args=(tensors, config))
        self._adapter = adapter_request()
        self.reset_cache()

    def adapter_path(self, actor: torch.nn.Module | None) -> AdapterPath:
        """"adapter" when started with ``lora_rank`` (``update_adapter``), else "merged" (``merged_lora_bucket``)."""
        return "adapter" if self.lora_rank is not None else "merged"

    def load_weights_from(self, actor: torch.nn.Module) -> None:
        """Generate with ``actor``'s weights from now on: sent in buckets of whole layers (``sync_weights``), with
        ``lora_rank`` its adapter only (``update_adapter``). A sleeping engine wakes its weights (a LoRA engine's
        come back from CPU memory, ``memory_plan.sleep_level``), then its KV cache."""
        from zerotir.parallel.weight_sync import sync_weights

        if self._asleep:
            self.llm.wake_up(tags=["weights"])
        if self.lora_rank is not None:
            with actor_adapter(actor) as adapter:
                self.update_adapter(*adapter)
        else:
            sync_weights(actor, self, self.bucket_bytes)
        if self._asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self._asleep = False

    def rest(self) -> None:
        """Between a rollout and the next ``load_weights_from``: with ``enable_sleep_mode`` (CUDA) the engine sleeps
        at ``sleep_level`` (KV cache dropped; weights dropped, or kept in CPU memory under LoRA), so the update has
        the GPU memory; without it nothing changes."""
        if self.sleep_mode:
            self.llm.sleep(level=sleep_level(self.lora_rank))
            self._asleep = True

    @contextlib.contextmanager
    def _computing(self) -> Iterator[None]:
        """Around the engine's work: its torch threads, and its GPU as the current device (vLLM's streams and
        kernels follow the current device, and the calling thread's, a trainer's or an engine host's, may differ)."""
        on_gpu = torch.cuda.device(self.cuda_index) if self.cuda_index is not None else contextlib.nullcontext()
        with torch_threads(self.serving_threads), on_gpu:
            yield
