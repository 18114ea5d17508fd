"""The tool-choice world (``tools``): its questions and splits, its corpus's uninformed calls and their real
observations, and the design check on hand-made statistics."""

import json
import random
import re
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from zerotir.tools.formats import Hermes
from zerotir.toy.choice import corpus as cc
from zerotir.toy.choice import tasks as ct
from zerotir.toy.choice.design import Design, check_design, chance, first_tool, kind_stats
from zerotir.toy.pretrain import Batches, PretrainSettings, ensure_toy_base, read_info
from zerotir.toy.tokenizer import build_byte_tokenizer


def test_questions_answers_and_splits(tmp_path):
    table = ct.fact_table()
    assert len(table) == ct.N_ITEMS and not set(table) & set(ct.corpus_items())  # no fact in the pretraining text
    rng = random.Random(0)
    for kind in ct.KINDS:
        q = ct.make_question(rng, kind, table, ct.train_items())
        assert q.kind == kind and q.answer == ct.solve(q.problem, table)
    name = ct.train_items()[0]
    assert ct.solve(f"code of {name} * 12", table) == str(table[name] * 12)
    paths = ct.write_task_files(tmp_path, n_train=400, n_heldout=32)
    train = [json.loads(line) for line in paths["train"].read_text().splitlines()]
    assert {r["kind"] for r in train} == set(ct.KINDS)
    held_items = set(ct.heldout_items())
    asked = {r["problem"].removeprefix("code of ").split(" * ")[0] for r in train if r["kind"] in ("lookup", "combined")}
    assert asked and not asked & held_items  # held-out items are never asked in training
    held = {kind: [json.loads(line) for line in paths[kind].read_text().splitlines()] for kind in ct.KINDS}
    assert all(r["problem"].removeprefix("code of ").split(" * ")[0] in held_items for r in held["combined"])
    assert not {r["problem"] for r in held["arith"]} & {r["problem"] for r in train}
    facts = [json.loads(line) for line in paths["facts"].read_text().splitlines()]
    assert {f["title"]: int(f["text"].split()[1]) for f in facts} == table
    with pytest.raises(ValueError, match="kinds are"):
        ct.make_question(rng, "proof", table, ct.train_items())


def _calls(text: str) -> list[dict]:
    fmt = Hermes()
    return [json.loads(part.split(fmt.call_end)[0]) for part in text.split(fmt.call_start)[1:]]


def test_corpus_calls_are_uninformed_and_observed_for_real():
    rng = random.Random(1)
    docs = [cc.document(rng, cc.ChoiceCorpusSettings(call_share=1.0))[1] for _ in range(600)]
    firsts = Counter()
    for text in docs:
        kind = "lookup" if "code of" in text and " * " not in text.split("Q: ")[1].split(" = ?")[0] else None
        calls = _calls(text)
        assert calls and Hermes().parse(json.dumps(calls[0])).error is None
        if kind:
            firsts[calls[0]["name"]] += 1
    # A lookup's first call is any of the three tools, about a third each (the choice ignores the question).
    assert set(firsts) == set(ct.TOOLS) and min(firsts.values()) > 0.2 * sum(firsts.values())
    items = ct.corpus_items()
    name = next(iter(items))
    assert cc.observation("search", f"code of {name}", items) == f"[1] {name}: code {items[name]}"
    assert cc.observation("calculator", "482 * 47", items) == "22654"
    assert cc.observation("python", "print(482 * 47)", items) == "22654"
    assert cc.observation("calculator", f"code of {name}", items).startswith("Error: not an arithmetic expression")
    assert "SyntaxError" in cc.observation("python", f"print(code of {name})", items)
    assert cc.observation("search", "3 + 5", items).startswith("No passage matches")


def test_failed_calls_are_followed_by_a_guess_and_good_ones_by_the_value():
    items = ct.corpus_items()
    name = next(iter(items))
    q = ct.make_question(random.Random(2), "lookup", items, [name])
    answers = [cc.call_answer(random.Random(seed), q, items) for seed in range(60)]
    searched = [a for a in answers if _calls(a)[0]["name"] == "search"]
    assert searched and all(a.endswith(f"\\boxed{{{items[name]}}}") for a in searched)
    others = [a for a in answers if _calls(a)[0]["name"] != "search"]
    assert sum(a.endswith(f"\\boxed{{{items[name]}}}") for a in others) < len(others) / 4  # guessed


def test_packed_rows_come_from_the_tools_corpus():
    s = PretrainSettings(world="tools", probe_threshold=0.0, mixed_share=0.5, seq_len=384, heldout_n=16,
                         batch_size=4, eval_n=0)
    packer = Batches(s, build_byte_tokenizer())
    next(iter(packer))
    assert {kind for kind, _ in packer.docs_used} == {"qa", "call"}
    assert not set(ct.fact_table()) & {w for _, t in packer.docs_used for w in t.replace(":", " ").split()}
    assert PretrainSettings(world="tools").probe_threshold > 0  # the world has a copy probe of its own
    with pytest.raises(ValueError, match="call must"):
        PretrainSettings(world="tools", probe_threshold=0.0, mixed_share=0.0)


def test_the_copy_probe_calls_the_tools_that_fit_and_checks_the_copies():
    """A probe document is a call document whose tools fit: its code span is the last call's argument (the question,
    or a combined question's code read off the passage times its factor), its box the answer the tool returned."""
    items, rng, kinds = ct.corpus_items(), random.Random(0), Counter()
    for _ in range(60):
        doc = cc.probe_document(rng)
        name, _, factor = doc.problem.removeprefix("code of ").partition(" * ")
        kind = "arith" if not doc.problem.startswith("code of ") else "combined" if factor else "lookup"
        kinds[kind] += 1
        code, box = doc.text[slice(*doc.code)], doc.text[slice(*doc.box)]
        assert box == ct.solve(doc.problem, items) and doc.text.endswith(f"\\boxed{{{box}}}")
        assert code == (f"{items[name]} * {factor}" if kind == "combined" else doc.problem)
        tools = re.findall(r'"name":"(\w+)"', doc.text)
        assert tools == {"arith": [tools[0]], "lookup": ["search"], "combined": ["search", tools[-1]]}[kind]
        assert tools[-1] in (("search",) if kind == "lookup" else ("python", "calculator"))
    assert set(kinds) == {"arith", "lookup", "combined"}


def test_first_tool_and_kind_stats():
    call = lambda tool: SimpleNamespace(tool=tool, status="ok")  # noqa: E731
    assert first_tool([]) == "none" and first_tool([call("search"), call("python")]) == "search"
    assert first_tool([call("")]) == "invalid"
    stats = kind_stats(["search", "python", "none", "calculator"], [True, False, False, False], "lookup")
    assert stats["right_first"] == round(1 / 3, 4) and stats["call_rate"] == 0.75 and stats["accuracy"] == 0.25
    assert stats["first_none"] == 0.25 and chance("arith") == pytest.approx(2 / 3)


def test_design_check_on_hand_made_statistics():
    def rates(kind, right, calls=0.5, acc=0.0):
        return {"call_rate": calls, "right_first": right, "chance": round(chance(kind), 4), "accuracy": acc}

    good = {"arith": rates("arith", 0.6), "lookup": rates("lookup", 0.3), "combined": rates("combined", 0.4)}
    assert check_design(good) == []
    assert check_design({**good, "lookup": rates("lookup", 0.9)}) == [
        "lookup: right tool first in 0.9 of answers with a call, not within 0.2 of chance 0.3333"]
    assert check_design({**good, "combined": rates("combined", 0.3, acc=0.5)}) == [
        "combined: accuracy 0.5 not below 0.3"]
    assert check_design({**good, "arith": rates("arith", None, calls=0.1)}) == [
        "arith: calls in 0.1 of answers, below 0.2", "arith: no answer's first call named a tool"]
    assert check_design(good, Design(chance_band=0.01)) != []
    with pytest.raises(ValueError, match="lack the kinds"):
        check_design({"arith": good["arith"]})


def test_shipped_task_files_equal_a_fresh_generation(tmp_path):
    """data/toy_tools is ``python -m zerotir.toy.choice.tasks data/toy_tools`` (the defaults)."""
    shipped = Path(__file__).resolve().parents[2] / "data" / "toy_tools"
    for name, path in ct.write_task_files(tmp_path).items():
        assert (shipped / path.name).read_text() == path.read_text(), name


# A base small enough for CI: 0.16M parameters (hidden 64, 2 layers), 200 steps of 8 rows (stopped by the step count,
# one thread: its numbers are the ones measured when the settings were chosen), 90% of documents with a call, so that
# it writes the tools' names right within the budget (a misspelt name counts as invalid and leaves few calls to judge
# the choice by). 80 s of training on the shared 2 cores (load 4-5, beside another run), about 32 s alone (6.3 steps/s
# measured at load 1). Measured 2026-12-04 (64 held-out questions of each kind, temperature 1, the real tool loop):
#   kind      calls  first call: none / python / calculator / search / invalid  right first (chance)  accuracy
#   arith     0.91   0.09 / 0.34 / 0.22 / 0.20 / 0.14                           0.73 (0.67)           0.00
#   lookup    0.89   0.11 / 0.34 / 0.14 / 0.16 / 0.25                           0.24 (0.33)           0.00
#   combined  0.92   0.08 / 0.25 / 0.30 / 0.17 / 0.20                           0.24 (0.33)           0.00
# 64 questions of each kind, not 32: with 32 the right-first rates rest on about 20 calls, and a rate 0.19 from chance
# was seen on a corpus variant.
CI_BASE = dict(world="tools", mixed_share=0.9, probe_threshold=0.0, steps=200, decay_steps=50, batch_size=8,
               seq_len=384, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=256, heldout_n=64, eval_n=64,
               threads=1, minutes=30.0)


@pytest.mark.slow
def test_small_base_meets_the_design(tmp_path):
    """The acceptance: the world's design check passes on a base built in CI (calls made, the tool picked
    at chance, lookups and combined questions rarely right)."""
    path = ensure_toy_base(tmp_path / "base", show_progress=False, **CI_BASE)
    record = read_info(path)["record"]
    assert record["steps_done"] == 200
    stats = record["base_stats"]
    assert set(stats) == {*ct.KINDS, "seconds"}
    assert check_design(stats) == [], stats
