"""The math reward's engine (``MathReward``, ``rewards.math``): the last ``\\boxed{}`` answer of a response, judged
against the reference by math-verify.

+1 for a correct final answer, 0 otherwise, and 0 when the response was truncated or has no boxed answer (the paper's
rule; extra format rules are options, off by default).

Why a process pool: math-verify bounds a slow parse or comparison with ``signal.alarm``, which only works in the main
thread of a process (in any other thread it raises ``ValueError``). ``score_batch`` therefore runs verification in
worker processes (pebble's ``ProcessPool``), where each task runs in the worker's main thread so math-verify's own
timeouts hold; on top of that pebble kills and replaces a worker whose task outlives ``hard_timeout_s`` (a C-level
loop that never returns to the interpreter cannot be stopped by a signal). The event loop only awaits futures, so a slow
parse never stalls rollouts. The coroutines run on the caller's event loop.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import math
import multiprocessing
import os
import re
import threading
from collections.abc import Sequence
from concurrent.futures import TimeoutError as FutureTimeoutError
from concurrent.futures.process import BrokenProcessPool

logger = logging.getLogger(__name__)

# "\boxed" or "\fbox" not followed by another letter (so "\boxedanswer" is a different macro).
_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


def _find_boxes(text: str) -> list[re.Match[str]]:
    return list(_BOX_RE.finditer(text))


def _box_content(text: str, start: int) -> str | None:
    """The argument of a box macro whose name ends at ``start``, or None if it is malformed / unclosed."""
    i = start
    while i < len(text) and text[i] in " \t":
        i += 1
    if i < len(text) and text[i] == "{":
        depth, j = 0, i
        while j < len(text):
            ch = text[j]
            if ch == "\\":  # an escaped character (\{, \}, \\) never opens or closes the argument
                j += 2
                continue
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    return text[i + 1 : j].strip()
            j += 1
        return None  # unbalanced: the response was cut inside the box
    if i == start:  # "\boxed5" is not the macro form; "\boxed 5" is
        return None
    match = re.match(r"[^\s$]+", text[i:])
    return match.group(0) if match else None


def extract_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces matched.

    Nested braces are kept (``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``), escaped braces ``\\{ \\}`` do not count
    for matching, and the brace-less form ``\\boxed 5`` gives ``5``. If the last box is unclosed, the answer is None:
    an earlier box is not taken in its place, since the model's final answer is the broken one.

    Args:
        text: a model response.

    Returns:
        The stripped content (possibly ``""`` for ``\\boxed{}``), or None when there is no well-formed last box.
    """
    boxes = _find_boxes(text)
    if not boxes:
        return None
    return _box_content(text, boxes[-1].end())


def count_boxed(text: str) -> int:
    """Number of box macros (``\\boxed`` / ``\\fbox``) in ``text``."""
    return len(_find_boxes(text))


def _alarm_seconds(timeout_s: float) -> int:
    # signal.alarm has whole-second resolution and 0 would disable the timeout, so round up and keep >= 1.
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    return max(1, math.ceil(timeout_s))


def _verify_here(pred: str, truth: str, timeout_s: float) -> bool:
    """math-verify equivalence in this thread, with math-verify's signal timeouts (main thread only)."""
    from math_verify import parse, verify

    seconds = _alarm_seconds(timeout_s)
    # Both sides are wrapped in \boxed{} so the LaTeX extractor takes the whole expression as the answer.
    gold = parse(f"\\boxed{{{truth}}}", parsing_timeout=seconds)
    guess = parse(f"\\boxed{{{pred}}}", parsing_timeout=seconds)
    if not gold or not guess:
        return False
    return bool(verify(gold, guess, timeout_seconds=seconds))


def _parses_here(pred: str, timeout_s: float) -> bool:
    """Whether math-verify reads ``pred`` as a mathematical answer at all (in a worker's main thread)."""
    from math_verify import parse

    return bool(parse(f"\\boxed{{{pred}}}", parsing_timeout=_alarm_seconds(timeout_s)))


_INTEGER_RE = re.compile(r"[+-]?[0-9]+", re.ASCII)


def quick_verdict(pred: str, truth: str) -> bool | None:
    """The verdict on answers that need no parse, else None (math-verify decides): identical up to whitespace
    (equal), or both plain integers (equal exactly when their values are, as math-verify finds them: ``007`` and
    ``7``, ``+5`` and ``5`` agree, two integers that differ in their last of 20 digits do not). Most answers of an
    integer-answer set (the toy world, GSM8K, AIME) are decided here, with no trip to the worker pool."""
    pred, truth = "".join(pred.split()), "".join(truth.split())
    if pred == truth:
        return True
    if _INTEGER_RE.fullmatch(pred) and _INTEGER_RE.fullmatch(truth):
        return int(pred) == int(truth)
    return None


def is_equivalent(pred: str, truth: str, timeout_s: float = 5.0) -> bool:
    """Whether answer ``pred`` equals reference ``truth`` mathematically (math-verify).

    ``\\frac{1}{2}``, ``0.5`` and ``\\dfrac12`` agree; units written as ``\\text{cm}`` or ``^\\circ`` are ignored
    by math-verify. Called from the main thread, math-verify's own timeouts bound each parse and comparison
    (``timeout_s`` rounded up to whole seconds). Called from another thread, where those signal-based timeouts cannot
    work, the check runs in the shared worker-process pool instead, with the same bounds.

    Args:
        pred: the model's answer (already extracted from its box).
        truth: the reference answer.
        timeout_s: limit per parse / comparison step, seconds.
    """
    _alarm_seconds(timeout_s)  # a bad limit is refused whatever the answers
    if not pred.strip() or not truth.strip():
        return False
    verdict = quick_verdict(pred, truth)
    if verdict is not None:
        return verdict
    if threading.current_thread() is threading.main_thread():
        return _verify_here(pred, truth, timeout_s)
    return default_scorer(timeout_s=timeout_s).verify_blocking(pred, truth)


def answer_or_none(response: str, truncated: bool, require_single_boxed: bool) -> str | None:
    """The answer to verify, or None when the response scores 0 without verification."""
    if truncated:
        return None
    if require_single_boxed and count_boxed(response) != 1:
        return None
    answer = extract_boxed(response)
    return answer if answer else None


def score(response: str, truth: str, truncated: bool, *, require_single_boxed: bool = False,
          timeout_s: float = 5.0) -> float:
    """Outcome reward of one response: 1.0 if its last boxed answer equals ``truth``, else 0.0.

    Args:
        response: the decoded response text.
        truth: the reference answer.
        truncated: the response hit the token budget; scores 0 (paper rule).
        require_single_boxed: option (off by default): score 0 unless the response has exactly one box.
        timeout_s: math-verify limit per step, seconds.
    """
    answer = answer_or_none(response, truncated, require_single_boxed)
    if answer is None:
        return 0.0
    return 1.0 if is_equivalent(answer, truth, timeout_s=timeout_s) else 0.0


def _worker_init() -> None:
    # Warm each worker (imports, the LaTeX grammar and sympy caches are built lazily on first use) so the first
    # verifications of a batch are not several times slower than the rest.
    _verify_here(r"\frac{1}{2}", "0.5", 5.0)


class RewardScorer:
    """Scores batches of responses in a pool of worker processes, never blocking the event loop.

    Args:
        max_workers: worker processes (default: min(4, CPU count)).
        timeout_s: math-verify limit per parse / comparison step, seconds (rounded up to whole seconds).
        hard_timeout_s: wall-clock limit of one verification task; past it the worker is killed and replaced and the
            response scores 0. Default ``4 * timeout_s + 2`` (two parses and up to a few comparisons, each bounded).
        require_single_boxed: option (off by default): score 0 unless a response has exactly one box.
        start_method: multiprocessing start method of the workers; "spawn" avoids forking a process that holds
            threads (torch, vLLM, the event loop). As with any spawn pool, a script run by path must keep its top
            level under ``if __name__ == "__main__":``; ``python -m`` entry points need nothing.
    """

    def __init__(self, max_workers: int | None = None, timeout_s: float = 5.0, hard_timeout_s: float | None = None,
                 require_single_boxed: bool = False, start_method: str = "spawn") -> None:
        _alarm_seconds(timeout_s)  # validate early
        self.max_workers = max_workers or min(4, os.cpu_count() or 1)
        self.timeout_s = timeout_s
        self.hard_timeout_s = hard_timeout_s if hard_timeout_s is not None else 4 * timeout_s + 2.0
        self.require_single_boxed = require_single_boxed
        self.start_method = start_method
        self.num_killed = 0  # verifications stopped at hard_timeout_s or lost with a crashed worker (scored 0)
        self._pool = None
        self._pool_pid: int | None = None  # a pool belongs to the process that made it (its threads do not fork)
        self._lock = threading.Lock()

    def _get_pool(self):
        with self._lock:
            if self._pool is None or self._pool_pid != os.getpid():
                from pebble import ProcessPool

                ctx = multiprocessing.get_context(self.start_method)
                self._pool = ProcessPool(max_workers=self.max_workers, initializer=_worker_init, context=ctx)
                self._pool_pid = os.getpid()
            return self._pool

    def _submit(self, pred: str, truth: str):
        return self._get_pool().schedule(_verify_here, args=(pred, truth, self.timeout_s),
                                         timeout=self.hard_timeout_s)

    def _outcome(self, result: object, pred: str) -> float:
        from pebble import ProcessExpired

        if isinstance(result, (FutureTimeoutError, ProcessExpired)):
            self.num_killed += 1
            logger.warning("reward: verification of %r stopped (%s); scored 0", pred[:80], type(result).__name__)
            return 0.0
        if isinstance(result, BrokenProcessPool):
            raise RuntimeError(
                "reward: the verification workers could not start (their pool is broken). They start by re-importing "
                "the main script (start method 'spawn'): a script run by path must keep its top level under "
                "`if __name__ == \"__main__\":` (docs/usage.md, 'From Python')") from result
        if isinstance(result, BaseException):
            raise result  # a real bug (e.g. an import error in the worker) must not turn into a silent 0
        return 1.0 if result else 0.0

    def verify_blocking(self, pred: str, truth: str) -> bool:
        """One equivalence check in the pool, waiting for the result (for callers off the main thread)."""
        future = self._submit(pred, truth)
        try:
            result: object = future.result()
        except Exception as exc:  # noqa: BLE001 - timeouts, lost workers and bugs are sorted out by _outcome
            result = exc
        return self._outcome(result, pred) > 0

    async def score_batch(self, responses: Sequence[str], truths: Sequence[str],
                          truncated: Sequence[bool]) -> list[float]:
        """Rewards of a batch, in order. Extraction and the answers that need no parse (``quick_verdict``) run
        here; math-verify runs in the workers."""
        _check_lengths(responses, truths, truncated)
        scores = [0.0] * len(responses)
        pending: dict[int, tuple[str, asyncio.Future]] = {}
        for i, (response, truth, trunc) in enumerate(zip(responses, truths, truncated)):
            answer = answer_or_none(response, bool(trunc), self.require_single_boxed)
            if answer is None or not truth.strip():
                continue
            verdict = quick_verdict(answer, truth)
            if verdict is not None:
                scores[i] = float(verdict)
                continue
            pending[i] = (answer, asyncio.wrap_future(self._submit(answer, truth)))
        results = await asyncio.gather(*(fut for _, fut in pending.values()), return_exceptions=True)
        for (i, (answer, _)), result in zip(pending.items(), results):
            scores[i] = self._outcome(result, answer)
        return scores

    async def parses(self, answers: Sequence[str]) -> list[bool]:
        """Whether math-verify reads each answer (in the workers; one stopped at the hard timeout does not)."""
        futures = [asyncio.wrap_future(self._get_pool().schedule(_parses_here, args=(a, self.timeout_s),
                                                                 timeout=self.hard_timeout_s)) for a in answers]
        results = await asyncio.gather(*futures, return_exceptions=True)
        return [result is True for result in results]

    def close(self) -> None:
        """Stop the worker processes."""
        with self._lock:
            if self._pool is not None and self._pool_pid == os.getpid():
                self._pool.stop()
                self._pool.join()
            self._pool = None

    def __enter__(self) -> RewardScorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_lengths(responses: Sequence[str], truths: Sequence[str], truncated: Sequence[bool]) -> None:
    if not len(responses) == len(truths) == len(truncated):
        raise ValueError(f"score_batch: responses ({len(responses)}), truths ({len(truths)}) and truncated "
                         f"({len(truncated)}) must have the same length")


_SCORERS: dict[tuple, RewardScorer] = {}
_SCORERS_LOCK = threading.Lock()


def default_scorer(max_workers: int | None = None, timeout_s: float = 5.0,
                    require_single_boxed: bool = False) -> RewardScorer:
    """A process-wide scorer per configuration, created on first use and closed at interpreter exit."""
    key = (max_workers, timeout_s, require_single_boxed)
    with _SCORERS_LOCK:
        if key not in _SCORERS:
            _SCORERS[key] = RewardScorer(max_workers, timeout_s, require_single_boxed=require_single_boxed)
        return _SCORERS[key]


@atexit.register
def _close_default_scorers() -> None:
    for scorer in list(_SCORERS.values()):
        scorer.close()
    _SCORERS.clear()


async def score_batch(responses: Sequence[str], truths: Sequence[str], truncated: Sequence[bool],
                      max_workers: int | None = None, timeout_s: float = 5.0,
                      require_single_boxed: bool = False) -> list[float]:
    """Rewards of a batch of responses, verified in a shared worker-process pool (see ``RewardScorer``).

    Args:
        responses: decoded responses.
        truths: reference answers, one per response.
        truncated: per response, whether it hit the token budget (scores 0).
        max_workers: worker processes of the shared pool for this configuration.
        timeout_s: math-verify limit per step, seconds.
        require_single_boxed: option (off by default): score 0 unless a response has exactly one box.

    Returns:
        One reward (1.0 or 0.0) per response, in order.
    """
    scorer = default_scorer(max_workers, timeout_s, require_single_boxed)
    return await scorer.score_batch(responses, truths, truncated)

