"""Tests of the toy pretraining corpus: determinism, shares, exact formats, true outputs, no held-out leaks."""

import re
import subprocess
import sys
from collections import Counter

import pytest

from sandbox.result import ExecResult, ExecStatus, format_for_model
from zerotir.rewards.verify import extract_boxed
from zerotir.config import ToolConfig
from zerotir.rollout.tool_block import code_after_start, code_before_end
from zerotir.toy.corpus import DOC_KINDS, CorpusSettings, build_corpus, code_document, mixed_document, qa_document
from zerotir.toy.tasks import Question
from zerotir.toy.template import CODE_CLOSE, CODE_OPEN, toy_prompt

Q = Question("mul_3x3", "482 * 917", "441994")
PROMPT = "Python ok.\nQ: 482 * 917 = ?\nA: "
# A tool-loop rollout: the model writes the fenced code, the loop injects "\n```output\n{output}\n```\n".
CODE_RE = re.compile(r"```python\n(.*?)\n```\n```output\n(.*?)\n```\n", re.S)
QUESTION_RE = re.compile(r"\nQ: (.*) = \?\nA: |^Compute (.*)\.\n")  # toy prompt or worked example


def _question(text: str) -> str:
    match = QUESTION_RE.search(text)
    return match.group(1) or match.group(2)


def test_prompt_and_documents_hand_written():
    assert toy_prompt("482 * 917") == PROMPT
    assert qa_document(Q) == PROMPT + "482 * 917 = \\boxed{441994}"
    assert mixed_document(Q) == (
        PROMPT + "```python\nprint(482 * 917)\n```" + "\n```output\n441994\n```\n" + "\\boxed{441994}"
    )
    six_times_seven = "a = 6\nb = 7\nprint(a * b)"
    assert code_document(six_times_seven) == f"```python\n{six_times_seven}\n```\n```output\n42\n```\n"


def test_mixed_document_rejects_a_wrong_answer():
    with pytest.raises(RuntimeError, match="expected"):
        mixed_document(Question("mul_3x3", "482 * 917", "441995"))


def test_mixed_document_parses_like_a_rollout():
    """Split a mixed document as the tool loop splits a rollout: stop at "```python", stop at "```", extract the code
    with the loop's own functions; the code prints the answer and the rest is the injected block plus the answer."""
    tool = ToolConfig()
    text = mixed_document(Q)
    first = text.index(tool.code_start) + len(tool.code_start)  # phase 1 ends on the code_start stop
    second = text.index(tool.code_end, first) + len(tool.code_end)  # phase 2 ends on the code_end stop
    code = code_before_end(code_after_start(text[:second], tool.code_start), tool.code_end)
    assert code == "\nprint(482 * 917)\n"
    injected = tool.output_template.format(output=format_for_model(ExecResult(ExecStatus.OK, "441994\n", "", 0.01)))
    assert text[second:] == injected + "\\boxed{441994}"
    assert extract_boxed(text) == "441994"


def test_deterministic_and_seeded():
    a = build_corpus(300, CorpusSettings(seed=3))
    assert a == build_corpus(300, CorpusSettings(seed=3))
    assert a != build_corpus(300, CorpusSettings(seed=4))


def test_shares():
    counts = Counter(kind for kind, _ in build_corpus(4000, CorpusSettings(seed=0)))
    # Binomial(4000, p): 3 standard deviations of p = 0.05 is 0.010; of 0.10, 0.014; of 0.30, 0.022.
    assert 0.04 <= counts["mixed"] / 4000 <= 0.06
    assert 0.086 <= counts["worked"] / 4000 <= 0.114
    assert 0.278 <= counts["code"] / 4000 <= 0.322
    assert sum(counts.values()) == 4000 and set(counts) == set(DOC_KINDS)


def test_formats_parse_as_tool_calls():
    for kind, text in build_corpus(600, CorpusSettings(seed=1, mixed_share=0.3)):
        calls = CODE_RE.findall(text)
        if kind == "qa":
            assert not calls and text.startswith(PROMPT[:14]) and text.count(CODE_OPEN) == 0
            problem = _question(text)
            assert text.endswith(f"A: {problem} = \\boxed{{{eval(problem)}}}")  # restates the question, true answer
        elif kind == "code":
            assert len(calls) == 1 and text.startswith(CODE_OPEN) and text.endswith("\n```\n")
        else:
            assert len(calls) == 1 and (kind == "worked" or text.startswith(PROMPT[:14]))
            problem = _question(text)
            code, output = calls[0]
            assert code == f"print({problem})" and output == str(eval(problem))
            assert text.endswith(f"```\n\\boxed{{{output}}}")
            assert (CODE_OPEN + code + CODE_CLOSE) in text


def test_outputs_are_what_python_prints():
    """Every snippet's output block is what a separate Python process prints for it."""
    docs = [t for k, t in build_corpus(400, CorpusSettings(seed=2)) if k != "qa"][:40]
    programs = [CODE_RE.search(t).groups() for t in docs]
    # One process runs all snippets, separated by a marker, so the test stays fast.
    marker = "----8<----"
    script = "\n".join(f"exec({code!r})\nprint({marker!r})" for code, _ in programs)
    out = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, check=True).stdout
    printed = out.split(marker + "\n")[:-1]
    assert [p.rstrip("\n") for p in printed] == [o for _, o in programs]


def test_heldout_questions_never_appear():
    plain = build_corpus(500, CorpusSettings(seed=5, mixed_share=0.2))
    asked = {_question(t) for k, t in plain if k != "code"}
    hard = {p for p in asked if "*" in p and len(p) == 9}  # 3-digit by 3-digit products seen in the plain corpus
    assert hard
    again = build_corpus(500, CorpusSettings(seed=5, mixed_share=0.2), exclude=hard)
    assert not any(p in t for p in hard for _, t in again)


@pytest.mark.parametrize(
    "field, value", [("mixed_share", -0.1), ("code_share", 1.5), ("worked_share", -1.0), ("easy_share", 2.0)]
)
def test_settings_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        CorpusSettings(**{field: value})
    with pytest.raises(ValueError, match="mixed_share \\+ code_share \\+ worked_share"):
        CorpusSettings(mixed_share=0.6, code_share=0.3, worked_share=0.2)
