"""The in-place KV cache and the prefix store (zerotir.rollout.kv_cache)."""

from __future__ import annotations

import torch

from zerotir.rollout.kv_cache import PrefixEntry, PrefixStore, SlotLayer, drop_leading, grow_columns, select_rows, slot_cache


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
