"""The copy probe: can the model, if it decides to use the tool, write the question into its call (``print(...)``
in the fences worlds, the call's argument in the tools world) and copy the output into the box?

A tiny model learns copying late and suddenly (a phase change whose step varies with the seed), and a base model
that cannot copy never earns a reward through the tool, so RL has nothing to reinforce. Pretraining therefore keeps
its learning rate high until this probe passes, then decays (see ``zerotir.toy.pretrain``).

The probe is teacher-forced and greedy: on documents of a successful tool call (toy prompt, call, output, boxed
answer; each world writes its own, :class:`ProbeDocument`) built from *training-distribution* questions (never
held-out ones), the share of documents whose copied question and boxed answer the model predicts exactly, token by
token. It decides when to stop pretraining; it trains nothing.
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


@dataclass(frozen=True)
class ProbeDocument:
    """One probe document: its question (checked against the exclusions), its text, and the character spans
    ``[start, end)`` of the question copied into the call and of the answer copied into the box."""

    problem: str
    text: str
    code: tuple[int, int]
    box: tuple[int, int]


def fences_probe_document(q: Question) -> ProbeDocument:
    """The fences worlds' probe document: ``mixed_document(q)``, the question inside ``print(...)``."""
    text = mixed_document(q)
    code_at = text.index("print(") + len("print(")
    box_at = text.rindex("\\boxed{") + len("\\boxed{")
    return ProbeDocument(q.problem, text, (code_at, code_at + len(q.problem)), (box_at, box_at + len(q.answer)))


def _hard_document(rng: random.Random) -> ProbeDocument:
    return fences_probe_document(make_question(rng, "hard"))


def build_probe(n: int, seed: int, exclude: Collection[str], tokenizer: PreTrainedTokenizerFast,
                document: Callable[[random.Random], ProbeDocument] = _hard_document) -> ProbeSet:
    """``n`` probe documents drawn with their own seed, none of their questions in ``exclude``, tokenized by
    ``tokenizer`` (a fast tokenizer: the spans are mapped from characters to tokens through its offsets).
    ``document`` draws one (default: the first world's hard questions in fences; each world passes its own)."""
    rng = random.Random(f"probe-{seed}")
    docs, code_spans, box_spans = [], [], []
    while len(docs) < n:
        doc = document(rng)
        if doc.problem in exclude:
            continue
        enc = tokenizer.backend_tokenizer.encode(doc.text, add_special_tokens=False)
        docs.append(enc.ids)
        code_spans.append(_token_span(enc, *doc.code))
        box_spans.append(_token_span(enc, *doc.box))
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
