"""Tests of the head widening: the widened model computes what the original does, and trains as it does."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from zerotir.toy.tiny_model import build_tiny_model
from zerotir.toy.tokenizer import build_byte_tokenizer
from zerotir.toy.wide_heads import dimension_map, widen_heads

TOK = build_byte_tokenizer()


@pytest.fixture(scope="module")
def narrow(tmp_path_factory):
    """A random tiny Llama with heads of 8 (rotary over the whole head, as the toy base)."""
    folder = tmp_path_factory.mktemp("narrow")
    build_tiny_model(TOK, save_dir=folder, seed=3, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64)
    return folder


def test_dimension_map_hand_worked():
    # A head of 4 in one of 8 (r = 2): the first half (0, 1) to 2 * j = 0, 2; the second half (2, 3) to
    # 8 / 2 + 2 * (j - 2) = 4, 6. Dimension i of the wide head turns with theta ** (-2 i / 8): at i = 2 it is
    # theta ** (-2 / 4), dimension 1's frequency in the head of 4.
    assert dimension_map(4, 8).tolist() == [0, 2, 4, 6]
    assert dimension_map(4, 16).tolist() == [0, 4, 8, 12]


@pytest.mark.parametrize("to", [16, 32])  # r = 2 (the query scaled by sqrt 2) and r = 4 (by 2)
def test_the_widened_model_computes_the_same_logits(narrow, tmp_path, to):
    widen_heads(narrow, tmp_path, to)
    a, b = AutoModelForCausalLM.from_pretrained(narrow), AutoModelForCausalLM.from_pretrained(tmp_path)
    assert b.config.head_dim == to and b.config.num_attention_heads == 4
    ids = torch.randint(3, len(TOK), (3, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        la, lb = a(ids).logits, b(ids).logits
    assert torch.allclose(la, lb, atol=1e-5, rtol=1e-5)
    assert (tmp_path / "tokenizer.json").read_bytes() == (narrow / "tokenizer.json").read_bytes()


def test_the_added_dimensions_stay_zero_under_training(narrow, tmp_path):
    """A zero query / key dimension gets its zero partner's gradient, a zero value dimension the zero output column's:
    AdamW (with weight decay) leaves them at zero while the rest learns."""
    widen_heads(narrow, tmp_path, 16)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    keep = dimension_map(8, 16)
    added = torch.ones(16, dtype=torch.bool)
    added[keep] = False
    attn = model.model.layers[0].self_attn
    before = attn.q_proj.weight.detach().clone()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    ids = torch.randint(3, len(TOK), (2, 24), generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    for layer in model.model.layers:
        a = layer.self_attn
        for proj in (a.q_proj, a.k_proj, a.v_proj):
            assert not proj.weight.view(4, 16, -1)[:, added].any()
        assert not a.o_proj.weight.view(-1, 4, 16)[:, :, added].any()
    assert not torch.equal(attn.q_proj.weight.view(4, 16, -1)[:, keep], before.view(4, 16, -1)[:, keep])


def test_a_size_that_is_not_a_multiple_is_refused(narrow, tmp_path):
    with pytest.raises(ValueError, match=r"serve_head_dim=12: must be a multiple of the trained head size 8"):
        widen_heads(narrow, tmp_path, 12)
