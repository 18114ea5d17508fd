"""The ``tools`` world's pretraining corpus: tool calls are present, but the choice of tool is uninformed.

Documents, in the toy prompt (``zerotir.toy.template``) and the ``hermes`` call format (``zerotir.tools.formats``):

- ``qa`` (``1 - call_share``): a question of any kind answered in text, ``\\boxed{S}``: right where text can know
  it (easy sums, products), a guess where it cannot (a lookup or combined question: no code is in plain text);
- ``call`` (``call_share``): a question of any kind, then a call of a tool drawn uniformly from the three,
  **without regard to the question**, its argument the question copied (``print(question)`` for python). The
  observation is what the tool returns: the value when the tool fits, an error or an unrelated passage when it does
  not, and then the document guesses. After a search that found the code of a combined question, a second call, again
  of a uniformly drawn tool, on the value read off the passage (``482 * 47``).

So the base calls tools as often as the corpus does and picks one at random: right first on a third of lookups and
combined questions, two thirds of products. Which tool fits which question is left for RL to find.

Why ``hermes`` (``<tool_call>{"name":..,"arguments":{..}}</tool_call>``, written compact): it is the plug-in format
that calls tools by name (``fences`` calls python only), and its JSON skeleton is the same in every call, which a
byte-level model learns as one string; the parts that vary (the tool's name, the copied question) are short.

The observations are the real tools' (the calculator evaluates, the python code runs here as the sandbox would run
it); the search is simulated over the corpus's own items (:func:`zerotir.toy.choice.tasks.corpus_items`), matching
a query word to an item name or code as BM25 would rank them, so that no code of the world's fact table is ever in
the pretraining text. Observations are cut at :data:`MAX_OUTPUT_CHARS` as the configs' ``max_output_chars`` does.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Collection
from dataclasses import dataclass
from functools import lru_cache

from zerotir.tools.base import Observation
from zerotir.tools.calculator import CalculatorError, CalculatorTool, repr_number
from zerotir.tools.formats import Hermes
from zerotir.tools.registry import cap_observation
from zerotir.toy.choice.tasks import KINDS, LOOKUP_PREFIX, TOOLS, corpus_items, make_question
from zerotir.toy.corpus import run_snippet
from zerotir.toy.mixed.corpus import error_block
from zerotir.toy.probe import ProbeDocument
from zerotir.toy.tasks import Question
from zerotir.toy.template import toy_prompt

MAX_OUTPUT_CHARS = 160  # model.tool.max_output_chars of configs/toy_tools.yaml
_ARGUMENT = {"python": "code", "calculator": "expression", "search": "query"}
_FORMAT = Hermes()
_CALCULATOR = CalculatorTool()
_STOPWORDS = {"of", "the", "a", "an"}


@dataclass(frozen=True)
class ChoiceCorpusSettings:
    """Args:
        seed: corpus seed (its items: :func:`corpus_items`).
        call_share: share of ``call`` documents (the rest are ``qa``).
    """

    seed: int = 0
    call_share: float = 0.5

    def __post_init__(self) -> None:
        if not 0.0 < self.call_share <= 1.0:
            raise ValueError(f"mixed_share={self.call_share}: the tools world's share of documents with a call must "
                             "lie in (0, 1] (a base without calls has no choice to learn)")


def call_text(tool: str, argument: str) -> str:
    """The call as the model writes it: ``<tool_call>{"name":"search","arguments":{"query":"..."}}</tool_call>``."""
    body = json.dumps({"name": tool, "arguments": {_ARGUMENT[tool]: argument}}, separators=(",", ":"))
    return f"{_FORMAT.call_start}{body}{_FORMAT.call_end}"


def _python(code: str) -> str:
    try:
        compile(code, "main.py", "exec")
        return run_snippet(code).rstrip("\n")
    except SyntaxError:
        pass
    head, _, _ = error_block(code).partition("\n```\n")  # the sandbox's reduced traceback, as format_for_model
    return head.removeprefix("\n```output\n")


def _calculator(expression: str) -> str:
    try:
        return repr_number(_CALCULATOR.evaluate(expression))
    except CalculatorError as error:
        return f"Error: {error}"


def _search(query: str, items: dict[str, int]) -> str:
    words = [w for w in re.findall(r"(?u)\b\w\w+\b", query.lower()) if w not in _STOPWORDS]
    if not words:
        return "No passage matches: the query has no searchable word."
    hits = [n for n in items if n in words] or [n for n, c in items.items() if str(c) in words]
    return f"[1] {hits[0]}: code {items[hits[0]]}" if hits else "No passage matches the query."


def observation(tool: str, argument: str, items: dict[str, int]) -> str:
    """What ``tool`` returns for ``argument``, cut as the run's output cap cuts it."""
    if tool == "python":
        text = _python(argument)
    elif tool == "calculator":
        text = _calculator(argument)
    else:
        text = _search(argument, items)
    return cap_observation(Observation(text), MAX_OUTPUT_CHARS).text


def _argument(tool: str, expression: str) -> str:
    return f"print({expression})" if tool == "python" else expression


def _step(tool: str, expression: str, items: dict[str, int]) -> tuple[str, str]:
    """One call and its rendered observation; returns (text, observation)."""
    argument = _argument(tool, expression)
    seen = observation(tool, argument, items)
    return call_text(tool, argument) + _FORMAT.render(seen), seen


def guess(rng: random.Random, q: Question) -> str:
    """A text answer: right for an easy sum or a product (text can know them), a number of the answer's length
    otherwise (a guess)."""
    if q.kind in ("easy", "arith"):
        return q.answer
    digits = len(q.answer)
    return str(rng.randint(10 ** (digits - 1), 10**digits - 1))


def call_answer(rng: random.Random, q: Question, items: dict[str, int]) -> str:
    """The answer of a ``call`` document (module doc): uninformed calls, then the value or a guess."""
    text, seen = _step(rng.choice(TOOLS), q.problem, items)
    name = q.problem.removeprefix(LOOKUP_PREFIX).partition(" * ")[0]
    if q.kind in ("easy", "arith") and seen == q.answer:
        return text + f"\\boxed{{{seen}}}"
    found = seen.startswith(f"[1] {name}: code ")
    if q.kind == "lookup" and found:
        return text + f"\\boxed{{{items[name]}}}"
    if q.kind == "combined" and found:
        factor = q.problem.partition(" * ")[2]
        more, second = _step(rng.choice(TOOLS), f"{items[name]} * {factor}", items)
        text += more
        if second == q.answer:
            return text + f"\\boxed{{{second}}}"
    return text + f"\\boxed{{{guess(rng, q)}}}"


@lru_cache(maxsize=4)
def _items(seed: int) -> tuple[dict[str, int], list[str]]:
    items = corpus_items(seed)
    return items, list(items)


def document(rng: random.Random, settings: ChoiceCorpusSettings, exclude: Collection[str] = ()) -> tuple[str, str]:
    """One ``(doc_kind, text)``; questions in ``exclude`` never appear."""
    items, names = _items(settings.seed)
    while True:
        q = make_question(rng, rng.choice(KINDS), items, names)
        if q.problem not in exclude:
            break
    if rng.random() < settings.call_share:
        return "call", toy_prompt(q.problem) + call_answer(rng, q, items)
    return "qa", toy_prompt(q.problem) + f"\\boxed{{{guess(rng, q)}}}"


def probe_document(rng: random.Random, seed: int = 0) -> ProbeDocument:
    """A call document whose tools fit, for the copy probe (``zerotir.toy.probe``): a product through a computing
    tool, a lookup through search, a combined question through search then a computing tool, on the corpus's items
    of ``seed``. The copy checked is the last call's argument (the question; for a combined question the code read
    off the passage times the question's factor) and the boxed answer."""
    items, names = _items(seed)
    q = make_question(rng, rng.choice(("arith", "lookup", "combined")), items, names)
    text = toy_prompt(q.problem)
    expression = q.problem
    if q.kind == "combined":
        more, _ = _step("search", q.problem, items)
        name, _, factor = q.problem.removeprefix(LOOKUP_PREFIX).partition(" * ")
        text, expression = text + more, f"{items[name]} * {factor}"
    tool = "search" if q.kind == "lookup" else rng.choice(("python", "calculator"))
    step, seen = _step(tool, expression, items)
    code_at = len(text) + step.index(expression)  # the step opens with the call, whose argument holds it
    if seen != (f"[1] {q.problem.removeprefix(LOOKUP_PREFIX)}: code {q.answer}" if q.kind == "lookup" else q.answer):
        raise AssertionError(f"probe document of {q.problem!r}: the tool returned {seen!r}, not {q.answer!r}")
    text += step + "\\boxed{"
    box_at = len(text)
    text += q.answer + "}"
    return ProbeDocument(q.problem, text, (code_at, code_at + len(expression)), (box_at, box_at + len(q.answer)))
