"""Questions, fact table and task files of the ``tools`` world.

Kinds (the ``kind`` field of every row), each with the tools that can answer it (:data:`ANSWERING`; ``none`` is an
answer in text without a call):

- ``easy``: a sum of two 1-digit numbers (``3 + 5``): the base answers it in text; a computing tool also works.
- ``arith``: a 3-digit by 2-digit product (``482 * 47``), out of a tiny model's head: ``calculator`` or ``python``.
- ``lookup``: the code of a made-up item (``code of zorbla``): a 3-digit number found only in the search corpus.
- ``combined``: a looked-up code times a 2-digit number (``code of zorbla * 47``): ``search`` first, then a
  computing tool on the value read off the passage.

The fact table (:func:`fact_table`, ``facts.jsonl``, the search tool's corpus) holds ``N_ITEMS`` items; the last
``N_HELDOUT_ITEMS`` of them are never asked in training, so the held-out lookups and combined questions ask values
never seen in training. The pretraining corpus uses items of its own (:func:`corpus_items`, disjoint by name), so no
code of the fact table appears in the pretraining text.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

from zerotir.metric_names import NO_CALL  # the first-call label of an answer without a call
from zerotir.toy.tasks import Question, distinct_questions, write_heldout, write_jsonl

KINDS = ("easy", "arith", "lookup", "combined")
TOOLS = ("python", "calculator", "search")
# The first calls that can lead to the right answer, per kind (finding 1's "right tool first").
ANSWERING: dict[str, tuple[str, ...]] = {"easy": (NO_CALL, "calculator", "python"), "arith": ("calculator", "python"),
                                         "lookup": ("search",), "combined": ("search",)}
N_ITEMS, N_HELDOUT_ITEMS = 256, 64
LOOKUP_PREFIX = "code of "
_CONSONANTS, _VOWELS = "bdfgklmnprstvz", "aeiou"


def item_name(rng: random.Random) -> str:
    """A made-up item name of three consonant-vowel syllables (``kavemi``)."""
    return "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(3))


def _table(rng: random.Random, n: int, taken: set[str]) -> dict[str, int]:
    table: dict[str, int] = {}
    while len(table) < n:
        name = item_name(rng)
        if name not in taken and name not in table:
            table[name] = rng.randint(100, 999)
    return table


def fact_table(seed: int = 0) -> dict[str, int]:
    """The world's items and their 3-digit codes, in a fixed order (the search corpus; the last
    ``N_HELDOUT_ITEMS`` are held out)."""
    return _table(random.Random(f"tools-facts-{seed}"), N_ITEMS, set())


def corpus_items(seed: int = 0, n: int = 512) -> dict[str, int]:
    """Items of the pretraining corpus only: none of them is in the fact table of ``seed`` 0."""
    return _table(random.Random(f"tools-corpus-items-{seed}"), n, set(fact_table()))


def train_items(seed: int = 0) -> list[str]:
    return list(fact_table(seed))[: N_ITEMS - N_HELDOUT_ITEMS]


def heldout_items(seed: int = 0) -> list[str]:
    return list(fact_table(seed))[N_ITEMS - N_HELDOUT_ITEMS:]


def _n(rng: random.Random, digits: int) -> int:
    return rng.randint(10 ** (digits - 1) if digits > 1 else 1, 10**digits - 1)


def solve(problem: str, table: dict[str, int]) -> str:
    """The answer to a question of this world, the codes read from ``table``."""
    if problem.startswith(LOOKUP_PREFIX):
        name, _, factor = problem.removeprefix(LOOKUP_PREFIX).partition(" * ")
        if name not in table:
            raise ValueError(f"problem {problem!r}: no item {name!r} in the fact table")
        return str(table[name] * int(factor)) if factor else str(table[name])
    a, op, b = problem.split(" ")
    return str(int(a) + int(b) if op == "+" else int(a) * int(b))


def make_question(rng: random.Random, kind: str, table: dict[str, int], items: list[str]) -> Question:
    """One question of ``kind``; lookups and combined questions ask one of ``items`` (names in ``table``)."""
    if kind == "easy":
        problem = f"{_n(rng, 1)} + {_n(rng, 1)}"
    elif kind == "arith":
        problem = f"{_n(rng, 3)} * {_n(rng, 2)}"
    elif kind == "lookup":
        problem = LOOKUP_PREFIX + rng.choice(items)
    elif kind == "combined":
        problem = f"{LOOKUP_PREFIX}{rng.choice(items)} * {_n(rng, 2)}"
    else:
        raise ValueError(f"kind {kind!r}: the tools world's kinds are {list(KINDS)}")
    return Question(kind, problem, solve(problem, table))


def heldout_set(kind: str, n: int = 64, seed: int = 1234) -> list[Question]:
    """``n`` distinct held-out questions of ``kind`` (lookups at most ``N_HELDOUT_ITEMS``): the held-out items'
    lookups and combined questions, products the training stream never asks, easy sums (memorised facts)."""
    table = fact_table()
    if kind == "lookup":
        n = min(n, N_HELDOUT_ITEMS)
    rng = random.Random(f"tools-heldout-{kind}-{seed}")
    return distinct_questions(n, lambda: make_question(rng, kind, table, heldout_items()))


def excluded(n: int = 64, seed: int = 1234) -> set[str]:
    """The held-out products: the training stream and the corpus never ask them (the held-out items are out of
    both by construction)."""
    return {q.problem for q in heldout_set("arith", n, seed)}


def train_stream(seed: int = 0, n_heldout: int = 64, heldout_seed: int = 1234,
                 weights: dict[str, float] | None = None) -> Iterator[Question]:
    """An endless seeded stream of training questions, kinds drawn by ``weights`` (default: equal)."""
    weights = weights or {k: 1.0 for k in KINDS}
    unknown = sorted(set(weights) - set(KINDS))
    if unknown:
        raise ValueError(f"weights: unknown kinds {unknown}; the tools world's kinds are {list(KINDS)}")
    rng, table, items = random.Random(f"tools-train-{seed}"), fact_table(), train_items()
    blocked = excluded(n_heldout, heldout_seed)
    kinds, w = list(weights), list(weights.values())
    while True:
        q = make_question(rng, rng.choices(kinds, w)[0], table, items)
        if q.problem not in blocked:
            yield q


def write_facts(path: Path, table: dict[str, int]) -> Path:
    """The search corpus: one passage per item, ``{"title": name, "text": "code N"}`` (read back as
    ``"name: code N"``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"title": k, "text": f"code {v}"}) + "\n" for k, v in table.items()))
    return path


def write_task_files(out_dir: str | Path, n_train: int = 4096, n_heldout: int = 64, seed: int = 0,
                     heldout_seed: int = 1234) -> dict[str, Path]:
    """Write ``facts.jsonl`` (the search corpus), ``train.jsonl`` (the four kinds in equal shares; easy sums and
    lookups repeat, being few) and ``heldout_<kind>.jsonl`` per kind into ``out_dir``; returns the paths by name."""
    out = Path(out_dir)
    paths = {"facts": write_facts(out / "facts.jsonl", fact_table())}
    stream = train_stream(seed, n_heldout, heldout_seed)
    paths["train"] = write_jsonl([next(stream) for _ in range(n_train)], out / "train.jsonl", "tools-train")
    return paths | write_heldout(out, KINDS, lambda kind: heldout_set(kind, n_heldout, heldout_seed), "tools")


if __name__ == "__main__":
    import argparse

    cli = argparse.ArgumentParser(description="write the tools world's task files and search corpus")
    cli.add_argument("out", nargs="?", default="data/toy_tools")
    for name, written in write_task_files(cli.parse_args().out).items():
        print(name, written)
