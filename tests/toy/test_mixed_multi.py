"""The ``mixed`` world's multi-step questions (``digitsum(a * b)``): one call that copies the question fails, the
world's two calls solve it, the corpus writes those calls (and their bugs) from what the code really prints, a world
without them draws exactly as before, and the design's headroom and two-call bands."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from zerotir.toy.corpus import run_snippet
from zerotir.toy.mixed import corpus as mc
from zerotir.toy.mixed import tasks as mt
from zerotir.toy.mixed.design import check_design
from zerotir.toy.pretrain import PretrainSettings

REPO = Path(__file__).resolve().parents[2]


def test_a_multi_step_question_needs_two_calls():
    q = mt.make_question(random.Random(0), "multi")
    assert q.kind == "dsum_3x3" and mt.kind_group(q.kind) == "multi"
    expr = q.problem.removeprefix("digitsum(").removesuffix(")")
    product = run_snippet(f"print({expr})").strip()
    assert q.answer == str(sum(int(d) for d in product)) == mt.solve(q.problem)
    with pytest.raises(NameError, match="digitsum"):
        run_snippet(f"print({q.problem})")  # copying the question into one call fails
    calls, answer = mc.digit_calls(expr)
    assert answer == q.answer and calls.count("```python") == 2 and f"\n{product}\n" in calls


def test_the_corpus_answers_multi_step_questions_in_two_calls_and_their_bugs_fail_honestly():
    rng = random.Random(4)
    s = mc.MixedCorpusSettings(mixed_share=1.0, code_share=0.0, worked_share=0.0, easy_share=0.0, multi_share=1.0,
                               code_bugs=0.5)
    texts = [mc.document(rng, s)[1] for _ in range(300)]
    right = [t for t in texts if _boxed(t) == mt.solve(_question(t))]
    # a right answer took the two calls, or answered in text after its one call failed (web text is mostly right)
    assert all(t.count("```python") >= 2 or t.count("```python") == 1 and "Error" in t for t in right)
    one_call = [t for t in texts if "print(digitsum(" in t]
    assert one_call and all("NameError: name 'digitsum' is not defined" in t for t in one_call)
    assert 0.3 < len(right) / len(texts) < 0.9  # half the calls are buggy; some bugs are followed by the fix


def test_the_committed_task_files_are_the_generator_s_and_without_multi_step_questions_nothing_changed(tmp_path):
    paths = mt.write_task_files(tmp_path)  # the defaults of the committed data/toy_mixed
    assert sorted(paths) == ["easy", "hard", "train"]
    for name, path in paths.items():
        assert path.read_text() == (REPO / "data" / "toy_mixed" / path.name).read_text(), name
    shipped = mt.write_task_files(tmp_path / "toy_multi", easy_share=0.4, multi_share=0.25)  # data/toy_multi
    for name, path in shipped.items():
        assert path.read_text() == (REPO / "data" / "toy_multi" / path.name).read_text(), name
    multi = mt.write_task_files(tmp_path / "multi", n_train=400, n_heldout=32, multi_share=0.25)
    train = [json.loads(line) for line in multi["train"].read_text().splitlines()]
    share = sum(r["problem"].startswith("digitsum(") for r in train) / len(train)
    assert 0.18 < share < 0.32
    held = {json.loads(line)["problem"] for line in multi["multi"].read_text().splitlines()}
    assert len(held) == 32 and not held & {r["problem"] for r in train}


def test_shares_that_cannot_be_drawn_are_refused():
    with pytest.raises(ValueError, match="must be at most 1"):
        mc.MixedCorpusSettings(easy_share=0.8, multi_share=0.3)
    with pytest.raises(ValueError, match="has no multi kind"):
        mc.MixedCorpusSettings(kinds=("add_1d", "mul_3x3"), multi_share=0.2)
    with pytest.raises(ValueError, match="only the 'mixed' world"):
        PretrainSettings(multi_share=0.2)


def test_the_design_wants_headroom_and_some_second_calls_on_multi_step_questions():
    def rates(text_acc, with_code, code_acc, accuracy=0.0, multi=0.0, n=64):
        return {"n_answers": n, "accuracy_no_code": text_acc, "answers_with_code": with_code,
                "code_run_accuracy": code_acc, "accuracy": accuracy, "multi_call_rate": multi}

    good = {"easy": rates(0.55, 8, 0.5), "hard": rates(0.0, 8, 0.25), "multi": rates(0.0, 8, 0.25, 0.1, 0.1)}
    assert check_design(good) == []
    assert check_design({**good, "multi": rates(0.0, 8, 0.25, 0.7, 0.1)}) == [
        "multi-step accuracy 0.7 above 0.5: no room"]
    assert check_design({**good, "multi": rates(0.0, 8, 0.25, 0.1, 0.0)}) == [
        "two calls or more in 0.0 of multi-step answers, outside [0.02, 0.8]"]


def _question(text: str) -> str:
    return text.split("Q: ", 1)[1].split(" = ?", 1)[0]


def _boxed(text: str) -> str:
    return text.rsplit("\\boxed{", 1)[1].split("}", 1)[0]


def test_the_long_split_is_held_out_only_and_longer():
    rng = random.Random(5)
    assert {mt.draw_group(rng, 0.3, 0.4) for _ in range(500)} == {"easy", "multi", "hard"}  # never "long"
    long = [json.loads(line) for line in (REPO / "data" / "toy_multi" / "heldout_long.jsonl").read_text().splitlines()]
    train = {json.loads(line)["problem"] for line in (REPO / "data" / "toy_multi" / "train.jsonl").read_text()
             .splitlines()}
    assert len(long) == 128 and not {q["problem"] for q in long} & train
    for q in long:
        factor = q["problem"].removeprefix("digitsum(").split(" * ")[0]
        assert len(factor) == 4 and q["answer"] == mt.solve(q["problem"])
