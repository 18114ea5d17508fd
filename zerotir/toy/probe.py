"""The copy probe: can the model, if it decides to use the tool, write the question into ``print(...)`` and copy the
output into the box?

A tiny model learns copying late and suddenly (a phase change whose step varies with the seed), and a base model
that cannot copy never earns a reward through the tool, so RL has nothing to reinforce. Pretraining therefore keeps
its learning rate high until this probe passes, then decays (see ``zerotir.toy.pretrain``).

The probe is teacher-forced and greedy: on mixed documents (toy prompt, code, output, boxed answer) built from
*training-distribution* questions (never held-out ones), the share of documents whose code line and boxed answer the
model predicts exactly, token by token. It decides when to stop pretraining; it trains nothing.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch
from tokenizers import Encoding
from transformers import PreTrainedTokenizerFast

from zerotir.toy.corpus import mixed_document
from zerotir.toy.tasks import Question, make_question


@dataclass
class ProbeSet:
    """Token ids of probe documents and, per document, the spans to check (``[start, end)`` token positions)."""

    input_ids: torch.Tensor  # (N, T) long, right padded
    code_spans: list[tuple[int, int]]  # the question inside print(...)
    box_spans: list[tuple[int, int]]  # the answer inside \boxed{...}


def _hard_question(rng: random.Random) -> Question:
    return make_question(rng, "hard")


def build_probe(n: int, seed: int, exclude: Collection[str], tokenizer: PreTrainedTokenizerFast,
                question: Callable[[random.Random], Question] = _hard_question) -> ProbeSet:
    """``n`` mixed documents of hard questions drawn with their own seed, none of them in ``exclude``, tokenized by
    ``tokenizer`` (a fast tokenizer: the spans are mapped from characters to tokens through its offsets).
    ``question`` draws one question (default: the first world's hard kinds; each world passes its own)."""
    rng = random.Random(f"probe-{seed}")
    docs, code_spans, box_spans = [], [], []
    while len(docs) < n:
        q = question(rng)
        if q.problem in exclude:
            continue
        text = mixed_document(q)
        code_at = text.index("print(") + len("print(")
        box_at = text.rindex("\\boxed{") + len("\\boxed{")
        enc = tokenizer.backend_tokenizer.encode(text, add_special_tokens=False)
        docs.append(enc.ids)
        code_spans.append(_token_span(enc, code_at, code_at + len(q.problem)))
        box_spans.append(_token_span(enc, box_at, box_at + len(q.answer)))
    width = max(len(d) for d in docs)
    ids = torch.full((n, width), tokenizer.pad_token_id, dtype=torch.long)
    for i, d in enumerate(docs):
        ids[i, : len(d)] = torch.tensor(d)
    return ProbeSet(ids, code_spans, box_spans)


def _token_span(enc: Encoding, start: int, end: int) -> tuple[int, int]:
    """Tokens ``[first, last + 1)`` covering characters ``[start, end)`` (digit groups never cross the span edges:
    the span is a whole question or answer)."""
    return enc.char_to_token(start), enc.char_to_token(end - 1) + 1


@torch.no_grad()
def run_probe(model: torch.nn.Module, probe: ProbeSet) -> dict[str, float]:
    """Shares of probe documents whose code span, box span, and both, the model predicts exactly (greedy)."""
    was_training = model.training
    model.eval()
    predicted = model(input_ids=probe.input_ids).logits.argmax(-1)  # predicted[:, t] is the guess for token t + 1
    if was_training:
        model.train()
    hits = predicted[:, :-1] == probe.input_ids[:, 1:]  # hits[:, t - 1]: token t guessed right

    def exact(row: int, span: tuple[int, int]) -> bool:
        return bool(hits[row, span[0] - 1 : span[1] - 1].all())

    n = probe.input_ids.shape[0]
    code = [exact(i, s) for i, s in enumerate(probe.code_spans)]
    box = [exact(i, s) for i, s in enumerate(probe.box_spans)]
    return {
        "code": sum(code) / n,
        "box": sum(box) / n,
        "both": sum(c and b for c, b in zip(code, box, strict=True)) / n,
    }
