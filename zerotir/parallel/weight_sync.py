"""Pushing the trained actor's weights into a rollout engine, a bucket of whole layers at a time.

Under DeepSpeed ZeRO-3 each rank holds only a shard of every parameter. ``iter_bucketed_params`` gathers one bucket
(whole decoder layers up to ``bucket_bytes``) with ``deepspeed.zero.GatheredParameters``, yields it, and frees it
before gathering the next, so the full model never exists at once on any rank; the peak is one bucket (or one layer,
if a layer is larger than a bucket). A plain module (no ZeRO-3, ZeRO-1/2, DDP, CPU) is read in place, no copy.

Buckets hold whole layers because vLLM fuses some tensors of a layer (q/k/v, gate/up) and can rebuild a fused
layer only from all of its parts in one update call (see ``zerotir.rollout.vllm_engine``).

Under ZeRO-3 the gather is a collective: every rank must run ``sync_weights`` (or iterate the buckets) together,
in the same order, each feeding its own colocated engine.

Names are mapped to the HF model's own names (``model.layers.0.self_attn.q_proj.weight``): training wrappers
(``module.``, ``_forward_module.``, ``_orig_mod.``, FSDP / checkpoint wrappers) are dropped, and ``prefix`` selects
and strips the actor inside a larger module (``"actor."`` in a LightningModule, ``"pretrained_model."`` in a
value-head wrapper); parameters outside the prefix (critic, value head, reference model) are left out.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any, Protocol

import torch
from torch import nn

from zerotir.lora import is_adapted

DEFAULT_BUCKET_BYTES = 256 << 20
# Leading wrapper attributes (DeepSpeedEngine / DDP ``module``, Lightning ``_forward_module``, torch.compile
# ``_orig_mod``), stripped at the start of a name only: "module" may be a real attribute deeper in a model.
_LEADING_WRAPPERS = ("module", "_forward_module", "_orig_mod")
# Wrapper attributes that FSDP / activation checkpointing insert anywhere in the path.
_INNER_WRAPPERS = ("_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod")

Bucket = list[tuple[str, torch.Tensor]]


class WeightReceiver(Protocol):
    """What ``sync_weights`` needs from an engine (``VLLMEngine``, ``HFEngine``)."""

    def update_weights(self, named_tensors: Bucket) -> None: ...


def hf_name(name: str, prefix: str = "") -> str | None:
    """The HF parameter name of a (possibly wrapped) parameter name, or None when it lies outside ``prefix``.

    Args:
        name: the name from ``named_parameters()`` of the module given to the sync.
        prefix: the actor's attribute path inside that module, with its trailing dot (``"actor."``); "" keeps all.

    Examples:
        ``hf_name("_forward_module.actor.model.norm.weight", "actor.") == "model.norm.weight"``;
        ``hf_name("module.critic.value_head.weight", "actor.") is None``.
    """
    if prefix and not prefix.endswith("."):
        raise ValueError(f"prefix={prefix!r}: must end with '.' (e.g. 'actor.') or be ''")
    parts = name.split(".")
    while parts and parts[0] in _LEADING_WRAPPERS:
        parts = parts[1:]
    parts = [p for p in parts if p not in _INNER_WRAPPERS]
    clean = ".".join(parts)
    if not clean.startswith(prefix):
        return None
    return clean[len(prefix):]


def layer_key(name: str) -> str:
    """The layer a parameter belongs to: the path up to its first numeric component (``model.layers.3``), else its
    module (``model.embed_tokens``, ``lm_head``). Parameters with the same key always share a bucket."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return ".".join(parts[:-1]) or name


def is_zero3_partitioned(param: torch.Tensor) -> bool:
    """Whether DeepSpeed ZeRO-3 manages ``param`` (its local tensor is then a shard, often of shape (0,))."""
    return hasattr(param, "ds_id")


def param_nbytes(param: torch.Tensor) -> int:
    """Bytes of the full parameter (the gathered size under ZeRO-3, not the local shard)."""
    numel = param.ds_numel if is_zero3_partitioned(param) else param.numel()
    return int(numel) * param.element_size()


def plan_buckets(model: nn.Module, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 prefix: str = "") -> list[list[tuple[str, nn.Parameter]]]:
    """Group the selected parameters into buckets of whole layers, in model order.

    A bucket takes whole layers while it stays within ``bucket_bytes``; a layer larger than that forms a bucket of
    its own. Tied parameters appear once (``named_parameters`` drops duplicates).

    Raises:
        ValueError: ``bucket_bytes`` < 1, or no parameter lies under ``prefix``.
    """
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes={bucket_bytes}: must be >= 1 (e.g. 256 MiB = {DEFAULT_BUCKET_BYTES})")
    layers: dict[str, list[tuple[str, nn.Parameter]]] = {}
    for name, param in model.named_parameters():
        mapped = hf_name(name, prefix)
        if mapped is not None:
            layers.setdefault(layer_key(mapped), []).append((mapped, param))
    if not layers:
        sample = [n for n, _ in list(model.named_parameters())[:3]]
        raise ValueError(f"prefix={prefix!r} selects no parameter of {type(model).__name__} (its names start like "
                         f"{sample}); pass the actor's attribute path, e.g. prefix='actor.'")
    buckets: list[list[tuple[str, nn.Parameter]]] = []
    size = 0
    for members in layers.values():
        layer_bytes = sum(param_nbytes(p) for _, p in members)
        if not buckets or size + layer_bytes > bucket_bytes:
            buckets.append([])
            size = 0
        buckets[-1].extend(members)
        size += layer_bytes
    return buckets


def iter_bucketed_params(model: nn.Module, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                         prefix: str = "") -> Iterator[Bucket]:
    """Yield the model's parameters as buckets of ``(HF name, full tensor)``, one gathered bucket at a time.

    The tensors of a bucket are valid until the next bucket is requested: under ZeRO-3 they are the gathered
    parameters and are released (re-partitioned) when the generator resumes; ``.clone()`` what must outlive that.
    On a plain module they are the parameters themselves (detached), not copies.

    Args:
        model: the trained model, a wrapper around it (DeepSpeedEngine, LightningModule), or a ZeRO-3 module.
        bucket_bytes: target bucket size in bytes (full, gathered sizes).
        prefix: the actor's attribute path inside ``model`` (see ``hf_name``).
    """
    adapted = model if is_adapted(model) else None  # a LoRA actor: its buckets are sent merged
    for bucket in plan_buckets(model, bucket_bytes, prefix):
        params = [p for _, p in bucket]
        with _gathered(params):
            named = [(name, p.detach()) for name, p in bucket]
            yield named if adapted is None else merged_lora_bucket(adapted, named)


def merged_lora_bucket(model: Any, bucket: Bucket) -> Bucket:
    """A bucket of a ``peft.PeftModel``'s parameters as the plain model's: each adapted layer's weight with its
    adapter's update added (peft's ``get_delta_weight``: scaled ``B @ A``), the adapter tensors left out, the names
    without peft's ``base_model.model.`` / ``.base_layer``. The model is not changed. A layer's adapters share its
    bucket (``layer_key``), so under ZeRO-3 they are gathered with it."""
    root, out = "base_model.model.", []
    for name, tensor in bucket:
        if ".lora_" in name:
            continue
        module, _, leaf = name.rpartition(".")
        if module.endswith(".base_layer"):
            module = module[: -len(".base_layer")]
            if leaf == "weight":
                layer = model.get_submodule(module)
                tensor = tensor + layer.get_delta_weight(layer.active_adapters[0]).to(tensor.dtype)
        full = f"{module}.{leaf}"
        out.append((full[len(root):] if full.startswith(root) else full, tensor))
    return out


def _gathered(params: list[nn.Parameter]) -> Any:
    """Gather the ZeRO-3 partitioned ``params`` for the duration of the block (read only); no-op otherwise."""
    partitioned = [p for p in params if is_zero3_partitioned(p)]
    if not partitioned:
        return contextlib.nullcontext()
    import deepspeed

    # modifier_rank=None: read-only, nothing is broadcast back when the block ends.
    return deepspeed.zero.GatheredParameters(partitioned, modifier_rank=None)


def sync_weights(model: nn.Module, engine: WeightReceiver, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 prefix: str = "") -> dict[str, float]:
    """Copy the model's current weights into ``engine``, calling ``engine.update_weights`` once per bucket.

    Args:
        model: see ``iter_bucketed_params``.
        engine: anything with ``update_weights`` (the rollout engines).
        bucket_bytes: bucket size in bytes; the peak extra memory of a ZeRO-3 sync is about one bucket.
        prefix: the actor's attribute path inside ``model``.

    Returns:
        ``{"seconds": wall time, "bytes": bytes sent, "buckets": number of calls, "tensors": tensors sent}``; the
        caller logs ``seconds`` as ``metric_names.TIME_WEIGHT_SYNC``.
    """
    start = time.perf_counter()
    stats = {"bytes": 0, "buckets": 0, "tensors": 0}
    with torch.no_grad():
        for bucket in iter_bucketed_params(model, bucket_bytes, prefix):
            engine.update_weights(bucket)
            stats["buckets"] += 1
            stats["tensors"] += len(bucket)
            stats["bytes"] += sum(t.numel() * t.element_size() for _, t in bucket)
    return {"seconds": time.perf_counter() - start, **stats}
