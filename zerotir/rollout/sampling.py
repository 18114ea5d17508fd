"""Picking the next token, and finding stop strings, for ``HFEngine``."""

from __future__ import annotations

from collections.abc import Hashable

import torch
from transformers import PreTrainedTokenizerBase


def sample_tokens(
    logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row of ``logits`` (B, V) and return ``(tokens (B,), logprobs (B,))``.

    ``temperature == 0``: argmax, with the log-prob under the model's raw distribution (the degenerate greedy
    distribution carries no information). Otherwise the token is drawn from ``softmax(logits / temperature)``
    restricted to the top-p nucleus and renormalized, and the log-prob is taken under that same distribution.
    """
    logits = logits.float()
    if temperature == 0:
        tokens = logits.argmax(dim=-1)
        logp = torch.log_softmax(logits, dim=-1)
    else:
        scaled = logits / temperature
        if top_p < 1.0:
            scaled = _top_p_filter(scaled, top_p)
        logp = torch.log_softmax(scaled, dim=-1)
        # Inverse-CDF draw, one uniform per row: ~10x cheaper than torch.multinomial on CPU for small batches.
        # Scaling u by the total mass absorbs rounding; a zero-probability token never has cdf > its predecessor.
        cdf = logp.exp().cumsum(dim=-1)
        u = torch.rand(cdf.shape[0], 1, generator=generator, device=cdf.device) * cdf[:, -1:]
        tokens = torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp(max=cdf.shape[-1] - 1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


def sample_rows(
    logits: torch.Tensor, samplers: list[tuple[float, float]], generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``sample_tokens`` with each row's own ``(temperature, top_p)`` (``samplers[i]`` for row i of ``logits``): the
    rows of each sampler drawn together, so a batch of one sampler draws exactly as ``sample_tokens`` does, and a
    greedy row beside sampled ones draws no random number."""
    kinds = dict.fromkeys(samplers)
    if len(kinds) == 1:
        return sample_tokens(logits, *samplers[0], generator)
    tokens = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
    logps = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    for kind in kinds:
        rows = torch.tensor([i for i, k in enumerate(samplers) if k == kind], device=logits.device)
        tokens[rows], logps[rows] = sample_tokens(logits.index_select(0, rows), *kind, generator)
    return tokens, logps


def _top_p_filter(scaled: torch.Tensor, top_p: float) -> torch.Tensor:
    """Set to -inf the logits outside the smallest set of top tokens whose probability mass reaches ``top_p``."""
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # mass of the strictly better tokens; the top token always stays
    sorted_logits[mass_before >= top_p] = float("-inf")
    return torch.full_like(scaled, float("-inf")).scatter(-1, order, sorted_logits)


class StopMatcher:
    """Finds stop strings in the decoded tail of each row (a window long enough to hold the longest stop).

    A stop can only be completed by a token whose text holds the stop's last character, so ``candidate[id]`` marks
    those tokens (and, to stay safe, tokens that decode to a partial character, and all tokens when a stop ends in
    whitespace, which some tokenizers drop when decoding a token alone); rows whose new token is not a candidate
    skip the decode. On a tool loop's batch this removes most of the per-step decoding.

    Args:
        tokenizer: decodes the tails.
        stops: the stop strings (non-empty).
        vocab_size: the model's vocabulary size (ids past the tokenizer's are treated as candidates).
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stops: list[str], vocab_size: int):
        self.stops = list(stops)
        # A stop of k bytes spans at most k + 1 tokens that each decode to >= 1 character; +2 for safety.
        self.window = max(len(s.encode()) for s in stops) + 2
        # The Rust tokenizer's batch decode skips transformers' per-call Python overhead (~3x faster per step).
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None:
            self._decode = lambda tails: backend.decode_batch(tails, skip_special_tokens=True)
        else:
            self._decode = lambda tails: tokenizer.batch_decode(tails, skip_special_tokens=True)
        self.candidate = self._candidates(len(tokenizer), vocab_size)

    def _candidates(self, known: int, vocab_size: int) -> list[bool]:
        if any(s[-1].isspace() for s in self.stops):
            return [True] * vocab_size
        lasts = {s[-1] for s in self.stops}
        texts = self._decode([[i] for i in range(min(known, vocab_size))])
        marks = [any(c in text for c in lasts) or "\ufffd" in text for text in texts]
        return marks + [True] * (vocab_size - len(marks))

    def match(self, tails: list[list[int]]) -> list[str | None]:
        """For each tail of ids, the first stop (in ``stops`` order) found in its decoded text, or None."""
        texts = self._decode(tails)
        return [next((s for s in self.stops if s in text), None) for text in texts]


def ended_rows(rows: list[tuple[Hashable, list[int], StopMatcher | None, int]],
               eos_ids: set[int]) -> list[tuple[Hashable, str, str | None]]:
    """The rows that the id they just sampled ends, as ``(key, reason, stop)``: reason "eos" (an EOS id), "stop"
    (``stop`` completed; looked for only when the new id can complete one, ``StopMatcher.candidate``) or "length"
    (the row's limit reached).

    Args:
        rows: ``(key, ids sampled so far with the new one last, stop matcher or None, token limit)`` per running row.
        eos_ids: ids that end a row.
    """
    ended: list[tuple[Hashable, str, str | None]] = []
    to_check: dict[StopMatcher, list[tuple[Hashable, list[int], int]]] = {}
    for key, ids, matcher, limit in rows:
        if ids[-1] in eos_ids:
            ended.append((key, "eos", None))
        elif matcher is not None and matcher.candidate[ids[-1]]:
            to_check.setdefault(matcher, []).append((key, ids, limit))
        elif len(ids) >= limit:
            ended.append((key, "length", None))
    for matcher, items in to_check.items():
        hits = matcher.match([ids[-matcher.window :] for _, ids, _ in items])
        for (key, ids, limit), hit in zip(items, hits):
            if hit is not None:
                ended.append((key, "stop", hit))
            elif len(ids) >= limit:
                ended.append((key, "length", None))
    return ended
