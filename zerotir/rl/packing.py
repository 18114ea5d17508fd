"""Packed rows (``model.rl.pack_rows``): the trajectories of a micro-batch concatenated into one row without padding,
each attending only to itself, and the per-token outputs put back in the ``(B, T)`` layout of ``zerotir.types``.

One pure function (``pack``) turns the right-padded rows of a micro-batch into the packed row: its token ids, its
``position_ids`` (restarting at 0 with each trajectory, so rotary positions are those of the padded path), its
segment ids (which trajectory each token belongs to) and the index map back to ``(row, column)``. How the model is
told where the segments are depends on its attention implementation (``packed_inputs``):

* ``sdpa`` and ``eager`` (CPU and GPU): a block-diagonal causal 4D mask built from the segment ids, ``(1, 1, N,
  N)``: a query attends to a key of its own segment at or before it. transformers returns a 4D mask as given
  (``masking_utils._preprocess_mask_arguments``); sdpa takes it boolean (True: attend), eager adds it, so it is a
  float32 additive mask there (0 or the float32 minimum: added to bfloat16 scores it promotes them to float32
  before the softmax, which eager computes in float32 anyway).
* ``flash_attention_2`` / ``flash_attention_3`` / ``flash_attention_4`` (GPU): no mask, and the restarting
  ``position_ids`` of the single packed row select transformers' variable-length path
  (``modeling_flash_attention_utils._is_packed_sequence``: batch size 1, positions that restart), which derives the
  cumulative sequence lengths from where the positions are 0 and calls ``flash_attn_varlen_func``: no N x N mask.
* Anything else (``flex_attention``, paged or custom kernels) is refused: with no mask it would attend across
  trajectories without a word.

The implementation is read from the model's transformers config (``config._attn_implementation``, private but the
one place transformers keeps it; ``zerotir.rollout.hf_adapter`` reads it the same way).

Unpacking: the model's outputs over the packed row are computed as for a ``(1, N)`` batch, shifted by one as the
padded path shifts them (the value at ``p`` comes from position ``p - 1``); at the first token of a trajectory that
comes from the previous trajectory's last token, and it lands in column 0 of its row, which the padded path sets to
0 (a prompt token) and so does ``unpack``. Padding columns are 0 too (the padded path scores them, and every user
masks them out).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

__all__ = ["FLASH_IMPLEMENTATIONS", "MASK_IMPLEMENTATIONS", "Packed", "block_causal_mask", "pack", "packed_inputs",
           "unpack"]

MASK_IMPLEMENTATIONS = ("sdpa", "eager")  # take the block-diagonal 4D mask
FLASH_IMPLEMENTATIONS = ("flash_attention_2", "flash_attention_3", "flash_attention_4")  # varlen from position_ids


@dataclass(frozen=True)
class Packed:
    """One packed row of ``N`` tokens and the way back to the ``(B, T)`` micro-batch it came from."""

    input_ids: Tensor  # (1, N)
    position_ids: Tensor  # (1, N): 0, 1, ... within each trajectory
    segment_ids: Tensor  # (N,): the micro-batch row of each packed token
    columns: Tensor  # (N,): its column in that row
    shape: tuple[int, int]  # (B, T) of the micro-batch


def pack(input_ids: Tensor, attention_mask: Tensor) -> Packed:
    """The right-padded rows ``input_ids`` / ``attention_mask`` ``(B, T)`` as one row of their real tokens, in row
    order (a pure function of its inputs). A row with no real token keeps one (its column 0), so every row has a
    segment and a position 0 in the packed row."""
    if input_ids.shape != attention_mask.shape or input_ids.dim() != 2:
        raise ValueError(f"pack: input_ids {tuple(input_ids.shape)} and attention_mask "
                         f"{tuple(attention_mask.shape)} must be the same (B, T)")
    real = attention_mask.bool().clone()
    real[~real.any(1), 0] = True
    lengths = real.sum(1)
    if not torch.equal(real, torch.arange(real.shape[1], device=real.device)[None, :] < lengths[:, None]):
        raise ValueError("pack: rows must be right-padded (every real token before the first padding column)")
    segment_ids, columns = real.nonzero(as_tuple=True)  # row-major: row 0's tokens, then row 1's, ...
    return Packed(input_ids=input_ids[segment_ids, columns][None, :], position_ids=columns[None, :],
                  segment_ids=segment_ids, columns=columns, shape=(input_ids.shape[0], input_ids.shape[1]))


def unpack(packed: Packed, values: Tensor) -> Tensor:
    """Per-token ``values`` ``(1, N)`` of the packed row back in the ``(B, T)`` layout: 0 in column 0 (its value
    came from the previous trajectory) and in the padding columns."""
    out = values.new_zeros(packed.shape)
    keep = packed.columns > 0
    out[packed.segment_ids[keep], packed.columns[keep]] = values[0][keep]
    return out


def block_causal_mask(segment_ids: Tensor) -> Tensor:
    """``(1, 1, N, N)`` booleans, True where query ``i`` may attend key ``j``: the same segment and ``j <= i``."""
    same = segment_ids[:, None] == segment_ids[None, :]
    causal = torch.ones_like(same).tril()
    return (same & causal)[None, None]


def packed_inputs(model: nn.Module, packed: Packed) -> dict[str, Tensor | None]:
    """The keyword arguments of ``model``'s forward (``input_ids``, ``attention_mask``, ``position_ids``) that keep
    each trajectory of ``packed`` to itself under the model's attention implementation (see the module docstring);
    an implementation without such a path is refused."""
    implementation = model.config._attn_implementation
    inputs: dict[str, Tensor | None] = {"input_ids": packed.input_ids, "position_ids": packed.position_ids}
    if implementation in FLASH_IMPLEMENTATIONS:
        inputs["attention_mask"] = None
    elif implementation == "sdpa":
        inputs["attention_mask"] = block_causal_mask(packed.segment_ids)
    elif implementation == "eager":
        allowed = block_causal_mask(packed.segment_ids)
        zero = torch.zeros((), dtype=torch.float32, device=allowed.device)
        inputs["attention_mask"] = torch.where(allowed, zero, torch.finfo(torch.float32).min)
    else:
        raise ValueError(f"model.rl.pack_rows=true: the model's attention implementation {implementation!r} has no "
                         f"path that keeps packed trajectories apart (it would attend across them); load the model "
                         f"with attn_implementation one of {MASK_IMPLEMENTATIONS + FLASH_IMPLEMENTATIONS}, or set "
                         f"model.rl.pack_rows: false")
    return inputs
