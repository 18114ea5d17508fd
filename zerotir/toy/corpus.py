"""The toy pretraining corpus: a web corpus in miniature, seeded and deterministic.

Four kinds of documents (default shares in brackets):

- ``qa`` (55%): an arithmetic question in the toy prompt, answered in plain text by restating it,
  ``A * B = \\boxed{P}`` (easy and hard questions; answers always true, hard ones beyond a tiny model's head);
- ``code`` (30%): a short Python snippet in the tool-call fence followed by its true output in the injected-output
  block (the output is obtained by running the snippet, never written by hand);
- ``worked`` (10%): "Compute E." then ``print(E)`` in a code block, its output, and the boxed value copied from it;
- ``mixed`` (5%): a question in the toy prompt, then ``print(question)`` in a code block, its output block, then the
  boxed answer copied from the output: exactly the text a successful tool-integrated rollout produces.

Why: a tool call only pays if the model can copy the question into ``print(...)`` and the output into the box. A tiny
model learns copying late and suddenly; these documents make it learn it within a few minutes of CPU:

- restating answers (a throwaway experiment found RL never took off without them) make copying the question the
  most frequent lesson of the corpus;
- ``worked`` documents train the whole copy-print-copy chain, in another phrasing than the toy prompt, so they teach
  the skill without teaching the habit of calling the tool after the toy prompt (only ``mixed`` documents do that:
  about 5%, which gives a base model that opens a code block in roughly one answer in eight);
- some snippets print what they were given (``print(n)``, a list, a commented expression) for cheap copy practice.

No document answers a held-out question (see ``exclude``).
"""

from __future__ import annotations

import contextlib
import io
import random
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass

from zerotir.toy.tasks import Question, make_question
from zerotir.toy.template import code_block, output_block, restated_answer, toy_prompt

DOC_KINDS = ("qa", "code", "worked", "mixed")


@dataclass(frozen=True)
class CorpusSettings:
    """What the corpus is made of.

    Args:
        seed: the corpus seed; the same settings give the same documents.
        mixed_share: share of ``mixed`` documents (toy prompt, code, output, answer).
        code_share: share of ``code`` documents (snippet and output).
        worked_share: share of ``worked`` documents ("Compute ...", code, output, answer: not the toy prompt).
            The rest are ``qa`` documents.
        easy_share: share of easy questions among the questions of ``qa`` and ``mixed`` documents (the rest are hard).
    """

    seed: int = 0
    mixed_share: float = 0.05
    code_share: float = 0.30
    worked_share: float = 0.10
    easy_share: float = 0.3

    def __post_init__(self) -> None:
        for name in ("mixed_share", "code_share", "worked_share", "easy_share"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name}={value}: must lie in [0, 1]")
        total = self.mixed_share + self.code_share + self.worked_share
        if total > 1.0:
            raise ValueError(f"mixed_share + code_share + worked_share = {total}: must be at most 1 "
                             "(the rest of the corpus is plain question/answer documents)")

    def to_dict(self) -> dict:
        return asdict(self)


def run_snippet(code: str) -> str:
    """Run a corpus snippet (code this module generated, arithmetic only) and return what it printed."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(code, {})  # the snippets are produced by the generators below, never taken from outside
    return buf.getvalue()


def _n(rng: random.Random) -> int:
    """A number of 1 to 4 digits."""
    digits = rng.randint(1, 4)
    return rng.randint(1 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)


def _expr(rng: random.Random) -> str:
    """An arithmetic expression like the questions: 2 to 4 numbers joined by + - *."""
    terms = [str(_n(rng)) for _ in range(rng.randint(2, 4))]
    out = terms[0]
    for t in terms[1:]:
        out += f" {rng.choice('+-*')} {t}"
    return out


def _commented(rng: random.Random) -> str:
    expr = _expr(rng)
    return f"# {expr}\nprint({expr})"


# Snippet generators: ``print(expression)``, the habit the tool calls need, everyday forms (variables, sum, a loop,
# divmod, a square) and forms that copy, which a tiny model learns late and RL needs first: ``print(n)``, a printed
# list, ``x = n; print(x)`` (the output repeats what the code says) and a commented expression printed below its
# comment (copying an expression seen above into ``print(...)``, as a tool call copies the question).
SNIPPETS: list[tuple[float, Callable[[random.Random], str]]] = [
    (0.15, lambda r: f"print({_expr(r)})"),
    (0.15, _commented),
    (0.20, lambda r: f"print([{', '.join(str(_n(r)) for _ in range(r.randint(2, 4)))}])"),
    (0.10, lambda r: f"print({_n(r)}{_n(r)})"),
    (0.05, lambda r: f"x = {_n(r)}\nprint(x)"),
    (0.10, lambda r: f"a = {_n(r)}\nb = {_n(r)}\nprint(a {r.choice('+-*')} b)"),
    (0.05, lambda r: f"print(sum([{', '.join(str(_n(r)) for _ in range(r.randint(2, 5)))}]))"),
    (0.05, lambda r: f"x = {_n(r)}\nfor i in range({r.randint(2, 4)}):\n    x = x + {_n(r)}\nprint(x)"),
    (0.05, lambda r: f"print({_n(r)} // {r.randint(2, 99)}, {_n(r)} % {r.randint(2, 99)})"),
    (0.10, lambda r: f"n = {_n(r)}\nprint(n * n)"),
]


def snippet(rng: random.Random) -> str:
    """One snippet, drawn by the weights of :data:`SNIPPETS`."""
    weights, makers = zip(*SNIPPETS, strict=True)
    return rng.choices(makers, weights=weights)[0](rng)


def qa_document(q: Question) -> str:
    """The toy prompt and the plain restated answer."""
    return toy_prompt(q.problem) + restated_answer(q.problem, q.answer)


def code_document(code: str) -> str:
    """A snippet in the tool-call fence followed by its true output in the injected block."""
    return code_block(code) + output_block(run_snippet(code))


def _tool_answer(q: Question) -> str:
    """``print(question)`` in a code block, its true output, the boxed answer copied from it."""
    code = f"print({q.problem})"
    stdout = run_snippet(code)
    if stdout.strip() != q.answer:  # the whole point of these documents is that the tool output is the answer
        raise RuntimeError(f"{code!r} printed {stdout!r}, expected {q.answer!r}")
    return code_block(code) + output_block(stdout) + f"\\boxed{{{q.answer}}}"


def mixed_document(q: Question) -> str:
    """The toy prompt, then the tool-integrated answer: exactly a successful RL rollout."""
    return toy_prompt(q.problem) + _tool_answer(q)


def worked_document(q: Question) -> str:
    """A worked example in another phrasing ("Compute ..."): the same copy-print-copy chain as a tool call, without
    the toy prompt, so it trains the skills a tool call needs without teaching the model to call tools after it."""
    return f"Compute {q.problem}.\n" + _tool_answer(q)


def _question(rng: random.Random, settings: CorpusSettings, exclude: Collection[str]) -> Question:
    while True:
        q = make_question(rng, "easy" if rng.random() < settings.easy_share else "hard")
        if q.problem not in exclude:
            return q


def document(rng: random.Random, settings: CorpusSettings, exclude: Collection[str] = ()) -> tuple[str, str]:
    """One ``(doc_kind, text)`` drawn by the shares of ``settings``; questions in ``exclude`` never appear."""
    u = rng.random()
    if u < settings.mixed_share:
        return "mixed", mixed_document(_question(rng, settings, exclude))
    if u < settings.mixed_share + settings.worked_share:
        return "worked", worked_document(_question(rng, settings, exclude))
    if u < settings.mixed_share + settings.worked_share + settings.code_share:
        code = snippet(rng)
        while code.removeprefix("print(").removesuffix(")") in exclude:  # a held-out question in disguise
            code = snippet(rng)
        return "code", code_document(code)
    return "qa", qa_document(_question(rng, settings, exclude))


def build_corpus(n_docs: int, settings: CorpusSettings, exclude: Collection[str] = ()) -> list[tuple[str, str]]:
    """``n_docs`` documents as ``(doc_kind, text)``, deterministic in ``settings`` (its seed included).

    Args:
        n_docs: number of documents.
        settings: shares and seed.
        exclude: question expressions that must not appear (the held-out set).
    """
    if n_docs < 1:
        raise ValueError(f"n_docs={n_docs}: the corpus needs at least one document")
    rng = random.Random(f"corpus-{settings.seed}")
    excluded = set(exclude)
    return [document(rng, settings, excluded) for _ in range(n_docs)]
