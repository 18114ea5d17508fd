"""Seeded arithmetic questions for the toy world: easy ones a tiny model can learn to answer in its head, hard ones it
cannot (3-digit by 3-digit products), a training stream and a fixed held-out set.

A question is an expression such as ``"482 * 917"``; its answer is the exact integer, as a string. Rows are written as
JSONL ``{"id", "problem", "answer"}`` so the normal data module reads them (fields ``problem`` / ``answer``).

The held-out set and the training stream are disjoint: the stream skips every expression of the held-out set, and so
does the pretraining corpus (``zerotir.toy.corpus``), so the base model never saw a held-out question.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Question:
    """One arithmetic question: ``problem`` is a Python-evaluable expression, ``answer`` its exact integer value."""

    kind: str
    problem: str
    answer: str


def _num(rng: random.Random, digits: int) -> int:
    """A number with exactly ``digits`` digits (1-digit numbers start at 1 so that no operand is 0)."""
    return rng.randint(10 ** (digits - 1) if digits > 1 else 1, 10**digits - 1)


def _join(terms: list[int], op: str) -> str:
    return f" {op} ".join(str(t) for t in terms)


# Each generator returns an expression; the answer is always computed from it (never written by hand).
EASY_KINDS: dict[str, Callable[[random.Random], str]] = {
    "add_1d": lambda r: _join([_num(r, 1), _num(r, 1)], "+"),
    "add_2d": lambda r: _join([_num(r, 2), _num(r, _digits(r, 1, 2))], "+"),
    "sub_2d": lambda r: _sub(r, 2),
    "mul_1d": lambda r: _join([_num(r, 1), _num(r, 1)], "*"),
    "mul_2x1": lambda r: _join([_num(r, 2), _num(r, 1)], "*"),
}
# The hard task of the toy world: one fixed format, so that every hard question has the same length (9 characters).
# A tiny model learns to copy a question (into ``print(...)`` or a restated answer) far sooner when its length is
# fixed: measured, a 0.85M Llama learned it in ~1300 pretraining steps with 3-digit products only and had not by 1400
# with the two kinds below mixed in (docs/toy.md).
HARD_KINDS: dict[str, Callable[[random.Random], str]] = {
    "mul_3x3": lambda r: _join([_num(r, 3), _num(r, 3)], "*"),
}
# More hard kinds, usable by name (``kinds="sum_4d,mul_add"``), not part of the "hard" group.
MORE_KINDS: dict[str, Callable[[random.Random], str]] = {
    "sum_4d": lambda r: _join([_num(r, 4) for _ in range(r.randint(3, 4))], "+"),
    "mul_add": lambda r: f"{_num(r, 2)} * {_num(r, 3)} + {_num(r, 4)}",
}
ALL_KINDS = {**EASY_KINDS, **HARD_KINDS, **MORE_KINDS}


def _digits(rng: random.Random, low: int, high: int) -> int:
    """A digit count drawn uniformly from ``[low, high]``."""
    return rng.randint(low, high)


def _sub(rng: random.Random, digits: int) -> str:
    a, b = _num(rng, digits), _num(rng, _digits(rng, 1, digits))
    a, b = max(a, b), min(a, b)  # keep answers non-negative: "-" would also be an operator token to copy
    return _join([a, b], "-")


def evaluate(problem: str) -> str:
    """The exact integer value of an expression made of integers, ``+``, ``-`` and ``*``."""
    allowed = set("0123456789+-* ")
    if not problem or not set(problem) <= allowed or "**" in problem:  # "**" could ask for a huge power
        raise ValueError(f"problem {problem!r}: only integers, '+', '-', '*' and spaces are allowed")
    return str(eval(problem, {"__builtins__": {}}, {}))  # safe: the character check above leaves only arithmetic


def resolve_kinds(kinds: str | list[str]) -> list[str]:
    """``"easy"``, ``"hard"``, ``"all"`` or a list of kind names -> the list of kind names, checked."""
    if isinstance(kinds, str):
        groups = {"easy": list(EASY_KINDS), "hard": list(HARD_KINDS), "all": list(ALL_KINDS)}
        if kinds in groups:
            return groups[kinds]
        kinds = [k.strip() for k in kinds.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in ALL_KINDS]
    if unknown or not kinds:
        raise ValueError(
            f"kinds: unknown {unknown or kinds!r}; use 'easy', 'hard', 'all' or names from {sorted(ALL_KINDS)}"
        )
    return list(kinds)


def make_question(rng: random.Random, kinds: str | list[str] = "hard") -> Question:
    """One question of a kind drawn uniformly from ``kinds``."""
    kind = rng.choice(resolve_kinds(kinds))
    problem = ALL_KINDS[kind](rng)
    return Question(kind=kind, problem=problem, answer=evaluate(problem))


def distinct_questions(n: int, make: Callable[[], Question]) -> list[Question]:
    """The first ``n`` questions of ``make()`` with distinct problems (a held-out set: ``make`` draws from a seeded
    generator, so the set is fixed by that seed)."""
    if n < 1:
        raise ValueError(f"n={n}: the held-out set needs at least one question")
    seen: set[str] = set()
    out: list[Question] = []
    while len(out) < n:
        q = make()
        if q.problem not in seen:
            seen.add(q.problem)
            out.append(q)
    return out


def heldout_set(n: int = 256, seed: int = 1234, kinds: str | list[str] = "hard") -> list[Question]:
    """A fixed set of ``n`` distinct questions (same ``n``, ``seed`` and ``kinds`` give the same set)."""
    rng = random.Random(f"heldout-{seed}")
    return distinct_questions(n, lambda: make_question(rng, kinds))


def train_stream(
    seed: int = 0, kinds: str | list[str] = "hard", exclude: Collection[str] = ()
) -> Iterator[Question]:
    """An endless seeded stream of questions whose expressions are not in ``exclude`` (e.g. the held-out problems)."""
    rng = random.Random(f"train-{seed}")
    excluded = set(exclude)
    while True:
        q = make_question(rng, kinds)
        if q.problem not in excluded:
            yield q


def write_jsonl(questions: list[Question], path: str | Path, prefix: str) -> Path:
    """Write rows ``{"id": f"{prefix}-{i}", "problem", "answer"}`` (plus ``kind``), one JSON object a line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for i, q in enumerate(questions):
            row = {"id": f"{prefix}-{i}", "problem": q.problem, "answer": q.answer, "kind": q.kind}
            f.write(json.dumps(row) + "\n")
    return path


def write_heldout(out_dir: str | Path, groups: Iterable[str], heldout: Callable[[str], list[Question]],
                  prefix: str) -> dict[str, Path]:
    """Write ``heldout_<group>.jsonl`` into ``out_dir`` for each group, its rows ``heldout(group)`` with ids
    ``<prefix>-heldout-<group>-<i>``; returns the paths by group (a world's held-out files, one a kind)."""
    return {group: write_jsonl(heldout(group), Path(out_dir) / f"heldout_{group}.jsonl", f"{prefix}-heldout-{group}")
            for group in groups}


def read_jsonl(path: str | Path) -> list[Question]:
    """Read rows written by :func:`write_jsonl` back as questions (the answer is checked against the problem)."""
    out = []
    for lineno, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        for key in ("problem", "answer"):
            if not str(row.get(key, "")).strip():
                raise ValueError(f"{path}:{lineno}: field {key!r} is missing or empty")
        if evaluate(row["problem"]) != str(row["answer"]):
            raise ValueError(f"{path}:{lineno}: answer {row['answer']!r} is not the value of {row['problem']!r}")
        out.append(Question(kind=row.get("kind", ""), problem=row["problem"], answer=str(row["answer"])))
    return out


def write_task_files(
    out_dir: str | Path,
    n_train: int = 4096,
    n_heldout: int = 256,
    seed: int = 0,
    heldout_seed: int = 1234,
    kinds: str | list[str] = "hard",
) -> tuple[Path, Path]:
    """Write ``train.jsonl`` (``n_train`` distinct questions, none held out) and ``heldout.jsonl`` into ``out_dir``."""
    held = heldout_set(n_heldout, heldout_seed, kinds)
    train: list[Question] = []
    seen = {q.problem for q in held}
    for q in train_stream(seed, kinds, exclude=seen):
        if len(train) == n_train:
            break
        if q.problem not in seen:  # distinct rows: a repeated question would weigh double in an epoch
            seen.add(q.problem)
            train.append(q)
    out = Path(out_dir)
    return write_jsonl(train, out / "train.jsonl", "toy-train"), write_jsonl(held, out / "heldout.jsonl", "toy-heldout")
