"""The in-place KV cache and the prefix store (zerotir.rollout.kv_cache)."""

from __future__ import annotations

import torch

from zerotir.rollout.kv_cache import (
    PrefixEntry, PrefixStore, SlotLayer, drop_leading, grow_columns, prefill_groups, row_view, select_rows, set_length,
    slot_cache,
)


def entry(ids: list[int]) -> PrefixEntry:
    kv = torch.arange(len(ids), dtype=torch.float32).view(1, len(ids), 1)
    return PrefixEntry(ids, [kv], [kv.clone()])


def test_grow_columns_doubles_and_keeps_the_content():
    buf = torch.arange(6.0).view(1, 2, 3)
    grown = grow_columns(buf, 4, dim=2)
    assert grown.shape == (1, 2, 6) and torch.equal(grown[..., :3], buf) and not grown[..., 3:].any()
    assert grow_columns(buf, 3, dim=2) is buf
    assert grow_columns(buf, 9, dim=2).shape[2] == 9


def test_slot_layer_appends_in_place_and_grows():
    layer = SlotLayer(capacity=2)
    k = torch.ones(2, 1, 2, 4)
    keys, values = layer.update(k, 2 * k)
    assert keys.shape == (2, 1, 2, 4) and layer.get_seq_length() == 2
    keys, values = layer.update(3 * k[:, :, :1], 4 * k[:, :, :1])  # past the capacity: the buffer doubles
    assert layer.key_buf.shape[2] == 4 and keys[:, :, 2].eq(3).all() and values[:, :, :2].eq(2).all()
    layer.batch_select_indices(torch.tensor([1]))
    assert layer.keys.shape == (1, 1, 3, 4)
    layer.drop_leading(1)
    assert layer.get_seq_length() == 2 and layer.keys[0, 0, :, 0].tolist() == [1.0, 3.0]


def test_cache_helpers_apply_to_every_layer():
    cache = slot_cache(num_layers=2, capacity=4)
    for i, layer in enumerate(cache.layers):
        layer.update(torch.full((3, 1, 2, 1), float(i)), torch.zeros(3, 1, 2, 1))
    select_rows(cache, torch.tensor([2, 0]))
    drop_leading(cache, 1)
    assert [tuple(layer.keys.shape) for layer in cache.layers] == [(2, 1, 1, 1)] * 2
    assert cache.get_seq_length() == 1


def test_prefix_store_returns_the_longest_proper_prefix_once():
    store = PrefixStore(max_tokens=100)
    store.put(entry([1, 2, 3]))
    store.put(entry([1, 2, 3, 4, 5]))
    store.put(entry([9, 9]))
    assert store.take([1, 2, 3, 4, 5]) is not None  # [1, 2, 3] (a proper prefix: one token is left to feed)
    got = store.take([1, 2, 3, 4, 5, 6])
    assert got is not None and got.ids == [1, 2, 3, 4, 5] and store.hits == 2 and store.reused_tokens == 8
    assert store.take([1, 2, 3, 4, 5, 6]) is None  # taken entries are gone
    assert store.take([7, 9, 9, 1]) is None  # same tail, not a prefix
    assert len(store) == 1 and store.num_tokens == 2


def test_prefix_store_evicts_the_oldest_over_its_budget():
    store = PrefixStore(max_tokens=5)
    store.put(entry([1, 2, 3]))
    store.put(entry([4, 5]))
    store.put(entry([6, 7]))  # 7 tokens > 5: [1, 2, 3] goes
    assert store.num_tokens == 4 and store.take([1, 2, 3, 0]) is None and store.take([6, 7, 0]) is not None
    store.put(entry(list(range(6))))  # larger than the whole budget: not stored
    assert store.num_tokens == 2
    store.clear()
    assert len(store) == 0 and store.num_tokens == 0


def test_prefill_groups_split_where_padding_costs_more_than_a_forward():
    # One forward: 5 * 21 + 4 = 109 positions; [1, 1, 1] + [20, 21]: 3 + 4 + 42 + 4 = 53; three groups: 3 + 4 +
    # 20 + 4 + 21 + 4 = 56.
    assert prefill_groups([1, 1, 1, 20, 21], forward_cost=4) == [[0, 1, 2], [3, 4]]
    assert prefill_groups([21, 1, 20, 1, 1], forward_cost=4) == [[1, 3, 4], [2, 0]]  # sorted by length
    assert prefill_groups([1, 1, 1, 20, 21], forward_cost=0) == [[0, 1, 2], [3], [4]]
    # Cost 61: one forward 105 + 61 = 166 beats two, 45 + 2 * 61 = 167.
    assert prefill_groups([1, 1, 1, 20, 21], forward_cost=61) == [[0, 1, 2, 3, 4]]
    assert prefill_groups([3, 3], forward_cost=0) == [[0, 1]]
    assert prefill_groups([7], forward_cost=0) == [[0]]


def test_row_view_writes_into_the_shared_buffers():
    cache = slot_cache(num_layers=2, capacity=5)
    for layer in cache.layers:
        layer.preload(torch.zeros(3, 1, 5, 2), torch.zeros(3, 1, 5, 2), 1)
    view = row_view(cache, 1, 3, length=2)  # rows 1 and 2, their next column is 2
    for layer in view.layers:
        layer.update(torch.ones(2, 1, 2, 2), 2 * torch.ones(2, 1, 2, 2))  # columns 2 and 3
    set_length(cache, 4)
    for layer in cache.layers:
        assert layer.keys.shape == (3, 1, 4, 2)
        assert layer.keys[1:, :, 2:4].eq(1).all() and layer.values[1:, :, 2:4].eq(2).all()
        assert not layer.keys[0].any() and not layer.keys[:, :, :2].any()
