"""A tiny model that has memorised a few documents, for the tool-loop tests on a real engine: it writes its tool
calls where the documents do, so the loop runs real calls and injects real observations."""

from __future__ import annotations

import torch

from zerotir.toy.tiny_model import build_tiny_model


def memorise(tokenizer, texts: list[str], steps: int = 400):
    """A tiny Llama (hidden 64, 2 layers, seed 0) trained full-batch on ``texts`` (each + EOS) until its loss is
    below 0.01, at most ``steps`` steps; asserts that it got below 0.05. Returns it in eval mode."""
    docs = [tokenizer.encode(t) + [tokenizer.eos_token_id] for t in texts]
    return memorise_ids(build_tiny_model(tokenizer, hidden_size=64, num_layers=2, seed=0), tokenizer, docs, steps)


def memorise_ids(model, tokenizer, docs: list[list[int]], steps: int = 400):
    """``model`` trained as ``memorise`` does on the token ids ``docs`` as given (each segment tokenized as the tool
    loop sees it)."""
    width = max(map(len, docs))
    ids = torch.full((len(docs), width), tokenizer.pad_token_id)
    mask = torch.zeros_like(ids)
    for i, d in enumerate(docs):
        ids[i, : len(d)], mask[i, : len(d)] = torch.tensor(d), 1
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.01:
            break
    assert loss.item() < 0.05, f"the tiny model did not memorise the documents (loss {loss.item():.3f})"
    return model.eval()
