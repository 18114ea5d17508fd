"""Weights into a running vLLM engine: vLLM's in-place layerwise reload run inside its worker, and the checks around it.

vLLM fuses some HF tensors into one layer (``q_proj``/``k_proj``/``v_proj`` into ``qkv_proj``, ``gate_proj``/``up_proj``
into ``gate_up_proj``) and rebuilds a fused layer only when *all* its parts arrive in the same reload; ``PackedTracker``
watches the names of one reload and raises, naming the layer, when a call held only some parts. vLLM is imported only
inside these functions (``zerotir.rollout.vllm_engine`` uses them).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch

from zerotir.rollout.vllm_lora import registered_adapter, restore_adapter

# vLLM's reload logs these for every layer *outside* the tensors of one call; partial calls are our normal case.
_RELOAD_LOGGERS = ("vllm.model_executor.model_loader.reload.layerwise",
                   "vllm.model_executor.model_loader.reload.inplace")
_RELOAD_NOISE = ("%s: Failed to load weights", "Following weights were not loaded from checkpoint")


def reload_in_worker(worker: Any, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
    """Run inside the worker: vLLM's in-place ``reload_weights``; if loading fails half way (a bad name or shape),
    finish the reload before re-raising, so that the layers are not left on the meta device (which would break
    every later ``generate``) and a following full ``update_weights`` repairs the engine. A LoRA engine's adapter,
    which vLLM's reload unregisters, is registered again either way (``vllm_lora.restore_adapter``)."""
    adapter = registered_adapter(worker)
    try:
        worker.reload_weights(weights_iterator=weights)
    except BaseException:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        runner = worker.model_runner
        with set_current_vllm_config(worker.vllm_config):
            finalize_layerwise_reload(runner.get_model(), runner.model_config)
        raise
    finally:
        restore_adapter(worker, adapter)


def packed_modules(llm: Any) -> dict[str, list[str]]:
    """The model's map of fused vLLM module -> HF parts, e.g. ``{"qkv_proj": ["q_proj", "k_proj", "v_proj"]}``."""
    found = llm.apply_model(lambda model: dict(getattr(model, "packed_modules_mapping", {}) or {}))
    return {k: list(v) for k, v in found[0].items()} if found else {}


class PackedTracker:
    """Watches the names streamed into one reload and reports fused layers that got only some of their parts."""

    def __init__(self, packed_modules: dict[str, list[str]]):
        self.part_to_fused = {part: fused for fused, parts in packed_modules.items() for part in parts}
        self.packed_modules = packed_modules
        self.seen: dict[str, set[str]] = {}  # fused layer name -> parts seen

    def watch(self, stream: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in stream:
            if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
                raise TypeError(f"update_weights expects (name: str, tensor: Tensor) pairs, got ({type(name).__name__},"
                                f" {type(tensor).__name__})")
            parts = name.split(".")
            for i, part in enumerate(parts):
                if part in self.part_to_fused:
                    fused = ".".join(parts[:i] + [self.part_to_fused[part]] + parts[i + 1:])
                    self.seen.setdefault(fused, set()).add(part)
                    break
            yield name, tensor

    def check(self) -> None:
        for fused, seen in self.seen.items():
            parts = self.packed_modules[_fused_part(fused, self.packed_modules)]
            if set(parts) - seen:
                raise ValueError(
                    f"update_weights: {fused} got only {sorted(seen)} of {parts} in this call. vLLM rebuilds a fused "
                    "layer only from all its parts in one call, so that layer now holds invalid values; send the "
                    "whole layer in one call (zerotir.parallel.weight_sync buckets whole decoder layers).")


def _fused_part(fused_name: str, packed_modules: dict[str, list[str]]) -> str:
    return next(p for p in fused_name.split(".") if p in packed_modules)


class _DropReloadNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_RELOAD_NOISE)


@contextlib.contextmanager
def quiet_reload_logs() -> Iterator[None]:
    """Drop vLLM's per-layer "not loaded" warnings during one partial reload (see ``_RELOAD_NOISE``)."""
    noise = _DropReloadNoise()
    loggers = [logging.getLogger(name) for name in _RELOAD_LOGGERS]
    for logger in loggers:
        logger.addFilter(noise)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(noise)
