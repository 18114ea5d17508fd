"""Questions of the ``mixed`` toy world: an easy group a tiny model can answer in its head and a hard group it cannot.

Easy (answerable in text): ``add_1d`` (``3 + 5``) and ``mul_1d`` (``7 * 8``, the times table a model memorises).
(2-digit sums were easy at first; measured, a 0.85M base pretrained until its copy probe passed answered them right
0% of the time at temperature 1, so they were dropped from the easy group.) Hard (out of a tiny model's head):
``mul_3x3`` (``482 * 917``) and ``mul_add``, a two-step expression of 2-digit numbers (``12 * 34 + 56``).

Multi-step (the third group, asked only where ``multi_share`` > 0): ``dsum_2x2`` and ``dsum_3x3``, the digit sum of a
2-digit or a 3-digit product (``digitsum(482 * 917)``). ``digitsum`` is no Python function, so copying the question
into one call fails (a ``NameError``); the world's reliable solution runs two: the product, then the sum of the
digits the model reads off its output (``print(4 + 4 + 1 + 9 + 9 + 4)``). A call budget of 1 leaves the second step
to the model's head, where a tiny model adds four to six digits badly: the budget, and how many calls a right answer
takes, are measured here. (Measured on 0.85M bases: with 3-digit products alone the base wrote the two calls in the
right shape but copied the digits off the output badly, and 30 RL steps left it at 5% on them; with the 2-digit
half, whose outputs have four digits at most, it learned the copy, and RL reached 100% within 10 steps.)

Long (held out only, with the multi-step questions): ``dsum_4x3`` and ``dsum_4x4``, the same two steps on products
with a 4-digit factor (``digitsum(4821 * 917)``). They are never asked in the corpus or the training stream, so their
accuracy measures how far the procedure learned on shorter products carries: the split with headroom, where a larger
model has room to show.

Held-out sets are drawn per group (``heldout_easy.jsonl``, ``heldout_hard.jsonl``), so validation reports accuracy
and code use on easy and hard questions separately. The corpus and the training stream never ask a held-out question
of a kind whose space is large (both hard kinds); the 1-digit facts (81 sums, 81 products) are the
memorised part of the world and appear in the corpus like any fact on the web.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

from zerotir.toy.tasks import Question, distinct_questions, evaluate, write_heldout, write_jsonl


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


def _digit_sum(a: int, b: int) -> Callable[[random.Random], str]:
    """The question kind ``digitsum(A * B)`` of an ``a``-digit and a ``b``-digit factor."""
    return lambda r: f"digitsum({_n(r, a)} * {_n(r, b)})"


MULTI_KINDS: dict[str, Callable[[random.Random], str]] = {"dsum_2x2": _digit_sum(2, 2), "dsum_3x3": _digit_sum(3, 3)}
# Held out only: the same two steps with a 4-digit factor (six to eight digits to read off and add), never in the
# corpus or the training stream: how far the learned procedure carries, where a larger model has room to show.
LONG_KINDS: dict[str, Callable[[random.Random], str]] = {"dsum_4x3": _digit_sum(4, 3), "dsum_4x4": _digit_sum(4, 4)}
GROUPS = {"easy": EASY_KINDS, "hard": HARD_KINDS, "multi": MULTI_KINDS, "long": LONG_KINDS}
MULTI_STEP = ("multi", "long")  # the groups asked only where multi_share > 0
# Kinds whose questions are few enough to be memorised facts: never excluded from the corpus.
MEMORISED = ("add_1d", "mul_1d")


def kind_group(kind: str) -> str:
    """``"easy"`` or ``"hard"`` for a kind name of this world."""
    for group, kinds in GROUPS.items():
        if kind in kinds:
            return group
    raise ValueError(f"kind {kind!r}: not a kind of the mixed world; kinds: {_known()}")


def _known() -> list[str]:
    return [kind for kinds in GROUPS.values() for kind in sorted(kinds)]


def check_kinds(kinds: Collection[str]) -> tuple[str, ...]:
    """``kinds`` checked against the world's kind names (empty = all kinds)."""
    known = _known()
    unknown = [k for k in kinds if k not in known]
    if unknown:
        raise ValueError(f"kinds: unknown {unknown}; the mixed world's kinds are {known}")
    return tuple(kinds)


def group_kinds(group: str, kinds: Collection[str] = ()) -> list[str]:
    """The kinds of ``group`` that ``kinds`` allows (all of the group when ``kinds`` is empty)."""
    if group not in GROUPS:
        raise ValueError(f"group {group!r}: use one of {sorted(GROUPS)}")
    return [k for k in sorted(GROUPS[group]) if not kinds or k in kinds]


def make_question(rng: random.Random, group: str, kinds: Collection[str] = ()) -> Question:
    """One question of ``group`` (``"easy"`` or ``"hard"``), its kind drawn uniformly among the group's kinds that
    ``kinds`` allows (empty: all of them)."""
    allowed = group_kinds(group, kinds)
    if not allowed:
        raise ValueError(f"kinds {sorted(kinds)}: none of them is in the {group} group")
    kind = rng.choice(allowed)
    problem = GROUPS[group][kind](rng)
    return Question(kind=kind, problem=problem, answer=solve(problem))


def solve(problem: str) -> str:
    """The answer to a question of this world: an arithmetic expression's value, or ``digitsum(E)``'s."""
    inner = problem.removeprefix("digitsum(").removesuffix(")")
    if inner == problem:
        return evaluate(problem)
    return str(sum(int(d) for d in evaluate(inner).lstrip("-")))


def draw_group(rng: random.Random, easy_share: float, multi_share: float) -> str:
    """``"easy"`` with probability ``easy_share``, ``"multi"`` with ``multi_share``, else ``"hard"`` (one draw of
    ``rng`` whatever the shares, so a world without multi-step questions draws as it did before they existed)."""
    u = rng.random()
    return "easy" if u < easy_share else "multi" if u < easy_share + multi_share else "hard"


def heldout_set(group: str, n: int = 128, seed: int = 1234, kinds: Collection[str] = ()) -> list[Question]:
    """``n`` distinct held-out questions of ``group`` (of the allowed ``kinds``; empty: all), fixed by ``seed``."""
    rng = random.Random(f"mixed-heldout-{group}-{seed}")
    return distinct_questions(n, lambda: make_question(rng, group, kinds))


def excluded(n: int = 128, seed: int = 1234) -> set[str]:
    """Held-out problems the corpus and the training stream must not ask (all but the memorised 1-digit facts)."""
    return {q.problem for group in GROUPS for q in heldout_set(group, n, seed) if q.kind not in MEMORISED}


def train_stream(seed: int = 0, easy_share: float = 0.5, exclude: Collection[str] = (),
                 multi_share: float = 0.0) -> Iterator[Question]:
    """An endless seeded stream of questions, easy with probability ``easy_share``, multi-step with
    ``multi_share``, else hard; none in ``exclude``."""
    rng = random.Random(f"mixed-train-{seed}")
    blocked = set(exclude)
    while True:
        q = make_question(rng, draw_group(rng, easy_share, multi_share))
        if q.problem not in blocked:
            yield q


def write_task_files(out_dir: str | Path, n_train: int = 4096, n_heldout: int = 128, seed: int = 0,
                     heldout_seed: int = 1234, easy_share: float = 0.5, multi_share: float = 0.0) -> dict[str, Path]:
    """Write ``train.jsonl`` (questions none held out, easy with probability ``easy_share``, multi-step with
    ``multi_share``, the others distinct), ``heldout_easy.jsonl``, ``heldout_hard.jsonl`` and (``multi_share`` > 0)
    ``heldout_multi.jsonl`` and ``heldout_long.jsonl`` into ``out_dir``; returns the paths by name."""
    out = Path(out_dir)
    blocked = excluded(n_heldout, heldout_seed)
    train: list[Question] = []
    seen: set[str] = set()
    # The memorised facts are only 162, so they repeat across the rows (each about n_train * easy_share / 162
    # times); every other question appears once.
    for q in train_stream(seed, easy_share, exclude=blocked, multi_share=multi_share):
        if len(train) == n_train:
            break
        if q.kind in MEMORISED or q.problem not in seen:
            seen.add(q.problem)
            train.append(q)
    groups = [g for g in GROUPS if g not in MULTI_STEP or multi_share > 0]
    return {"train": write_jsonl(train, out / "train.jsonl", "mixed-train"),
            **write_heldout(out, groups, lambda group: heldout_set(group, n_heldout, heldout_seed), "mixed")}


if __name__ == "__main__":
    import argparse

    cli = argparse.ArgumentParser(description="write the mixed world's task files")
    cli.add_argument("out", nargs="?", default="data/toy_mixed")
    cli.add_argument("--easy_share", type=float, default=0.5)
    cli.add_argument("--multi_share", type=float, default=0.0, help="multi-step questions (data/toy_multi: 0.25)")
    given = cli.parse_args()
    for name, path in write_task_files(given.out, easy_share=given.easy_share, multi_share=given.multi_share).items():
        print(name, path)
