"""Every transformers internal the decode session relies on, in one place: ``DecodeSession`` calls only this module.

The session (``hf_session``) keeps one batch of ragged rows: its keys / values live in buffers it indexes itself,
and it builds its own masks. transformers has no public API for that, so the session leans on internals that a
release may move; they are all here, and ``tests/rollout/test_hf_adapter.py`` checks each one by name:

* ``transformers.cache_utils.DynamicLayer``, subclassed (``_RaggedLayer``): its ``update`` writes every row at its
  own columns; ``transformers.cache_utils.Cache(layers=...)`` holds the layers and passes each attention module's
  keys / values to ``layer.update``; the layer sets the attributes transformers reads (``keys``, ``values``,
  ``is_initialized``, ``dtype``, ``device``, ``get_seq_length``);
* a 4D ``attention_mask`` reaches the attention function as is (``masking_utils`` returns a prepared mask early);
* the private ``config._attn_implementation``: read to learn a model's attention, and switched to
  ``RAGGED_ATTENTION`` for the one forward that carries a ``RaggedPlan`` (``decode_forward``);
* ``AttentionInterface.register``: a process-wide registration of ``ragged_sdpa_attention`` under
  ``RAGGED_ATTENTION``; extra forward keyword arguments (``ragged_plan``) reach the attention function, and every
  attention module carries its ``layer_idx``;
* ``transformers.integrations.sdpa_attention.sdpa_attention_forward``: called for every part of a split attention,
  so the numbers are transformers' own sdpa (GQA, scaling and masks included).

The tested transformers release is the one ``pyproject.toml`` bounds (below the next major, where these move).
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache, DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from zerotir.rollout.ragged_attention import RaggedPlan

RAGGED_ATTENTION = "zerotir_ragged_sdpa"


def attention_implementation(config) -> str | None:
    """The attention implementation a transformers config selects (``config._attn_implementation``)."""
    return config._attn_implementation


class _RaggedLayer(DynamicLayer):
    """One layer's keys / values in buffers ``(B, heads, capacity, head_dim)``; each row writes at its own column.

    Before each forward ``RaggedCache.aim`` sets ``rows`` (the batch rows fed, None = all), ``cols`` ``(rows, S)``
    (the column each new token goes to) and ``width`` (the columns attention reads). ``update`` writes the new keys /
    values there and returns the first ``width`` columns of the fed rows.
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        super().__init__()
        self.key_buf, self.value_buf = keys, values
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self.rows: torch.Tensor | None = None
        self.cols = torch.zeros(0, 0, dtype=torch.long)
        self.width = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if self.rows is None:  # every row: one index_copy_ of (row, head) vectors into the flat buffers
            n, heads, _, dim = key_states.shape
            capacity = self.key_buf.shape[2]
            base = torch.arange(n * heads, device=self.device).view(n, heads, 1) * capacity
            index = (base + self.cols[:, None, :]).reshape(-1)
            self.key_buf.view(-1, dim).index_copy_(0, index, key_states.reshape(-1, dim).to(self.dtype))
            self.value_buf.view(-1, dim).index_copy_(0, index, value_states.reshape(-1, dim).to(self.dtype))
            self.keys, self.values = self.key_buf[:, :, : self.width], self.value_buf[:, :, : self.width]
        else:
            self.key_buf[self.rows[:, None], :, self.cols] = key_states.transpose(1, 2).to(self.dtype)
            self.value_buf[self.rows[:, None], :, self.cols] = value_states.transpose(1, 2).to(self.dtype)
            self.keys = self.key_buf[self.rows, :, : self.width]
            self.values = self.value_buf[self.rows, :, : self.width]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.width


class RaggedCache:
    """The decode session's keys / values: for every layer, buffers ``(rows, kv_heads, capacity, head_dim)`` in
    which each row writes at its own columns (``aim``), grown and shrunk in place.

    Args:
        num_layers: the model's decoder layers.
        rows: batch rows to allocate.
        kv_shape: ``(kv_heads, head_dim)``.
        columns: columns per row to allocate.
        dtype / device: of the buffers (the model's).
    """

    def __init__(self, num_layers: int, rows: int, kv_shape: tuple[int, int], columns: int, dtype: torch.dtype,
                 device: torch.device):
        heads, dim = kv_shape
        zeros = torch.zeros(rows, heads, columns, dim, dtype=dtype, device=device)
        self.hf = Cache(layers=[_RaggedLayer(zeros.clone(), zeros.clone()) for _ in range(num_layers)])

    @property
    def capacity(self) -> int:
        """Columns the buffers hold per row."""
        return self.hf.layers[0].key_buf.shape[2]

    def aim(self, rows: torch.Tensor | None, cols: torch.Tensor, width: int) -> None:
        """Direct the next forward: it feeds batch rows ``rows`` (None = all), whose new tokens go to columns ``cols``
        ``(rows, S)``, and attention reads the first ``width`` columns."""
        for layer in self.hf.layers:
            layer.rows, layer.cols, layer.width = rows, cols, width

    def row_columns(self, layer_idx: int, row: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views ``(1, kv_heads, width, head_dim)`` of row ``row``'s first ``width`` keys / values in a layer."""
        layer = self.hf.layers[layer_idx]
        return layer.key_buf[row : row + 1, :, :width], layer.value_buf[row : row + 1, :, :width]

    def ensure_columns(self, needed: int) -> None:
        """Grow every row to at least ``needed`` columns (doubling, so appends cost amortised O(1))."""
        capacity = self.capacity
        if needed <= capacity:
            return
        size = max(needed, 2 * capacity)
        for layer in self.hf.layers:
            old_k, old_v = layer.key_buf, layer.value_buf
            layer.key_buf = old_k.new_zeros(old_k.shape[0], old_k.shape[1], size, old_k.shape[3])
            layer.value_buf = old_v.new_zeros(old_v.shape[0], old_v.shape[1], size, old_v.shape[3])
            layer.key_buf[:, :, :capacity] = old_k
            layer.value_buf[:, :, :capacity] = old_v

    def add_rows(self, extra: int) -> None:
        """Append ``extra`` empty rows (of the current capacity) to the batch."""
        for layer in self.hf.layers:
            zeros = layer.key_buf.new_zeros(extra, *layer.key_buf.shape[1:])
            layer.key_buf = torch.cat([layer.key_buf, zeros])
            layer.value_buf = torch.cat([layer.value_buf, zeros])

    def copy_rows(self, dst: torch.Tensor, src: torch.Tensor, columns: int) -> None:
        """Copy the first ``columns`` columns of rows ``src`` into rows ``dst``, in every layer."""
        for layer in self.hf.layers:
            for buf in (layer.key_buf, layer.value_buf):
                buf[:, :, :columns].index_copy_(0, dst, buf[:, :, :columns].index_select(0, src))

    def keep_rows(self, keep: int) -> None:
        """Drop every row from ``keep`` on (the buffers become views of their first rows; the capacity stays)."""
        for layer in self.hf.layers:
            layer.key_buf, layer.value_buf = layer.key_buf[:keep], layer.value_buf[:keep]


def decode_forward(model, text_config, cache: RaggedCache, plan: RaggedPlan | None, **inputs):
    """One forward of ``model`` over ``inputs`` (``input_ids``, a 4D additive ``attention_mask``, ``position_ids``)
    through ``cache``, keeping only the last position's logits. With a ``plan`` the forward's attention runs as
    ``ragged_sdpa_attention``: ``text_config`` (an sdpa model's) selects it for this forward only."""
    if plan is None:
        return model(**inputs, past_key_values=cache.hf, use_cache=True, logits_to_keep=1)
    text_config._attn_implementation = RAGGED_ATTENTION
    try:
        return model(**inputs, past_key_values=cache.hf, use_cache=True, logits_to_keep=1, ragged_plan=plan)
    finally:
        text_config._attn_implementation = "sdpa"


def ragged_sdpa_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: torch.Tensor | None, ragged_plan: RaggedPlan | None = None, **kwargs):
    """sdpa attention for the batch (as transformers runs it), then for each of the plan's wide rows over its own
    columns (a view of its row of the cache: no copy, no mask), overwriting its row of the output.

    Shapes: ``query`` ``(B, heads, S, head_dim)``; ``key`` / ``value`` ``(B, kv_heads, main width, head_dim)``;
    returns ``(B, S, heads, head_dim)`` as ``sdpa_attention_forward`` does.
    """
    out, weights = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if ragged_plan is None:
        return out, weights
    cache = ragged_plan.cache
    wide = [sdpa_attention_forward(module, query[j : j + 1], *cache.row_columns(module.layer_idx, row, width), None,
                                   **kwargs)[0]
            for j, row, width in ragged_plan.wide]
    return out.index_copy(0, ragged_plan.rows, torch.cat(wide).to(out.dtype)), weights


AttentionInterface.register(RAGGED_ATTENTION, ragged_sdpa_attention)
