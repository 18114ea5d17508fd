"""Log-probs and entropy of a causal LM without its full logits: the decoder's last hidden states go through the LM
head a chunk of tokens at a time (``model.rl.logprob_chunk_tokens``), so a ``(B, T, V)`` logits tensor never exists.

At a 152k vocabulary one 9k-token row of float32 logits is several GB, and the full path keeps it (and the softmax
that backward needs) for the whole micro-batch; here only one chunk's ``(chunk, V)`` logits live at a time. With
gradient, each chunk runs under ``torch.utils.checkpoint`` (non-reentrant): the forward keeps only the chunk's
hidden states and labels, and the backward recomputes the chunk's logits to differentiate them, one chunk at a time.
The cost is a second LM-head matmul per chunk in backward (Liger's fused linear cross-entropy and verl's fused
kernels make the same trade).

The values are the full path's (``zerotir.rl.update.sequence_logprobs`` without ``chunk_tokens``): the logits at
``t - 1`` score token ``t``, divided by the sampling temperature, in float32 (the division here happens after the
cast, the full path's before it: equal in float32, closer to exact in bfloat16). The entropy of each position comes
from the same chunk's logits, with gradient only when asked (an entropy bonus in the loss).

What it relies on (public transformers API): ``model.get_decoder()`` returns the module whose
``last_hidden_state`` feeds ``model.get_output_embeddings()``, and the model's logits are exactly that head applied
to those states. That holds for the Llama / Qwen2 / Mistral families this project trains; a model that post-processes
its logits (Gemma 2's soft-capping, Cohere's logit scale) would need that step here too. Tied input and output
embeddings need nothing special: the head's weight is the embedding's, and its gradient from the head's recomputed
chunks adds to the one from the embedding lookup.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

__all__ = ["chunked_sequence_logprobs", "head_logprobs"]


def _chunk(head: nn.Module, hidden: Tensor, labels: Tensor, temperature: float, entropy: str) -> tuple[Tensor, Tensor]:
    """Log-probs of ``labels`` (n,) under ``head(hidden)`` (n, H) at ``temperature``, and the entropy of each row:
    ``entropy`` "grad" (with gradient), "value" (without) or "none" (zeros, not computed)."""
    logits = head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - lse
    if entropy == "none":
        return logp, torch.zeros_like(logp)
    with torch.set_grad_enabled(torch.is_grad_enabled() and entropy == "grad"):
        log_softmax = logits - lse.unsqueeze(-1)
        p = log_softmax.exp()
        plogp = torch.where(p > 0, p * log_softmax, torch.zeros_like(p))  # p = 0 (logit -inf) adds 0, not NaN
        return logp, -plogp.sum(dim=-1)


def head_logprobs(head: nn.Module, hidden: Tensor, labels: Tensor, *, temperature: float, chunk_tokens: int,
                  with_entropy: bool = False, entropy_grad: bool = False) -> tuple[Tensor, Tensor | None]:
    """``(logp, entropy)`` of ``labels`` (N,) given ``hidden`` (N, H), through ``head`` ``chunk_tokens`` rows at a
    time, both (N,) float32; each chunk checkpointed when gradients are on, so backward recomputes its logits."""
    if chunk_tokens < 1:
        raise ValueError(f"model.rl.logprob_chunk_tokens={chunk_tokens}: must be >= 1 (or null: the full logits)")
    mode = "none" if not with_entropy else ("grad" if entropy_grad else "value")
    recompute = torch.is_grad_enabled()
    logps, entropies = [], []
    for start in range(0, hidden.shape[0], chunk_tokens):
        h, y = hidden[start:start + chunk_tokens], labels[start:start + chunk_tokens]
        if recompute:
            logp, ent = checkpoint(_chunk, head, h, y, temperature, mode, use_reentrant=False)
        else:
            logp, ent = _chunk(head, h, y, temperature, mode)
        logps.append(logp)
        entropies.append(ent)
    if not logps:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty if with_entropy else None
    return torch.cat(logps), torch.cat(entropies) if with_entropy else None


def chunked_sequence_logprobs(
    model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None, *, temperature: float, chunk_tokens: int,
    with_entropy: bool = False, entropy_grad: bool = False, position_ids: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """``sequence_logprobs`` from the decoder's hidden states: log-probs (and entropy) ``(B, T)``, aligned with
    ``input_ids`` (position 0 gets 0), the LM head applied ``chunk_tokens`` tokens at a time. ``position_ids`` and
    a 4D (or no) ``attention_mask`` are a packed row's (``zerotir.rl.packing.packed_inputs``)."""
    hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask,
                                 position_ids=position_ids).last_hidden_state
    b, t = input_ids.shape
    states = hidden[:, :-1].reshape(b * (t - 1), hidden.shape[-1])
    labels = input_ids[:, 1:].reshape(-1).long()
    logp, entropy = head_logprobs(model.get_output_embeddings(), states, labels, temperature=temperature,
                                  chunk_tokens=chunk_tokens, with_entropy=with_entropy, entropy_grad=entropy_grad)
    pad = (1, 0)
    logp = nn.functional.pad(logp.view(b, t - 1), pad)
    return logp, None if entropy is None else nn.functional.pad(entropy.view(b, t - 1), pad)
