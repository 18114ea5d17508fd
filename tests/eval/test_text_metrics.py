"""Repetition measures: hand-counted substrings, and a brute-force reference on random strings."""

from __future__ import annotations

import random

import pytest
import torch

from zerotir.eval.text_metrics import ngram_repetition, repeat_score


def brute_force_repeat(text: str) -> float:
    """1 - distinct substrings / substring occurrences, by listing every substring."""
    n = len(text)
    if n <= 1:
        return 0.0
    distinct = {text[i:j] for i in range(n) for j in range(i + 1, n + 1)}
    return 1.0 - len(distinct) / (n * (n + 1) / 2)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", 0.0),
        ("a", 0.0),
        ("abc", 0.0),  # 6 occurrences, all distinct
        ("aaa", 0.5),  # 6 occurrences; distinct: a, aa, aaa -> 1 - 3/6
        ("aaaa", 0.6),  # 10 occurrences; distinct: a, aa, aaa, aaaa -> 1 - 4/10
        ("abab", 0.3),  # 10 occurrences; distinct: a, b, ab, ba, aba, bab, abab -> 1 - 7/10
        ("ééé", 0.5),  # characters, not bytes: same as "aaa"
    ],
)
def test_repeat_score_hand_counted(text, expected):
    assert repeat_score(text) == pytest.approx(expected)


def test_repeat_score_matches_brute_force():
    rng = random.Random(0)
    for _ in range(300):
        text = "".join(rng.choice("ab c\né") for _ in range(rng.randint(0, 40)))
        assert repeat_score(text) == pytest.approx(brute_force_repeat(text), abs=1e-12), text


def test_repeat_score_orders_texts_by_repetition():
    looping = "Let x = 2. " * 40
    varied = "".join(chr(ord("a") + (i * 7) % 26) + str(i) for i in range(200))
    assert repeat_score(looping) > 0.95
    assert repeat_score(varied) < 0.05


def test_repeat_score_ngram_form():
    # bigrams of "abab": ab, ba, ab -> 3 occurrences, 2 distinct -> 1 - 2/3
    assert repeat_score("abab", 2) == pytest.approx(1 / 3)
    assert repeat_score("abab", 5) == 0.0  # no 5-gram at all
    assert repeat_score("abcd", 1) == 0.0
    with pytest.raises(ValueError, match="n-gram length"):
        repeat_score("abab", 0)
    with pytest.raises(TypeError, match="str"):
        repeat_score([1, 2])  # type: ignore[arg-type]


def test_ngram_repetition_on_token_ids():
    # bigrams (1,2), (2,1), (1,2), (2,1): 4 occurrences, 2 distinct -> 0.5
    assert ngram_repetition([1, 2, 1, 2, 1], 2) == pytest.approx(0.5)
    assert ngram_repetition(torch.tensor([1, 2, 1, 2, 1]), 2) == pytest.approx(0.5)
    # trigrams (1,2,1), (2,1,2), (1,2,1): 1 - 2/3
    assert ngram_repetition([1, 2, 1, 2, 1], 3) == pytest.approx(1 / 3)
    assert ngram_repetition([5, 6, 7], 1) == 0.0
    assert ngram_repetition([5], 2) == 0.0
    with pytest.raises(ValueError, match="1-D"):
        ngram_repetition(torch.zeros(2, 2, dtype=torch.long), 2)
