"""Log-probs and entropy through the LM head a chunk of tokens at a time (zerotir.rl.chunked_logprobs): the values and
gradients of the full-logits path, without ever computing the logits of more than one chunk."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM

from zerotir.rl.chunked_logprobs import head_logprobs
from zerotir.rl.update import sequence_logprobs
from zerotir.toy.tiny_model import tiny_llama_config
from zerotir.toy.tokenizer import build_byte_tokenizer

VOCAB = 1024  # wider than the byte tokenizer's, so a chunk's logits are most of the work


def _model(tied: bool = False) -> LlamaForCausalLM:
    config = tiny_llama_config(build_byte_tokenizer(), hidden_size=32, num_layers=2, num_heads=2,
                               tie_word_embeddings=tied)
    config.vocab_size = VOCAB
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.eval()
    return model


@pytest.fixture(scope="module")
def model():
    return _model()


def _batch(rows: int = 3, width: int = 11):
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (rows, width), generator=gen)
    attn = torch.ones(rows, width, dtype=torch.long)
    attn[1, 7:] = 0  # right padding on one row
    ids[1, 7:] = 0
    return ids, attn


def _values_and_grads(model, ids, attn, *, temperature, chunk_tokens, entropy_grad=True):
    """log-probs, entropies, and every parameter's gradient of a weighted sum of both."""
    model.zero_grad(set_to_none=True)
    logp, entropy = sequence_logprobs(model, ids, attn, temperature=temperature, with_entropy=True,
                                      entropy_grad=entropy_grad, chunk_tokens=chunk_tokens)
    gen = torch.Generator().manual_seed(2)
    w_logp, w_ent = torch.randn(logp.shape, generator=gen), torch.randn(logp.shape, generator=gen)
    loss = (logp * w_logp).sum() + ((entropy * w_ent).sum() if entropy_grad else 0.0)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), entropy.detach(), grads, entropy.requires_grad


@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("chunk_tokens", [1, 7, 1000])
def test_chunked_values_and_gradients_are_the_full_paths(model, temperature, chunk_tokens):
    ids, attn = _batch()
    full = _values_and_grads(model, ids, attn, temperature=temperature, chunk_tokens=None)
    chunked = _values_and_grads(model, ids, attn, temperature=temperature, chunk_tokens=chunk_tokens)
    assert torch.allclose(chunked[0], full[0], atol=1e-5, rtol=0)
    assert torch.allclose(chunked[1], full[1], atol=1e-5, rtol=0)
    assert chunked[0][:, 0].abs().sum() == 0 and chunked[1][:, 0].abs().sum() == 0  # position 0 is a prompt token
    assert full[2].keys() == chunked[2].keys() and "lm_head.weight" in full[2]
    for name, g in full[2].items():
        assert torch.allclose(chunked[2][name], g, atol=1e-5, rtol=1e-4), name


def test_the_temperature_changes_the_chunked_values(model):
    ids, attn = _batch()
    with torch.no_grad():
        one = sequence_logprobs(model, ids, attn, temperature=1.0, chunk_tokens=4)[0]
        cold = sequence_logprobs(model, ids, attn, temperature=0.6, chunk_tokens=4)[0]
        full_cold = sequence_logprobs(model, ids, attn, temperature=0.6)[0]
    assert not torch.allclose(one, cold, atol=1e-3)
    assert torch.allclose(cold, full_cold, atol=1e-5, rtol=0)


def test_entropy_has_no_gradient_unless_asked(model):
    ids, attn = _batch()
    with_grad = _values_and_grads(model, ids, attn, temperature=0.8, chunk_tokens=5, entropy_grad=True)
    without = _values_and_grads(model, ids, attn, temperature=0.8, chunk_tokens=5, entropy_grad=False)
    full_without = _values_and_grads(model, ids, attn, temperature=0.8, chunk_tokens=None, entropy_grad=False)
    assert with_grad[3] and not without[3]
    assert torch.allclose(without[1], with_grad[1], atol=1e-6)  # the same entropy values either way
    for name, g in full_without[2].items():  # the log-prob gradient alone, as the full path's
        assert torch.allclose(without[2][name], g, atol=1e-5, rtol=1e-4), name


def test_tied_embeddings_get_the_full_paths_gradient():
    tied = _model(tied=True)
    assert tied.get_output_embeddings().weight is tied.get_input_embeddings().weight
    ids, attn = _batch()
    full = _values_and_grads(tied, ids, attn, temperature=0.7, chunk_tokens=None)
    chunked = _values_and_grads(tied, ids, attn, temperature=0.7, chunk_tokens=6)
    shared = "model.embed_tokens.weight"
    assert shared in full[2] and "lm_head.weight" not in full[2]  # one parameter, two uses
    for name, g in full[2].items():
        assert torch.allclose(chunked[2][name], g, atol=1e-5, rtol=1e-4), name


def test_the_head_never_sees_more_than_a_chunk(model, monkeypatch):
    # Forward and the recompute in backward both apply the head; no product may take more than chunk_tokens positions.
    head, linear, seen = model.get_output_embeddings().weight, torch.nn.functional.linear, []

    def spy(x, weight, bias=None):
        if weight.data_ptr() == head.data_ptr():
            seen.append(x.shape[0])
        return linear(x, weight, bias)

    monkeypatch.setattr(torch.nn.functional, "linear", spy)
    ids, attn = _batch(rows=2, width=9)
    logp, entropy = sequence_logprobs(model, ids, attn, temperature=1.0, with_entropy=True, entropy_grad=True,
                                      chunk_tokens=4)
    forward_calls = len(seen)
    (logp.sum() + entropy.sum()).backward()
    model.zero_grad(set_to_none=True)
    assert forward_calls == 4  # 2 x 8 scored positions in chunks of 4
    assert seen == [4] * 8  # and each chunk recomputed once in backward


def test_head_logprobs_by_hand():
    # Identity head: logits = hidden. Row [ln 1, ln 3] -> p = [1/4, 3/4]; label 1 -> log 3/4; entropy of (1/4, 3/4).
    head = torch.nn.Linear(2, 2, bias=False)
    torch.nn.init.eye_(head.weight)
    hidden = torch.log(torch.tensor([[1.0, 3.0], [1.0, 1.0]]))
    logp, entropy = head_logprobs(head, hidden, torch.tensor([1, 0]), temperature=1.0, chunk_tokens=1,
                                  with_entropy=True)
    p = torch.tensor([0.25, 0.75])
    assert torch.allclose(logp, torch.log(torch.tensor([0.75, 0.5])))
    assert torch.allclose(entropy, torch.stack([-(p * p.log()).sum(), torch.log(torch.tensor(2.0))]))
    with pytest.raises(ValueError, match=r"model.rl.logprob_chunk_tokens=0: must be >= 1"):
        head_logprobs(head, hidden, torch.tensor([1, 0]), temperature=1.0, chunk_tokens=0)
    with pytest.raises(TypeError, match=r"logprob_chunk_tokens needs .* nn.Linear, got Identity: set "
                                        r"model.rl.logprob_chunk_tokens null"):
        head_logprobs(torch.nn.Identity(), hidden, torch.tensor([1, 0]), temperature=1.0, chunk_tokens=1)
