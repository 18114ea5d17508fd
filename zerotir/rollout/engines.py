"""Building a rollout engine from its config group: one typed factory, dispatched on the group's class.

``model.rollout`` is a ``class_path`` (``zerotir.config.HFRollout`` or ``zerotir.config.VLLMRollout``), so the engine
a run gets is decided by that group's type, here and nowhere else: ``create_engine(group, ...)`` is a
``functools.singledispatch`` function with one registered builder per group. A new engine is a new config group plus
one ``@create_engine.register`` builder; the rollout sources only ever hold a ``RolloutEngine``.

Also here, dispatched the same way: what an engine checks before any rank builds one (``check_engine_fits``: a vLLM
engine's free GPU memory, ``check_engine_memory``), kept apart from the build so that every rank runs it before any
rank enters vLLM's own start-up collectives.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from zerotir.config import HFRollout, RolloutBackend, VLLMRollout
from zerotir.rollout.engine import RolloutEngine


@functools.singledispatch
def create_engine(backend: RolloutBackend, actor: nn.Module, tokenizer: PreTrainedTokenizerBase, device: Any,
                  model_path: str, seed: int, threads: int | None = None) -> RolloutEngine:
    """The engine ``backend`` (a ``model.rollout`` group) names, with its settings.

    Args:
        backend: the checked config group; its type picks the builder. A LoRA run's group carries the adapter rank
            (``VLLMRollout.lora_rank``, from ``model.base.lora.rank``: ``RolloutBackend.for_lora``): a vLLM engine is
            started to serve adapters of that rank (each push then moves the adapter only); a transformers engine
            takes adapters of any rank as it is.
        actor: the module a transformers engine generates with (the trained actor itself, or an engine host's own
            model, loaded from the folder).
        tokenizer: the model's tokenizer.
        device: where the engine runs.
        model_path: the HF folder a separate engine (vLLM) loads at start; its weights are replaced by the actor's
            with the first ``load_weights_from``.
        seed: the engine's own seed (requests carry theirs).
        threads: torch threads a transformers engine decodes on when its group leaves ``num_threads`` unset (an
            engine host's: ``model.hosts.threads``); a vLLM engine keeps its
            ``serving_threads``.
    """
    raise TypeError(f"model.rollout: {type(backend).__name__} is not a known engine; use zerotir.config.HFRollout or "
                    "zerotir.config.VLLMRollout")


@create_engine.register
def _hf_engine(backend: HFRollout, actor: nn.Module, tokenizer: PreTrainedTokenizerBase, device: Any,
               model_path: str, seed: int, threads: int | None = None) -> RolloutEngine:
    from zerotir.rollout.hf_engine import HFEngine

    return HFEngine(actor, tokenizer, device=device, max_batch_size=backend.max_batch_size,
                    num_threads=backend.num_threads if backend.num_threads is not None else threads,
                    tokens_per_step=backend.tokens_per_step)


@create_engine.register
def _vllm_engine(backend: VLLMRollout, actor: nn.Module, tokenizer: PreTrainedTokenizerBase, device: Any,
                 model_path: str, seed: int, threads: int | None = None) -> RolloutEngine:
    from zerotir.rollout.vllm_engine import VLLMEngine

    return VLLMEngine(model_path, dtype=backend.dtype, gpu_memory_utilization=backend.gpu_memory_utilization,
                      enable_sleep_mode=backend.enable_sleep_mode, tensor_parallel_size=backend.tensor_parallel_size,
                      max_model_len=backend.max_model_len, seed=seed, enforce_eager=backend.enforce_eager,
                      cpu_kv_cache_gib=backend.cpu_kv_cache_gib, serving_threads=backend.serving_threads,
                      distributed_executor_backend=backend.distributed_executor_backend, device=device,
                      enable_prefix_caching=backend.enable_prefix_caching,
                      weight_sync_bucket_mb=backend.weight_sync_bucket_mb, lora_rank=backend.lora_rank,
                      **backend.llm_kwargs)


@functools.singledispatch
def check_engine_fits(backend: RolloutBackend, device: Any) -> None:
    """Before any rank builds its engine: refuse one that cannot start on ``device`` (every rank runs this, and the
    failure of one is raised on all, before vLLM's start-up collectives could leave the others waiting)."""


@check_engine_fits.register
def _vllm_fits(backend: VLLMRollout, device: Any) -> None:
    if torch.device(device).type == "cuda":
        free, total = torch.cuda.mem_get_info(torch.device(device))
        check_engine_memory(free, total, backend.gpu_memory_utilization, device)


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
