"""Questions of the ``mixed`` toy world: an easy group a tiny model can answer in its head and a hard group it cannot.

Easy (answerable in text): ``add_1d`` (``3 + 5``) and ``mul_1d`` (``7 * 8``, the times table a model memorises).
(2-digit sums were easy at first; measured, a 0.85M base pretrained until its copy probe passed answered them right
0% of the time at temperature 1, so they were dropped from the easy group.) Hard (out of a tiny model's head): ``mul_3x3`` (``482 * 917``) and ``mul_add``, a two-step
expression of 2-digit numbers (``12 * 34 + 56``).

Held-out sets are drawn per group (``heldout_easy.jsonl``, ``heldout_hard.jsonl``), so validation reports accuracy
and code use on easy and hard questions separately. The corpus and the training stream never ask a held-out question
of a kind whose space is large (both hard kinds); the 1-digit facts (81 sums, 81 products) are the
memorised part of the world and appear in the corpus like any fact on the web.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

from zerotir.toy.tasks import Question, distinct_questions, evaluate, write_jsonl


def _n(rng: random.Random, digits: int) -> int:
    return rng.randint(10 ** (digits - 1) if digits > 1 else 1, 10**digits - 1)


EASY_KINDS: dict[str, Callable[[random.Random], str]] = {
    "add_1d": lambda r: f"{_n(r, 1)} + {_n(r, 1)}",
    "mul_1d": lambda r: f"{_n(r, 1)} * {_n(r, 1)}",
}
HARD_KINDS: dict[str, Callable[[random.Random], str]] = {
    "mul_3x3": lambda r: f"{_n(r, 3)} * {_n(r, 3)}",
    "mul_add": lambda r: f"{_n(r, 2)} * {_n(r, 2)} + {_n(r, 2)}",
}
GROUPS = {"easy": EASY_KINDS, "hard": HARD_KINDS}
# Kinds whose questions are few enough to be memorised facts: never excluded from the corpus.
MEMORISED = ("add_1d", "mul_1d")


def kind_group(kind: str) -> str:
    """``"easy"`` or ``"hard"`` for a kind name of this world."""
    for group, kinds in GROUPS.items():
        if kind in kinds:
            return group
    raise ValueError(f"kind {kind!r}: not a kind of the mixed world; kinds: {sorted(EASY_KINDS) + sorted(HARD_KINDS)}")


def check_kinds(kinds: Collection[str]) -> tuple[str, ...]:
    """``kinds`` checked against the world's kind names (empty = all kinds)."""
    known = sorted(EASY_KINDS) + sorted(HARD_KINDS)
    unknown = [k for k in kinds if k not in known]
    if unknown:
        raise ValueError(f"kinds: unknown {unknown}; the mixed world's kinds are {known}")
    return tuple(kinds)


def group_kinds(group: str, kinds: Collection[str] = ()) -> list[str]:
    """The kinds of ``group`` that ``kinds`` allows (all of the group when ``kinds`` is empty)."""
    if group not in GROUPS:
        raise ValueError(f"group {group!r}: use 'easy' or 'hard'")
    return [k for k in sorted(GROUPS[group]) if not kinds or k in kinds]


def make_question(rng: random.Random, group: str, kinds: Collection[str] = ()) -> Question:
    """One question of ``group`` (``"easy"`` or ``"hard"``), its kind drawn uniformly among the group's kinds that
    ``kinds`` allows (empty: all of them)."""
    allowed = group_kinds(group, kinds)
    if not allowed:
        raise ValueError(f"kinds {sorted(kinds)}: none of them is in the {group} group")
    kind = rng.choice(allowed)
    problem = GROUPS[group][kind](rng)
    return Question(kind=kind, problem=problem, answer=evaluate(problem))


def heldout_set(group: str, n: int = 128, seed: int = 1234, kinds: Collection[str] = ()) -> list[Question]:
    """``n`` distinct held-out questions of ``group`` (of the allowed ``kinds``; empty: all), fixed by ``seed``."""
    rng = random.Random(f"mixed-heldout-{group}-{seed}")
    return distinct_questions(n, lambda: make_question(rng, group, kinds))


def excluded(n: int = 128, seed: int = 1234) -> set[str]:
    """Held-out problems the corpus and the training stream must not ask (all but the memorised 1-digit facts)."""
    return {q.problem for group in GROUPS for q in heldout_set(group, n, seed) if q.kind not in MEMORISED}


def train_stream(seed: int = 0, easy_share: float = 0.5, exclude: Collection[str] = ()) -> Iterator[Question]:
    """An endless seeded stream of questions, easy with probability ``easy_share``, none in ``exclude``."""
    rng = random.Random(f"mixed-train-{seed}")
    blocked = set(exclude)
    while True:
        q = make_question(rng, "easy" if rng.random() < easy_share else "hard")
        if q.problem not in blocked:
            yield q


def write_task_files(out_dir: str | Path, n_train: int = 4096, n_heldout: int = 128, seed: int = 0,
                     heldout_seed: int = 1234, easy_share: float = 0.5) -> dict[str, Path]:
    """Write ``train.jsonl`` (questions none held out, easy with probability ``easy_share``, hard ones distinct),
    ``heldout_easy.jsonl`` and
    ``heldout_hard.jsonl`` into ``out_dir``; returns the paths by name."""
    out = Path(out_dir)
    blocked = excluded(n_heldout, heldout_seed)
    train: list[Question] = []
    seen: set[str] = set()
    # The memorised facts are only 162, so they repeat across the rows (each about n_train * easy_share / 162
    # times); every other question appears once.
    for q in train_stream(seed, easy_share, exclude=blocked):
        if len(train) == n_train:
            break
        if q.kind in MEMORISED or q.problem not in seen:
            seen.add(q.problem)
            train.append(q)
    paths = {"train": write_jsonl(train, out / "train.jsonl", "mixed-train")}
    for group in GROUPS:
        paths[group] = write_jsonl(heldout_set(group, n_heldout, heldout_seed), out / f"heldout_{group}.jsonl",
                                   f"mixed-heldout-{group}")
    return paths


if __name__ == "__main__":
    import sys

    for name, path in write_task_files(sys.argv[1] if len(sys.argv) > 1 else "data/toy_mixed").items():
        print(name, path)
