"""The contract between ``hf_adapter`` and transformers: every internal the adapter relies on exists with the shape it
uses (a failure names the internal and the installed transformers), and a decode through the adapter equals a plain
full forward of a tiny Llama."""

from __future__ import annotations

import inspect

import pytest
import torch
import transformers
from transformers import AttentionInterface, PreTrainedConfig
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from zerotir.rollout import hf_adapter
from zerotir.rollout.hf_adapter import RAGGED_ATTENTION, RaggedCache, decode_forward, ragged_sdpa_attention
from zerotir.rollout.ragged_attention import RaggedPlan
from zerotir.toy.tiny_model import build_tiny_model
from zerotir.toy.tokenizer import build_byte_tokenizer

TOK = build_byte_tokenizer()
HEADS, HEAD_DIM = 2, 8

pytestmark = pytest.mark.usefixtures("one_thread")


def require(ok: bool, internal: str, what: str) -> None:
    """Fail naming the transformers internal ``hf_adapter`` relies on and what changed."""
    if not ok:
        pytest.fail(f"transformers {transformers.__version__} moved {internal}: {what}. zerotir/rollout/hf_adapter.py "
                    "relies on it; adapt the adapter (and the transformers bound in pyproject.toml).")


def params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def test_dynamic_layer_is_a_cache_layer_the_adapter_can_subclass():
    require(issubclass(DynamicLayer, CacheLayerMixin), "transformers.cache_utils.DynamicLayer",
            "it is no longer a CacheLayerMixin")
    require(params(DynamicLayer.update)[:3] == ["self", "key_states", "value_states"],
            "transformers.cache_utils.DynamicLayer.update", f"its parameters are {params(DynamicLayer.update)}")
    require(params(DynamicLayer.__init__)[1:] in ([], ["kwargs"]), "transformers.cache_utils.DynamicLayer.__init__",
            f"it takes {params(DynamicLayer.__init__)[1:]}; the adapter calls it without arguments")
    layer = hf_adapter._RaggedLayer(torch.zeros(1, HEADS, 4, HEAD_DIM), torch.zeros(1, HEADS, 4, HEAD_DIM))
    abstract = type(layer).__abstractmethods__
    require(not abstract, "transformers.cache_utils.CacheLayerMixin", f"new abstract methods {sorted(abstract)}")
    for name in ("keys", "values", "is_initialized", "dtype", "device"):
        require(hasattr(layer, name), f"transformers.cache_utils.DynamicLayer.{name}", "the layer lacks it")
    require(callable(DynamicLayer.get_seq_length), "transformers.cache_utils.DynamicLayer.get_seq_length", "gone")


def test_cache_holds_given_layers_and_hands_each_update_to_its_layer():
    require("layers" in params(Cache.__init__), "transformers.cache_utils.Cache.__init__",
            f"no `layers` parameter (it takes {params(Cache.__init__)[1:]})")
    cache = RaggedCache(num_layers=2, rows=2, kv_shape=(HEADS, HEAD_DIM), columns=4, dtype=torch.float32,
                        device=torch.device("cpu"))
    require(isinstance(cache.hf, Cache) and len(cache.hf.layers) == 2, "transformers.cache_utils.Cache.layers",
            "the layers passed to Cache(layers=...) are not its `layers`")
    cache.aim(None, torch.tensor([[1], [3]]), width=4)
    k = torch.randn(2, HEADS, 1, HEAD_DIM)
    keys, _ = cache.hf.update(k, -k, 1)
    require(keys.shape == (2, HEADS, 4, HEAD_DIM) and torch.equal(keys[0, :, 1], k[0, :, 0])
            and torch.equal(keys[1, :, 3], k[1, :, 0]), "transformers.cache_utils.Cache.update",
            "it no longer returns its layer's update(key_states, value_states) for layer_idx")
    require(not cache.hf.layers[0].key_buf.any(), "transformers.cache_utils.Cache.update",
            "an update of layer 1 touched layer 0")


def test_the_attention_implementation_is_a_settable_config_attribute():
    prop = inspect.getattr_static(PreTrainedConfig, "_attn_implementation", None)
    require(isinstance(prop, property) and prop.fset is not None, "PreTrainedConfig._attn_implementation",
            "it is not a settable property")
    config = build_tiny_model(TOK, hidden_size=16, num_layers=1, num_heads=HEADS).config
    config._attn_implementation = "eager"
    require(hf_adapter.attention_implementation(config) == "eager", "PreTrainedConfig._attn_implementation",
            "setting it does not change what it reads")


def test_the_ragged_attention_is_registered_globally_and_sdpa_keeps_its_signature():
    require(inspect.ismethod(AttentionInterface.register), "transformers.AttentionInterface.register",
            "it is no longer a class-wide registration")
    require(ALL_ATTENTION_FUNCTIONS[RAGGED_ATTENTION] is ragged_sdpa_attention,
            "transformers.modeling_utils.ALL_ATTENTION_FUNCTIONS", "AttentionInterface.register did not reach it")
    require(params(sdpa_attention_forward)[:5] == ["module", "query", "key", "value", "attention_mask"],
            "transformers.integrations.sdpa_attention.sdpa_attention_forward",
            f"its parameters are {params(sdpa_attention_forward)}")


def additive(allowed: torch.Tensor) -> torch.Tensor:
    return torch.where(allowed, 0.0, torch.finfo(torch.float32).min)[:, None]


def test_a_ragged_decode_through_the_adapter_equals_a_full_forward(monkeypatch):
    """Two rows of different lengths prefilled apart, then decoded together at their own columns (the wide row's
    attention apart, through the registered function, on sdpa): each row's logits equal a full forward of its ids.
    Checks together that a 4D mask reaches attention as is, that forward kwargs (``ragged_plan``) reach the attention
    function, that attention modules carry ``layer_idx``, and that the switched attention implementation is
    restored."""
    model = build_tiny_model(TOK, hidden_size=16, num_layers=2, num_heads=HEADS, seed=0).eval()
    model.config._attn_implementation = "sdpa"
    config = model.config.get_text_config()
    seen = []
    monkeypatch.setitem(AttentionInterface._global_mapping, RAGGED_ATTENTION,
                        lambda module, *a, **kw: seen.append((module.layer_idx, kw.get("ragged_plan")))
                        or ragged_sdpa_attention(module, *a, **kw))
    rows = [TOK.encode("a long first row"), TOK.encode("hi")]
    cache = RaggedCache(2, len(rows), (HEADS, HEAD_DIM), columns=4, dtype=torch.float32, device=torch.device("cpu"))
    with torch.inference_mode():
        for r, ids in enumerate(rows):  # prefill row r alone, causal over its columns [0, len)
            n = len(ids)
            cache.ensure_columns(n + 1)
            cols = torch.arange(n)[None]
            cache.aim(torch.tensor([r]), cols, n)
            decode_forward(model, config, cache, None, input_ids=torch.tensor([ids]),
                           attention_mask=additive((cols[0][:, None] >= cols[0][None, :])[None]), position_ids=cols)
        nxt = [5, 6]
        fill = torch.tensor([[len(ids)] for ids in rows])
        main = len(rows[1]) + 1  # the short row's width; the long row is attended apart over its own columns
        plan = RaggedPlan(rows=torch.tensor([0]), wide=[(0, 0, len(rows[0]) + 1)], cache=cache)
        cache.aim(None, fill, main)
        out = decode_forward(model, config, cache, plan, input_ids=torch.tensor([[t] for t in nxt]),
                             attention_mask=additive(torch.arange(main)[None, None, :] <= fill[:, :, None]),
                             position_ids=fill)
        want = [model(input_ids=torch.tensor([ids + [t]])).logits[0, -1] for ids, t in zip(rows, nxt)]
    require(hf_adapter.attention_implementation(config) == "sdpa", "PreTrainedConfig._attn_implementation",
            "the switched implementation was not restored")
    require(sorted(seen, key=lambda s: s[0]) == [(0, plan), (1, plan)], "transformers' attention dispatch",
            f"the registered function saw (layer_idx, ragged_plan) = {seen}")
    for r in range(len(rows)):
        torch.testing.assert_close(out.logits[r, -1], want[r], atol=1e-5, rtol=1e-5)
