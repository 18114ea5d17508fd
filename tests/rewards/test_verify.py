"""Reward: boxed extraction, math-verify equivalence, the 0/1 score, and batch scoring in worker processes."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from zerotir.rewards.verify import (
    RewardScorer, _verify_here, count_boxed, extract_boxed, is_equivalent, quick_verdict, score, score_batch,
)
from zerotir.rollout.sync import run_sync

# (response, truth, expected reward) for untruncated responses.
SCORE_TABLE = [
    # LaTeX forms of one value
    (r"so \boxed{\frac{1}{2}}", "0.5", 1.0),
    (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),
    (r"\boxed{\dfrac12}", r"\frac{1}{2}", 1.0),
    (r"\boxed{18.00}", "18", 1.0),
    (r"\boxed{1{,}000}", "1000", 1.0),
    (r"\boxed{2^{10}}", "1024", 1.0),
    (r"\boxed{x = 3}", "3", 1.0),
    (r"\boxed{\frac{1}{3}}", "0.5", 0.0),
    # units and degrees
    (r"\boxed{5\text{ cm}}", "5", 1.0),
    (r"\boxed{30^\circ}", "30", 1.0),
    (r"\boxed{30^{\circ}}", r"30^\circ", 1.0),
    (r"\boxed{\$18}", "18", 1.0),
    (r"\boxed{6\text{ cm}}", "5", 0.0),
    # nested braces
    (r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt3}{2}", 1.0),
    (r"\boxed{\left( 3, \frac{\pi}{2} \right)}", r"\left( 3, \frac{\pi}{2} \right)", 1.0),
    (r"\boxed{(3, \pi/2)}", r"\left( 3, \frac{\pi}{2} \right)", 1.0),
    # multiple boxes: the last one wins
    (r"first \boxed{3}, on reflection \boxed{4}", "4", 1.0),
    (r"first \boxed{3}, on reflection \boxed{4}", "3", 0.0),
    # sets, tuples, intervals
    (r"\boxed{\{1, 2\}}", r"\{2, 1\}", 1.0),
    (r"\boxed{(2, 1)}", "(1, 2)", 0.0),
    (r"\boxed{[1, 2)}", "[1,2)", 1.0),
    (r"\boxed{[1, 2]}", "[1,2)", 0.0),
    # negative numbers
    (r"\boxed{-3}", "-3", 1.0),
    (r"\boxed{-3}", "3", 0.0),
    (r"\boxed{3}", "-3", 0.0),
    # other box forms and choices
    (r"the answer is $\boxed 7$.", "7", 1.0),
    (r"\fbox{12}", "12", 1.0),
    (r"\boxed{\text{(B)}}", "B", 1.0),
    # garbage and missing answers
    ("no boxed answer, the answer is 5", "5", 0.0),
    (r"\boxed{}", "5", 0.0),
    (r"\boxed{12", "12", 0.0),
    (r"\boxed{qwerty}", "5", 0.0),
    (r"\boxed{\frac{}{}}", "1", 0.0),
]


@pytest.mark.parametrize(("text", "expected"), [
    (r"\boxed{42}", "42"),
    (r"a \boxed{1} b \boxed{\frac{a}{b}} c", r"\frac{a}{b}"),
    (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),  # escaped braces do not close the box
    (r"\boxed{ x^{2} + \sqrt{\frac{1}{2}} }", r"x^{2} + \sqrt{\frac{1}{2}}"),
    (r"$\boxed 5$", "5"),
    (r"\boxed {9}", "9"),
    (r"\fbox{x}", "x"),
    (r"\boxed{}", ""),
    (r"\boxed{1} then \boxed{2", None),  # the last box is unclosed: no answer, not the earlier one
    (r"\boxedanswer{3}", None),  # another macro
    (r"\boxed5", None),
    ("plain text", None),
])
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


def test_count_boxed() -> None:
    assert count_boxed(r"\boxed{1} \fbox{2} \boxed 3 \boxedx") == 3


@pytest.mark.parametrize(("response", "truth", "expected"), SCORE_TABLE)
def test_score_table(response: str, truth: str, expected: float) -> None:
    assert score(response, truth, truncated=False) == expected


def test_truncated_scores_zero() -> None:
    assert score(r"\boxed{5}", "5", truncated=True) == 0.0
    assert score(r"\boxed{5}", "5", truncated=False) == 1.0


def test_require_single_boxed_option() -> None:
    twice = r"\boxed{3} and again \boxed{3}"
    assert score(twice, "3", truncated=False) == 1.0  # off by default
    assert score(twice, "3", truncated=False, require_single_boxed=True) == 0.0
    assert score(r"\boxed{3}", "3", truncated=False, require_single_boxed=True) == 1.0


def test_is_equivalent_forms() -> None:
    assert is_equivalent(r"\frac{1}{2}", "0.5")
    assert is_equivalent("0.5", r"\dfrac12")
    assert not is_equivalent("0.5", "0.6")
    assert not is_equivalent("", "0")
    with pytest.raises(ValueError, match="timeout_s"):
        is_equivalent("1", "2", timeout_s=0)


def test_slow_parse_is_bounded_in_main_thread() -> None:
    # A tower of powers makes sympy grind; math-verify's own (signal) timeout stops it and the answer is wrong.
    assert not is_equivalent(r"10^{10^{9}}+1", "5", timeout_s=1)


def test_is_equivalent_off_the_main_thread() -> None:
    # math-verify's signal timeouts cannot work here; the check goes to the worker pool instead of raising.
    results: list[bool] = []
    worker = threading.Thread(target=lambda: results.extend([is_equivalent(r"\dfrac12", "0.5"),
                                                             is_equivalent("0.4", "0.5")]))
    worker.start()
    worker.join(timeout=60)
    assert results == [True, False]


@pytest.fixture(scope="module")
def scorer():
    with RewardScorer(max_workers=2, timeout_s=2) as s:
        yield s


INTEGER_PAIRS = [("182590", "138570"), ("007", "7"), ("+5", "5"), ("-3", "3"), ("0", "-0"), ("1000000", "1000001"),
                 ("12345678901234567890", "12345678901234567891"), (" 42 ", "42"), ("42", "42")]


@pytest.mark.parametrize("pred, truth", INTEGER_PAIRS)
def test_plain_integers_get_math_verifys_verdict_without_a_parse(pred: str, truth: str) -> None:
    assert quick_verdict(pred, truth) is _verify_here(pred, truth, 5.0)


@pytest.mark.parametrize("pred, truth", [("5", "5.0"), ("1,000", "1000"), ("2^{10}", "1024"), ("x=3", "3"),
                                         ("\u0665", "5"), ("5", "\\frac{10}{2}")])
def test_anything_but_two_plain_integers_goes_to_math_verify(pred: str, truth: str) -> None:
    assert quick_verdict(pred, truth) is None


def test_integer_answers_are_scored_without_the_worker_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    scorer = RewardScorer(max_workers=1)
    monkeypatch.setattr(scorer, "_submit", lambda *a: pytest.fail(f"sent to the worker pool: {a}"))
    responses = [r"so \boxed{182590}", r"\boxed{007}", r"\boxed{-3}", r"\boxed{ 42 }"]
    assert asyncio.run(scorer.score_batch(responses, ["138570", "7", "3", "42"], [False] * 4)) == [0.0, 1.0, 0.0, 1.0]


def test_score_batch_matches_table(scorer: RewardScorer) -> None:
    responses, truths, expected = zip(*SCORE_TABLE)
    truncated = [False] * len(responses)
    got = run_sync(scorer.score_batch(list(responses), list(truths), truncated))
    assert got == list(expected)
    assert scorer.num_killed == 0


def test_score_batch_truncation_and_lengths(scorer: RewardScorer) -> None:
    got = run_sync(scorer.score_batch([r"\boxed{\frac12}", r"\boxed{\frac12}"], ["0.5", "0.5"], [True, False]))
    assert got == [0.0, 1.0]
    with pytest.raises(ValueError, match="same length"):
        run_sync(scorer.score_batch(["a"], ["b", "c"], [False]))


def test_score_batch_does_not_block_the_event_loop(scorer: RewardScorer) -> None:
    async def run() -> tuple[list[float], int]:
        ticks = 0
        done = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        tick_task = asyncio.create_task(ticker())
        scores = await scorer.score_batch([r"\boxed{10^{10^{9}}+1}", r"\boxed{0.25}"], ["5", r"\frac14"],
                                          [False, False])
        done.set()
        await tick_task
        return scores, ticks

    scores, ticks = asyncio.run(run())
    assert scores == [0.0, 1.0]
    assert scorer.num_killed == 0  # math-verify's own timeout stopped it inside the worker, no kill needed
    # The slow verification takes about timeout_s (2 s); the loop kept running meanwhile.
    assert ticks >= 20


def test_hard_timeout_kills_the_worker() -> None:
    # hard_timeout_s below math-verify's own timeout: the pool must kill the stuck worker, score 0, and carry on.
    with RewardScorer(max_workers=1, timeout_s=10, hard_timeout_s=1.0) as s:
        got = run_sync(s.score_batch([r"\boxed{10^{10^{9}}+1}", r"\boxed{1/2}"], ["5", "0.5"], [False, False]))
        assert got == [0.0, 1.0]
        assert s.num_killed == 1
        assert run_sync(s.score_batch([r"\boxed{\frac{2}{4}}"], ["0.5"], [False])) == [1.0]  # the replaced worker works


def test_module_level_score_batch() -> None:
    got = asyncio.run(score_batch([r"\boxed{\dfrac{3}{4}}", "none"], ["0.75", "1"], [False, False], max_workers=1))
    assert got == [1.0, 0.0]


def test_require_single_boxed_holds_on_the_batch_paths(scorer: RewardScorer) -> None:
    # Two boxes holding the right answer: 1.0 by default, 0 with the option, on the module-level batch functions and
    # on a scorer object built with it (the quick exact match must not bypass the rule).
    twice, once = r"\boxed{3} and again \boxed{3}", r"\boxed{\frac{6}{2}}"
    truths, cut = ["3", "3"], [False, False]
    assert run_sync(scorer.score_batch([twice, once], truths, cut)) == [1.0, 1.0]  # off by default
    assert run_sync(score_batch([twice, once], truths, cut, max_workers=1, require_single_boxed=True)) == [0.0, 1.0]
    got = asyncio.run(score_batch([twice, once], truths, cut, max_workers=1, require_single_boxed=True))
    assert got == [0.0, 1.0]
    with RewardScorer(max_workers=1, timeout_s=2, require_single_boxed=True) as single:
        assert run_sync(single.score_batch([twice, once], truths, cut)) == [0.0, 1.0]


def test_an_unguarded_script_gets_the_main_guard_named_not_a_broken_pool(tmp_path) -> None:
    """A script whose top level scores without ``if __name__ == "__main__":``: the spawned workers re-run it and die
    at start; the error names the guard instead of pebble's "All workers expired"."""
    import subprocess
    import sys

    script = tmp_path / "unguarded.py"
    script.write_text("from zerotir.rewards.verify import RewardScorer\n"
                      "from zerotir.rollout.sync import run_sync\n"
                      "print(run_sync(RewardScorer(max_workers=1).score_batch(['\\\\boxed{0.5}'], ['1/2'], [False])))\n")
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(repo)})
    assert done.returncode != 0
    assert 'if __name__ == "__main__":' in done.stderr.splitlines()[-1]
