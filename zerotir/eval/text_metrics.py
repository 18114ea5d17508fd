"""Repetition measures of generated text, for the scaling metrics (the paper's "avg repeat score").

Both measures share one definition: the share of substring occurrences that repeat a substring seen elsewhere,

    repetition = 1 - (number of distinct substrings) / (number of substring occurrences),

so 0 means no substring occurs twice and values near 1 mean the text is one unit repeated over and over.

* ``repeat_score(text)`` counts every character substring of every length. This is the ZeroTIR code's
  ``repeatness``: the sum of the LCP array over the suffix array, times 2 / (n (n + 1)), since
  sum(LCP) = n (n + 1) / 2 - (distinct substrings). ``repeat_score(text, n)`` restricts the count to
  character n-grams.
* ``ngram_repetition(token_ids, n)`` applies the same measure to token n-grams.

Examples: "abc" -> 0; "aaaa" has 10 substring occurrences and 4 distinct ones (a, aa, aaa, aaaa) -> 0.6.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def _doubling_ranks(codes: np.ndarray) -> list[np.ndarray]:
    """Prefix-doubling ranks: ``levels[k][i]`` ranks the substring ``codes[i : i + 2**k]`` (cut at the end).

    Equal ranks on one level mean equal substrings; a substring cut by the end of the text has a rank of its own.
    Stops at the first level L where all ranks differ (at the latest when 2**L >= n, as cut substrings all differ in
    length), so two suffixes share a prefix shorter than 2**L, which levels 0..L can build up by binary lifting.
    """
    n = len(codes)
    rank = np.unique(codes, return_inverse=True)[1].astype(np.int64)
    levels = [rank]
    k = 1
    while rank.max() < n - 1:
        second = np.full(n, -1, dtype=np.int64)
        second[: n - k] = rank[k:]
        # Rank pairs (rank of the first half, rank of the second half or -1 past the end), both < n + 1.
        rank = np.unique(rank * (n + 1) + (second + 1), return_inverse=True)[1].astype(np.int64)
        levels.append(rank)
        k *= 2
    return levels


def _lcp_sum(codes: np.ndarray) -> int:
    """Sum of the longest common prefixes of suffixes adjacent in sorted order (vectorised, O(n log n))."""
    n = len(codes)
    levels = _doubling_ranks(codes)
    order = np.argsort(levels[-1], kind="stable")  # the suffix array
    left, right = order[:-1], order[1:]
    lcp = np.zeros(n - 1, dtype=np.int64)
    for level in range(len(levels) - 1, -1, -1):
        step = 1 << level
        # Extend the common prefix by 2**level where the next blocks of both suffixes exist and are equal.
        fits = (left + lcp + step <= n) & (right + lcp + step <= n)
        a = np.minimum(left + lcp, n - 1)
        b = np.minimum(right + lcp, n - 1)
        lcp += np.where(fits & (levels[level][a] == levels[level][b]), step, 0)
    return int(lcp.sum())


def _ngram_repetition(items: Sequence, n: int) -> float:
    total = len(items) - n + 1
    if total <= 0:
        return 0.0
    distinct = len({tuple(items[i : i + n]) for i in range(total)})
    return 1.0 - distinct / total


def _check_n(n: int) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n (the n-gram length) must be a positive int, got {n!r}")


def repeat_score(text: str, n: int | None = None) -> float:
    """Share of character substring occurrences that repeat another occurrence, in [0, 1).

    Args:
        text: the response text.
        n: ``None`` (default) counts substrings of every length, as the paper's code does; an int counts only
            character n-grams of that length.

    Returns:
        1 - distinct / occurrences; 0.0 for a text too short to repeat anything (fewer than 2 characters, or fewer
        than n + 1 for the n-gram form).
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if n is not None:
        _check_n(n)
        return _ngram_repetition(text, n)
    length = len(text)
    if length <= 1:
        return 0.0
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    return 2.0 * _lcp_sum(codes) / (length * (length + 1))


def ngram_repetition(token_ids: Sequence[int] | torch.Tensor, n: int) -> float:
    """Share of token n-gram occurrences that repeat an earlier one: 1 - distinct / total, in [0, 1).

    Args:
        token_ids: a 1-D sequence or tensor of token ids (select the response tokens before calling).
        n: n-gram length.

    Returns:
        0.0 when there are fewer than n tokens.
    """
    _check_n(n)
    if isinstance(token_ids, torch.Tensor):
        if token_ids.dim() != 1:
            raise ValueError(f"token_ids must be 1-D, got shape {tuple(token_ids.shape)}")
        token_ids = token_ids.tolist()
    return _ngram_repetition(list(token_ids), n)
