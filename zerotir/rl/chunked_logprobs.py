"""Log-probs and entropy of a causal LM without its full logits: the decoder's last hidden states go through the LM
head a chunk of tokens at a time (``model.rl.logprob_chunk_tokens``), so a ``(B, T, V)`` logits tensor never exists.

At a 152k vocabulary one 9k-token row of float32 logits is several GB, and the full path keeps it (and the softmax
that backward needs) for the whole micro-batch; here only one chunk's ``(chunk, V)`` logits live at a time. One
autograd function (``_ChunkedHead``) scores every chunk in forward, keeping only the hidden states and labels, and
in backward recomputes each chunk's logits to differentiate them, one chunk at a time, summing the head's gradient
over the chunks and handing it to the parameter once. The cost is a second LM-head matmul per chunk in backward
(Liger's fused linear cross-entropy and verl's fused kernels make the same trade).

Under DeepSpeed ZeRO-3 the head's weight is partitioned. Calling the head module once per chunk would gather it
once per chunk (its forward hooks) and again per chunk in backward's recompute (1.0 GiB at 7B each
time); here it is gathered once for the forward's chunks and once for backward's (``deepspeed.zero.
GatheredParameters``), as often as the full path's one call of the head gathers it. Backward's gather is released
by a node on the hidden states' path (``_ReleaseAfter``), which autograd runs after the parameter's gradient is
accumulated (accumulation nodes go first), so ZeRO-3's gradient hook reduces a gradient of the full shape, as after
the head module's own backward.

The values are the full path's (``zerotir.rl.update.sequence_logprobs`` without ``chunk_tokens``): the logits at
``t - 1`` score token ``t``, divided by the sampling temperature, in float32 (the division here happens after the
cast, the full path's before it: equal in float32, closer to exact in bfloat16). The entropy of each position comes
from the same chunk's logits, with gradient only when asked (an entropy bonus in the loss).

What it relies on (public transformers API): ``model.get_decoder()`` returns the module whose
``last_hidden_state`` feeds ``model.get_output_embeddings()``, an ``nn.Linear``, and the model's logits are exactly
that head applied to those states. That holds for the Llama / Qwen2 / Mistral families this project trains; a model
that post-processes its logits (Gemma 2's soft-capping, Cohere's logit scale) would need that step here too. Tied
input and output embeddings need nothing special: the head's weight is the embedding's, and its gradient from the
head's chunks adds to the one from the embedding lookup.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

__all__ = ["chunked_sequence_logprobs", "head_logprobs"]


def _chunk(weight: Tensor, bias: Tensor | None, hidden: Tensor, labels: Tensor, temperature: float,
           entropy: str) -> tuple[Tensor, Tensor]:
    """Log-probs of ``labels`` (n,) under the head ``(weight, bias)`` on ``hidden`` (n, H) at ``temperature``, and
    the entropy of each row: ``entropy`` "grad" (with gradient), "value" (without) or "none" (zeros, not computed)."""
    logits = F.linear(hidden, weight, bias).float()
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


class _Gather:
    """The head's parameters in full while a block runs: under ZeRO-3 (parameters with a ``ds_id``) a
    ``deepspeed.zero.GatheredParameters``, opened and closed by hand where the block spans two autograd nodes;
    otherwise nothing to do."""

    def __init__(self, params: list[Tensor]) -> None:
        self.params = [p for p in params if hasattr(p, "ds_id")]
        self._open: Any = None

    def open(self) -> None:
        if self.params and self._open is None:
            import deepspeed

            self._open = deepspeed.zero.GatheredParameters(self.params)
            self._open.__enter__()

    def close(self) -> None:
        if self._open is not None:
            opened, self._open = self._open, None
            opened.__exit__(None, None, None)


class _ReleaseAfter(torch.autograd.Function):
    """Identity on the hidden states whose backward closes backward's gather of the head (``_Gather``): it runs after
    ``_ChunkedHead``'s backward and after the head's gradient is accumulated into its parameter."""

    @staticmethod
    def forward(ctx: Any, hidden: Tensor, gather: _Gather) -> Tensor:
        ctx.gather = gather
        return hidden.view_as(hidden)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        ctx.gather.close()
        return grad, None


class _ChunkedHead(torch.autograd.Function):
    """``(logp, entropy)`` of ``labels`` through the head ``(weight, bias)``, ``chunk`` rows of ``hidden`` at a time.
    Forward keeps no logits; backward opens the head's gather once (``gather``; ``_ReleaseAfter`` closes it) and
    recomputes each chunk's logits to differentiate them."""

    @staticmethod
    def forward(ctx: Any, hidden: Tensor, labels: Tensor, weight: Tensor, bias: Tensor | None, gather: _Gather,
                temperature: float, chunk: int, entropy: str) -> tuple[Tensor, Tensor]:
        parts = [_chunk(weight, bias, hidden[s:s + chunk], labels[s:s + chunk], temperature, entropy)
                 for s in range(0, hidden.shape[0], chunk)]
        ctx.save_for_backward(hidden, labels)
        ctx.head, ctx.gather, ctx.settings = (weight, bias), gather, (temperature, chunk, entropy)
        logp, ent = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        if entropy != "grad":
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx: Any, grad_logp: Tensor, grad_ent: Tensor | None) -> tuple:
        hidden, labels = ctx.saved_tensors
        temperature, chunk, entropy = ctx.settings
        ctx.gather.open()
        weight, bias = (None if p is None else p.detach().requires_grad_(need)
                        for p, need in zip(ctx.head, ctx.needs_input_grad[2:4]))
        grad_hidden = []
        for s in range(0, hidden.shape[0], chunk):
            h = hidden[s:s + chunk].detach().requires_grad_(ctx.needs_input_grad[0])
            with torch.enable_grad():
                logp, ent = _chunk(weight, bias, h, labels[s:s + chunk], temperature, entropy)
                outputs, grads = [logp], [grad_logp[s:s + chunk]]
                if entropy == "grad" and grad_ent is not None:
                    outputs.append(ent)
                    grads.append(grad_ent[s:s + chunk])
                torch.autograd.backward(outputs, grads)  # the head's gradient sums over the chunks
            grad_hidden.append(h.grad)
        # No _ReleaseAfter node (the hidden states need no gradient): the gather closes here, which under ZeRO-3
        # is before the head's gradient is accumulated (a frozen decoder with a trained head is not supported).
        if not ctx.needs_input_grad[0]:
            ctx.gather.close()
        dh = torch.cat(grad_hidden) if ctx.needs_input_grad[0] else None
        return (dh, None, None if weight is None else weight.grad, None if bias is None else bias.grad,
                None, None, None, None)


def head_logprobs(head: nn.Linear, hidden: Tensor, labels: Tensor, *, temperature: float, chunk_tokens: int,
                  with_entropy: bool = False, entropy_grad: bool = False) -> tuple[Tensor, Tensor | None]:
    """``(logp, entropy)`` of ``labels`` (N,) given ``hidden`` (N, H), through the linear ``head``
    ``chunk_tokens`` rows at a time, both (N,) float32; with gradients on, backward recomputes each chunk's logits."""
    if chunk_tokens < 1:
        raise ValueError(f"model.rl.logprob_chunk_tokens={chunk_tokens}: must be >= 1 (or null: the full logits)")
    if not isinstance(head, nn.Linear):
        raise TypeError(f"model.rl.logprob_chunk_tokens needs the model's output embeddings to be an nn.Linear, "
                        f"got {type(head).__name__}: set model.rl.logprob_chunk_tokens null (the full logits)")
    mode = "none" if not with_entropy else ("grad" if entropy_grad else "value")
    if hidden.shape[0] == 0:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty if with_entropy else None
    gather = _Gather([head.weight] + ([] if head.bias is None else [head.bias]))
    if torch.is_grad_enabled() and hidden.requires_grad:
        hidden = _ReleaseAfter.apply(hidden, gather)
    gather.open()  # the forward's one gather: the parameters enter the function in full (their gradient's shape)
    try:
        logp, entropy = _ChunkedHead.apply(hidden, labels, head.weight, head.bias, gather, temperature,
                                           chunk_tokens, mode)
    finally:
        gather.close()
    return logp, entropy if with_entropy else None
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
