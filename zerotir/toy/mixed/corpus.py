"""The ``mixed`` world's pretraining corpus: like the first world's, but with the imperfections of real web text.

Documents (default shares in brackets, see :class:`MixedCorpusSettings`):

- ``qa`` (54%): a question in the toy prompt answered in plain text, ``\\boxed{S}``; half easy, half hard.
  A share ``text_error`` of the answers is wrong (off by one, by ten, or a neighbouring times-table entry), as
  arithmetic on the web sometimes is: sampled at temperature 1, the base then answers easy questions in text with an
  accuracy in between, not 0 and not 1;
- ``code`` (30%): a snippet of the first world's kinds and its true output (``zerotir.toy.corpus``);
- ``worked`` (10%): "Compute E." then ``print(E)``, its output and the box copied from it (correct code);
- ``mixed`` (6%): a question in the toy prompt answered with a tool call. A share ``code_bugs`` of these calls is
  buggy, a third each: a wrong operator (``print(12 + 34)`` for ``12 * 34``), an operand off by one
  (``print(482 * 918)``), or a syntax error (the closing parenthesis missing), whose error block is followed half the
  time by a corrected second call and otherwise by a text answer. The output blocks are what the code really prints.

The output of a buggy call is copied into the box like any other output, so the base's code is sometimes wrong and
sometimes right; RL can learn to write it right, to call once or retry, and when to call at all.

Multi-step questions (``digitsum(482 * 917)``, a share ``multi_share`` of the questions; 0 by default) are solved in
two calls, the product and then the sum of its digits as read off the output (``print(4 + 4 + 1 + 9 + 9 + 4)``).
Their buggy calls are the first call's bugs above, or the question copied into one call (``print(digitsum(...))``),
whose ``NameError`` block, like a syntax error's, is followed by a text answer.
"""

from __future__ import annotations

import random
import traceback
from collections.abc import Collection
from dataclasses import asdict, dataclass

from sandbox.result import ExecResult, ExecStatus, format_for_model
from zerotir.config import ToolConfig
from zerotir.toy.corpus import code_document, run_snippet, snippet
from zerotir.toy.mixed.tasks import check_kinds, draw_group, group_kinds, make_question
from zerotir.toy.tasks import Question
from zerotir.toy.template import code_block, output_block, toy_prompt

BUG_KINDS = ("operator", "off_by_one", "syntax")
DIGIT_SUM = "digitsum("


@dataclass(frozen=True)
class MixedCorpusSettings:
    """Shares of the ``mixed`` corpus (the rest of the documents are ``qa``).

    Args:
        seed: corpus seed.
        mixed_share / code_share / worked_share: document shares (see the module docstring).
        easy_share: share of easy questions in ``qa``, ``mixed`` and ``worked`` documents.
        text_error: share of plain-text answers that are wrong.
        code_bugs: share of tool calls in ``mixed`` documents that are buggy (a third of each bug kind).
        kinds: the question kinds documents may ask (``zerotir.toy.mixed.tasks``); empty: all of them.
        multi_share: share of multi-step questions (``digitsum``) in ``qa``, ``mixed`` and ``worked`` documents,
            taken from the hard share.
    """

    seed: int = 0
    mixed_share: float = 0.06
    code_share: float = 0.30
    worked_share: float = 0.10
    easy_share: float = 0.5
    text_error: float = 0.2
    code_bugs: float = 0.4
    kinds: tuple[str, ...] = ()
    multi_share: float = 0.0

    def __post_init__(self) -> None:
        check_kinds(self.kinds)
        hard = 1.0 - self.easy_share - self.multi_share
        if hard < -1e-9:
            raise ValueError(f"easy_share={self.easy_share} + multi_share={self.multi_share} must be at most 1 (the "
                             "rest of the questions are hard)")
        for group, share in (("easy", self.easy_share), ("multi", self.multi_share), ("hard", hard)):
            if share > 1e-9 and not group_kinds(group, self.kinds):
                raise ValueError(f"kinds={list(self.kinds)} has no {group} kind, but the {group} share is {share}")
        shares = ("mixed_share", "code_share", "worked_share", "easy_share", "text_error", "code_bugs", "multi_share")
        for name in shares:
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name}={value}: must lie in [0, 1]")
        if self.mixed_share + self.code_share + self.worked_share > 1.0:
            raise ValueError("mixed_share + code_share + worked_share must be at most 1 (the rest is qa documents)")

    def to_dict(self) -> dict:
        return asdict(self)


def wrong_answer(rng: random.Random, q: Question) -> str:
    """A plausible wrong answer: off by one or by ten, or (times table) a neighbouring entry."""
    value = int(q.answer)
    if q.kind == "mul_1d":
        a, b = (int(t) for t in q.problem.split(" * "))
        candidates = [a * (b + 1), a * (b - 1), (a + 1) * b, value + 1, value - 1]
    else:
        candidates = [value + 1, value - 1, value + 10, value - 10]
    candidates = [c for c in candidates if c != value and c >= 0]
    return str(rng.choice(candidates))


def text_answer(rng: random.Random, q: Question, text_error: float) -> str:
    """The answer in plain text, ``\\boxed{S}`` right after ``A: `` (no restated question: a tiny model learns
    to answer at a fixed offset from the question far sooner than it learns to copy it), wrong with probability
    ``text_error``."""
    answer = wrong_answer(rng, q) if rng.random() < text_error else q.answer
    return f"\\boxed{{{answer}}}"


def buggy_code(rng: random.Random, problem: str, bug: str) -> str:
    """``print(problem)`` with one bug of kind ``bug`` (see :data:`BUG_KINDS`)."""
    tokens = problem.split(" ")
    if bug == "operator":
        ops = [i for i, t in enumerate(tokens) if t in "+-*"]
        i = rng.choice(ops)
        tokens[i] = rng.choice([op for op in "+-*" if op != tokens[i]])
        return f"print({' '.join(tokens)})"
    if bug == "off_by_one":
        nums = [i for i, t in enumerate(tokens) if t.isdigit()]
        i = rng.choice(nums)
        tokens[i] = str(int(tokens[i]) + rng.choice((1, -1)))
        return f"print({' '.join(tokens)})"
    if bug == "syntax":
        return f"print({problem}"
    raise ValueError(f"bug {bug!r}: use one of {BUG_KINDS}")


def error_block(code: str) -> str:
    """The output block the tool loop injects for ``code`` that fails (the traceback's last lines): it does not
    compile, or it raises (``print(digitsum(...))``: a ``NameError``)."""
    try:
        compiled = compile(code, "main.py", "exec")
    except SyntaxError as err:
        stderr = "".join(traceback.format_exception_only(err))
    else:
        try:
            exec(compiled, {})  # corpus code this module generated: arithmetic and print only
        except Exception as err:  # noqa: BLE001 - the error is what the block shows
            stderr = "".join(traceback.format_exception(type(err), err, err.__traceback__.tb_next))  # the code's frames
        else:
            raise ValueError(f"{code!r} runs; error_block is for code that fails")
    result = ExecResult(ExecStatus.ERROR, "", stderr, 0.0, 1)
    return ToolConfig().output_template.format(output=format_for_model(result))


def digit_calls(expr: str) -> tuple[str, str]:
    """The two calls of a multi-step answer for ``digitsum(expr)``, each with its output block: the product, then
    the sum of the digits it printed; and the final output."""
    first = run_snippet(f"print({expr})")
    digits = " + ".join(first.strip().lstrip("-"))
    second = run_snippet(f"print({digits})")
    text = code_block(f"print({expr})") + output_block(first) + code_block(f"print({digits})") + output_block(second)
    return text, second.strip()


def multi_answer(rng: random.Random, q: Question, settings: MixedCorpusSettings) -> str:
    """A tool-integrated answer to a multi-step question: the two calls, or (with probability ``code_bugs``) a
    buggy first call (its wrong output read on), or a first call that fails (a syntax error, or the question copied
    into one call), whose error is followed by a text answer: with a correction's two calls more, a document would
    outgrow the pretraining rows and the RL response budget."""
    expr = q.problem.removeprefix(DIGIT_SUM).removesuffix(")")
    bug = rng.choice((*BUG_KINDS, "one_call")) if rng.random() < settings.code_bugs else None
    if bug in ("syntax", "one_call"):
        code = f"print({expr}" if bug == "syntax" else f"print({q.problem})"
        return code_block(code) + error_block(code) + text_answer(rng, q, settings.text_error)
    if bug is not None:
        expr = buggy_code(rng, expr, bug).removeprefix("print(").removesuffix(")")
    calls, answer = digit_calls(expr)
    return calls + f"\\boxed{{{answer}}}"


def tool_answer(rng: random.Random, q: Question, settings: MixedCorpusSettings) -> str:
    """One tool-integrated answer to ``q``: a call (buggy with probability ``code_bugs``), its output, the box; two
    calls for a multi-step question (``multi_answer``)."""
    if q.problem.startswith(DIGIT_SUM):
        return multi_answer(rng, q, settings)
    bug = rng.choice(BUG_KINDS) if rng.random() < settings.code_bugs else None
    code = f"print({q.problem})" if bug is None else buggy_code(rng, q.problem, bug)
    if bug != "syntax":
        stdout = run_snippet(code)
        return code_block(code) + output_block(stdout) + f"\\boxed{{{stdout.strip()}}}"
    text = code_block(code) + error_block(code)
    if rng.random() < 0.5:  # a second, corrected call
        stdout = run_snippet(f"print({q.problem})")
        return text + code_block(f"print({q.problem})") + output_block(stdout) + f"\\boxed{{{stdout.strip()}}}"
    return text + text_answer(rng, q, settings.text_error)


def _question(rng: random.Random, settings: MixedCorpusSettings, exclude: Collection[str]) -> Question:
    while True:
        q = make_question(rng, draw_group(rng, settings.easy_share, settings.multi_share), settings.kinds)
        if q.problem not in exclude:
            return q


def document(rng: random.Random, settings: MixedCorpusSettings, exclude: Collection[str] = ()) -> tuple[str, str]:
    """One ``(doc_kind, text)`` drawn by the shares of ``settings``; questions in ``exclude`` never appear."""
    u = rng.random()
    if u < settings.mixed_share:
        q = _question(rng, settings, exclude)
        return "mixed", toy_prompt(q.problem) + tool_answer(rng, q, settings)
    if u < settings.mixed_share + settings.worked_share:
        q = _question(rng, settings, exclude)
        if q.problem.startswith(DIGIT_SUM):
            calls, answer = digit_calls(q.problem.removeprefix(DIGIT_SUM).removesuffix(")"))
            return "worked", f"Compute {q.problem}.\n" + calls + f"\\boxed{{{answer}}}"
        stdout = run_snippet(f"print({q.problem})")
        return "worked", (f"Compute {q.problem}.\n" + code_block(f"print({q.problem})") + output_block(stdout)
                          + f"\\boxed{{{stdout.strip()}}}")
    if u < settings.mixed_share + settings.worked_share + settings.code_share:
        code = snippet(rng)
        while code.removeprefix("print(").removesuffix(")") in exclude:
            code = snippet(rng)
        return "code", code_document(code)
    q = _question(rng, settings, exclude)
    return "qa", toy_prompt(q.problem) + text_answer(rng, q, settings.text_error)
