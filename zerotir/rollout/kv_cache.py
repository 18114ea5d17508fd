"""KV-cache helpers for ``HFEngine``: a cache that grows in place, and a prefix store.

Why not transformers' ``DynamicCache``: it grows by ``torch.cat`` at every decoded token, so each step copies the whole
cache (quadratic in the response length); on a CPU with a tiny model that copy costs more than the forward itself.
``SlotLayer`` keeps ``(B, heads, capacity, head_dim)`` buffers, writes new keys / values in place and doubles the
capacity when full; attention reads a view of the filled columns.

Why a prefix store: the tool loop calls ``generate`` again after every stop string, with the previous prompt + the
sampled ids (+ the injected tool output) as the new prompt. Recomputing that whole prefix each phase would cost as
much as decoding hundreds of tokens. ``PrefixStore`` keeps the keys / values of rows that ended on a stop string
(like vLLM's automatic prefix caching, but keyed on exact token-id prefixes) so only the new tokens are prefilled.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, DynamicLayer

# Tokens hashed (with the length) to find candidate prefixes quickly; a full comparison confirms a hit.
_KEY_TAIL = 16


def grow_columns(buf: torch.Tensor, needed: int, dim: int) -> torch.Tensor:
    """``buf`` with at least ``needed`` entries along ``dim`` (doubling, zero-filled), or ``buf`` itself."""
    size = buf.shape[dim]
    if needed <= size:
        return buf
    shape = list(buf.shape)
    shape[dim] = max(needed, 2 * size)
    out = buf.new_zeros(shape)
    out.narrow(dim, 0, size).copy_(buf)
    return out


class SlotLayer(DynamicLayer):
    """One attention layer's keys / values in buffers ``(B, heads, capacity, head_dim)`` filled up to ``length``.

    ``keys`` / ``values`` are views of the filled columns, as transformers' attention expects.
    """

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity, self.length = capacity, 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        batch, heads, _, dim = key_states.shape
        self.preload(key_states.new_zeros(batch, heads, self.capacity, dim),
                     value_states.new_zeros(batch, value_states.shape[1], self.capacity, value_states.shape[3]), 0)

    def preload(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        """Use ``keys`` / ``values`` ``(B, heads, capacity, head_dim)`` as buffers, filled up to column ``length``."""
        self.key_buf, self.value_buf, self.length = keys, values, length
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self._refresh()

    def _refresh(self) -> None:
        self.keys = self.key_buf[:, :, : self.length]
        self.values = self.value_buf[:, :, : self.length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        self.key_buf = grow_columns(self.key_buf, end, 2)
        self.value_buf = grow_columns(self.value_buf, end, 2)
        self.key_buf[:, :, self.length : end] = key_states
        self.value_buf[:, :, self.length : end] = value_states
        self.length = end
        self._refresh()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.key_buf = self.key_buf[indices]
        self.value_buf = self.value_buf[indices]
        self._refresh()

    def drop_leading(self, columns: int) -> None:
        """Forget the first ``columns`` columns (padding that no remaining row attends to)."""
        self.key_buf = self.key_buf[:, :, columns:]
        self.value_buf = self.value_buf[:, :, columns:]
        self.length -= columns
        self._refresh()


def slot_cache(num_layers: int, capacity: int) -> Cache:
    """An empty ``Cache`` of ``SlotLayer`` s with room for ``capacity`` columns per row before it grows. The buffers
    are allocated at the first update, or by ``SlotLayer.preload``."""
    return Cache(layers=[SlotLayer(capacity) for _ in range(num_layers)])


def row_view(cache: Cache, start: int, stop: int, length: int) -> Cache:
    """A ``Cache`` over rows ``[start, stop)`` of ``cache``'s (allocated) buffers, filled up to column ``length``.

    It shares the buffers: a forward through it writes its keys / values straight into ``cache`` (no copy), so
    groups of rows can be prefilled one forward each into one batch. ``cache``'s own fill length is not changed
    (``set_length`` does it once every group has run).
    """
    view = slot_cache(len(cache.layers), 0)
    for layer, part in zip(cache.layers, view.layers):
        part.preload(layer.key_buf[start:stop], layer.value_buf[start:stop], length)
    return view


def set_length(cache: Cache, length: int) -> None:
    """Mark the first ``length`` columns of every layer as filled."""
    for layer in cache.layers:
        layer.length = length
        layer._refresh()


def prefill_groups(fresh: list[int], forward_cost: int) -> list[list[int]]:
    """Split rows into prefill forwards so that short rows are not padded to the longest one.

    A forward over a group feeds ``len(group) * max(fresh in group)`` token positions (shorter rows are padded);
    each forward also costs a fixed ``forward_cost`` positions' worth. Rows are sorted by length and cut into
    consecutive groups minimising the total (exact dynamic programme over the distinct lengths). E.g. lengths
    ``[1, 1, 1, 20, 21]`` with cost 4: one forward is 5 * 21 + 4 = 109 positions, two ``[1, 1, 1] [20, 21]`` are
    3 + 4 + 42 + 4 = 53.

    Args:
        fresh: tokens to prefill per row (>= 1).
        forward_cost: fixed cost of one forward, in token positions.

    Returns:
        Row indices per group, shortest rows first, each group sorted by length.
    """
    order = sorted(range(len(fresh)), key=lambda i: fresh[i])
    lengths = [fresh[i] for i in order]
    # Candidate cut points: after the last row of each distinct length.
    ends = [k + 1 for k in range(len(lengths)) if k + 1 == len(lengths) or lengths[k + 1] != lengths[k]]
    best: dict[int, tuple[int, int]] = {0: (0, 0)}  # rows covered -> (cost, where the last group starts)
    for end in ends:
        best[end] = min((best[start][0] + (end - start) * lengths[end - 1] + forward_cost, start)
                        for start in [0, *ends] if start < end)
    groups, end = [], len(lengths)
    while end > 0:
        start = best[end][1]
        groups.append(order[start:end])
        end = start
    return groups[::-1]


def select_rows(cache: Cache, indices: torch.Tensor) -> None:
    """Keep only the rows ``indices`` (in that order) in every layer."""
    for layer in cache.layers:
        layer.batch_select_indices(indices)


def drop_leading(cache: Cache, columns: int) -> None:
    """Drop the first ``columns`` columns of every layer."""
    if columns > 0:
        for layer in cache.layers:
            layer.drop_leading(columns)


@dataclass
class PrefixEntry:
    """The keys / values of ``ids`` (one row): per layer a ``(heads, len(ids), head_dim)`` tensor."""

    ids: list[int]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]


class PrefixStore:
    """Keys / values of recently finished rows, looked up by exact token-id prefix.

    Args:
        max_tokens: total cached tokens kept; the least recently stored entries are dropped beyond it.
    """

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self._entries: OrderedDict[tuple, PrefixEntry] = OrderedDict()
        self._tokens = 0
        self.hits = 0  # prompts that found a stored prefix (counted for tests and monitoring)
        self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def num_tokens(self) -> int:
        return self._tokens

    @staticmethod
    def _key(ids: list[int], length: int) -> tuple:
        return (length, tuple(ids[max(0, length - _KEY_TAIL) : length]))

    def clear(self) -> None:
        self._entries.clear()
        self._tokens = 0

    def put(self, entry: PrefixEntry) -> None:
        """Store ``entry`` (replacing one with the same ids) and evict the oldest entries over the budget."""
        n = len(entry.ids)
        if n == 0 or n > self.max_tokens:
            return
        key = self._key(entry.ids, n)
        old = self._entries.pop(key, None)
        if old is not None:
            self._tokens -= len(old.ids)
        self._entries[key] = entry
        self._tokens += n
        while self._tokens > self.max_tokens:
            _, dropped = self._entries.popitem(last=False)
            self._tokens -= len(dropped.ids)

    def take(self, prompt: list[int]) -> PrefixEntry | None:
        """Remove and return the longest entry whose ids are a proper prefix of ``prompt`` (at least one prompt token
        must remain to be fed, to get the next-token logits), or None."""
        lengths = sorted({k[0] for k in self._entries if k[0] < len(prompt)}, reverse=True)
        for length in lengths:
            key = self._key(prompt, length)
            entry = self._entries.get(key)
            if entry is not None and entry.ids == prompt[:length]:
                del self._entries[key]
                self._tokens -= length
                self.hits += 1
                self.reused_tokens += length
                return entry
        return None
