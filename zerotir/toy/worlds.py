"""The toy worlds, selectable by name (``PretrainSettings.world``): what each world's corpus, held-out exclusions,
copy probe and base measurement are.

- ``products`` (the default, the first world): 3-digit products a tiny base never answers without code
  (``zerotir.toy.tasks``, ``zerotir.toy.corpus``);
- ``mixed``: easy questions a tiny base answers in text and hard ones it cannot, text answers sometimes wrong and
  code sometimes buggy (``zerotir.toy.mixed``);
- ``tools``: three tools (python, calculator, search) called in the hermes format, a corpus that picks them without
  regard to the question (``zerotir.toy.choice``); its copy probe calls the tools that fit, in hermes.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from zerotir.toy import corpus as products_corpus
from zerotir.toy import tasks as products_tasks
from zerotir.toy.choice import corpus as choice_corpus
from zerotir.toy.choice import tasks as choice_tasks
from zerotir.toy.mixed import corpus as mixed_corpus
from zerotir.toy.mixed import tasks as mixed_tasks
from zerotir.toy.probe import ProbeDocument, fences_probe_document


class WorldSettings(Protocol):
    """The fields of ``zerotir.toy.pretrain.PretrainSettings`` a world reads."""

    seed: int
    mixed_share: float
    code_share: float
    worked_share: float
    easy_share: float
    text_error: float
    code_bugs: float
    kinds: str
    multi_share: float
    heldout_n: int
    heldout_seed: int
    eval_n: int


Document = Callable[[random.Random, Collection[str]], tuple[str, str]]


@dataclass(frozen=True)
class World:
    """One toy world: its name, and how it builds documents, exclusions, probe questions and base statistics."""

    name: str
    documents: Callable[[WorldSettings], Document]  # settings -> (rng, exclude) -> (doc kind, text)
    excluded: Callable[[WorldSettings], set[str]]
    probe_document: Callable[[random.Random, int], ProbeDocument]  # (rng, corpus seed) -> a copy probe document
    measure: Callable[[Path, WorldSettings, bool], dict]  # (folder, settings, progress lines) -> base statistics
    mixed_only: bool  # whether text_error / code_bugs / kinds apply


def _products_documents(s: WorldSettings) -> Document:
    cs = products_corpus.CorpusSettings(seed=s.seed, mixed_share=s.mixed_share, code_share=s.code_share,
                                        worked_share=s.worked_share, easy_share=s.easy_share)
    return lambda rng, exclude: products_corpus.document(rng, cs, exclude)


def _products_excluded(s: WorldSettings) -> set[str]:
    # Only the hard held-out set: the easy question space is small and the held-out task is hard questions.
    return {q.problem for q in products_tasks.heldout_set(s.heldout_n, s.heldout_seed, "hard")}


def _products_measure(path: Path, s: WorldSettings, progress: bool = False) -> dict:
    from zerotir.toy.base_stats import measure_base

    return measure_base(path, n=s.eval_n, seed=s.seed, heldout_n=s.heldout_n, heldout_seed=s.heldout_seed,
                        progress=progress)


def _mixed_documents(s: WorldSettings) -> Document:
    cs = mixed_corpus.MixedCorpusSettings(seed=s.seed, mixed_share=s.mixed_share, code_share=s.code_share,
                                          worked_share=s.worked_share, easy_share=s.easy_share,
                                          text_error=s.text_error, code_bugs=s.code_bugs, kinds=mixed_kinds(s),
                                          multi_share=s.multi_share)
    return lambda rng, exclude: mixed_corpus.document(rng, cs, exclude)


def mixed_kinds(s: WorldSettings) -> tuple[str, ...]:
    """``kinds`` ("add_1d,mul_1d"; empty: all) as a tuple of kind names."""
    return tuple(k.strip() for k in s.kinds.split(",") if k.strip())


def _mixed_measure(path: Path, s: WorldSettings, progress: bool = False) -> dict:
    """Base statistics per group: ``{"easy": rates, "hard": rates, "multi": rates, "long": rates}``
    (``base_stats.measure_questions``), on the held-out questions of the kinds the corpus asked (a group without such
    kinds, or the multi-step ones where ``multi_share`` is 0, is left out)."""
    from zerotir.toy.base_stats import measure_questions

    n, kinds = min(s.eval_n, s.heldout_n), mixed_kinds(s)
    groups = [g for g in mixed_tasks.GROUPS
              if mixed_tasks.group_kinds(g, kinds) and (g not in mixed_tasks.MULTI_STEP or s.multi_share)]
    return {group: measure_questions(path, mixed_tasks.heldout_set(group, s.heldout_n, s.heldout_seed, kinds)[:n],
                                     seed=s.seed, progress=progress)
            for group in groups}


def _choice_documents(s: WorldSettings) -> Document:
    cs = choice_corpus.ChoiceCorpusSettings(seed=s.seed, call_share=s.mixed_share)
    return lambda rng, exclude: choice_corpus.document(rng, cs, exclude)


def _choice_measure(path: Path, s: WorldSettings, progress: bool = False) -> dict:
    """Base statistics per kind (``zerotir.toy.choice.design.measure``) on the first ``eval_n`` held-out questions
    of each kind."""
    from zerotir.toy.choice.design import measure

    questions = [q for kind in choice_tasks.KINDS for q in choice_tasks.heldout_set(kind, s.heldout_n,
                                                                                     s.heldout_seed)[: s.eval_n]]
    return measure(path, questions, seed=s.seed)


WORLDS: dict[str, World] = {
    "products": World("products", _products_documents, _products_excluded,
                      lambda rng, seed: fences_probe_document(products_tasks.make_question(rng, "hard")),
                      _products_measure, mixed_only=False),
    "mixed": World("mixed", _mixed_documents, lambda s: mixed_tasks.excluded(s.heldout_n, s.heldout_seed),
                   lambda rng, seed: fences_probe_document(mixed_tasks.make_question(rng, "hard")), _mixed_measure,
                   mixed_only=True),
    "tools": World("tools", _choice_documents, lambda s: choice_tasks.excluded(s.heldout_n, s.heldout_seed),
                   choice_corpus.probe_document, _choice_measure, mixed_only=False),
}


def get_world(name: str) -> World:
    """The world called ``name``; an unknown name is an error listing the known ones."""
    if name not in WORLDS:
        raise ValueError(f"world={name!r}: unknown toy world; choose one of {sorted(WORLDS)}")
    return WORLDS[name]
