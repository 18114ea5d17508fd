"""Tests of the toy arithmetic task: answers, held-out set, training stream, JSONL files."""

import json
import random

import pytest

from zerotir.toy.tasks import (
    EASY_KINDS,
    HARD_KINDS,
    Question,
    evaluate,
    heldout_set,
    make_question,
    read_jsonl,
    resolve_kinds,
    train_stream,
    write_jsonl,
    write_task_files,
)


def test_evaluate_hand_worked():
    assert evaluate("482 * 917") == "441994"  # 482 * 900 = 433800, 482 * 17 = 8194
    assert evaluate("1234 + 5678 + 9012") == "15924"
    assert evaluate("47 * 382 + 1234") == "19188"  # 47 * 382 = 17954; precedence as in Python
    assert evaluate("97 - 74") == "23"


@pytest.mark.parametrize("bad", ["__import__('os')", "2 ** 8", "", "3 / 4"])
def test_evaluate_rejects_non_arithmetic(bad):
    with pytest.raises(ValueError, match="problem"):
        evaluate(bad)


def test_resolve_kinds():
    assert resolve_kinds("hard") == list(HARD_KINDS)
    assert resolve_kinds("easy") == list(EASY_KINDS)
    assert resolve_kinds("mul_3x3,add_1d") == ["mul_3x3", "add_1d"]
    with pytest.raises(ValueError, match="kinds"):
        resolve_kinds("mul_9x9")


def test_question_shapes():
    rng = random.Random(0)
    for _ in range(200):
        q = make_question(rng, "mul_3x3")
        a, b = q.problem.split(" * ")
        assert len(a) == len(b) == 3 and q.answer == str(int(a) * int(b))
        assert 10_000 <= int(q.answer) < 1_000_000  # 100*100 .. 999*999: 5 or 6 digits, never in the model's head
    for _ in range(200):
        q = make_question(rng, "sub_2d")
        assert int(q.answer) >= 0  # answers never negative


def test_heldout_is_fixed_distinct_and_hard():
    a, b = heldout_set(64, seed=7), heldout_set(64, seed=7)
    assert a == b
    assert len({q.problem for q in a}) == 64
    assert {q.kind for q in a} <= set(HARD_KINDS)
    assert heldout_set(64, seed=8) != a


def test_train_stream_skips_excluded():
    # add_1d has 9 * 9 = 81 questions; excluding all but one leaves exactly that one in the stream.
    every = {f"{a} + {b}" for a in range(1, 10) for b in range(1, 10)}
    keep = "3 + 4"
    stream = train_stream(seed=0, kinds="add_1d", exclude=every - {keep})
    assert {next(stream).problem for _ in range(50)} == {keep}


def test_task_files_disjoint_and_readable(tmp_path):
    train_path, held_path = write_task_files(tmp_path, n_train=300, n_heldout=50)
    train, held = read_jsonl(train_path), read_jsonl(held_path)
    assert len(train) == 300 and len(held) == 50
    assert not {q.problem for q in train} & {q.problem for q in held}
    assert len({q.problem for q in train}) == 300
    row = json.loads(train_path.read_text().splitlines()[0])
    assert set(row) >= {"id", "problem", "answer"} and row["id"] == "toy-train-0"


def test_task_files_load_with_the_data_module(tmp_path):
    from zerotir.data.datamodule import load_rows

    _, held_path = write_task_files(tmp_path, n_train=10, n_heldout=5)
    rows = load_rows(str(held_path))
    assert [r["answer"] for r in rows] == [q.answer for q in heldout_set(5)]


def test_read_jsonl_names_the_bad_line(tmp_path):
    path = write_jsonl([Question("add_1d", "2 + 2", "4"), Question("add_1d", "2 + 3", "6")], tmp_path / "x.jsonl", "x")
    with pytest.raises(ValueError, match=r"x.jsonl:2"):
        read_jsonl(path)


def test_bundled_toy_files_match_the_generator(tmp_path):
    """data/toy/ holds the files ``write_task_files`` writes with its defaults (regenerate them if this fails)."""
    from pathlib import Path

    bundled = Path(__file__).resolve().parents[2] / "data" / "toy"
    fresh_train, fresh_held = write_task_files(tmp_path)
    assert (bundled / "train.jsonl").read_text() == fresh_train.read_text()
    assert (bundled / "heldout.jsonl").read_text() == fresh_held.read_text()
