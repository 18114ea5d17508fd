"""String rules of a tool call (zerotir.rollout.tool_block)."""

from __future__ import annotations

import pytest

from sandbox import ExecResult, ExecStatus
from zerotir.rollout.tool_block import (
    code_after_start, code_before_end, open_block_head, status_of,
    injection_text, straddling_stop, text_after_end,
)
from zerotir.tools.python import failed_call_result
from zerotir.toy.tokenizer import build_byte_tokenizer

TOK = build_byte_tokenizer()


def ids(text: str) -> list[int]:
    return TOK.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("prompt, head", [
    ("Solve.\n```python\nx = 1\n", "\nx = 1\n"),
    ("Solve.\n```python", ""),
    ("Example: ```python\nprint(1)\n``` then solve.", None),  # a closed block does not count
    ("No code here.", None),
])
def test_open_block_head(prompt, head):
    assert open_block_head(prompt, "```python", "```") == head


def test_code_extraction():
    assert code_after_start("Let me see.\n```python\nprint(1)\n", "```python") == "\nprint(1)\n"
    assert code_before_end("\nprint(1)\n```\nmore", "```") == "\nprint(1)\n"
    assert code_before_end("\nprint(1)\n", "```") == "\nprint(1)\n"
    with pytest.raises(ValueError, match="not found"):
        code_after_start("no fence", "```python")


def test_straddling_stop_finds_a_stop_split_by_a_call_boundary():
    seq = ids("abc```python\nprint")
    # The first call produced "abc```py", the second "thon\nprint": the stop ends at "n", 12 tokens in.
    assert straddling_stop(TOK, seq, 0, 8, ["```python"]) == (12, "```python")
    # A stop complete before the boundary is not this call's; one wholly after it is where the engine stopped.
    assert straddling_stop(TOK, seq, 0, 13, ["```python"]) is None
    assert straddling_stop(TOK, ids("abc```python"), 0, 2, ["```python"]) == (12, "```python")
    assert straddling_stop(TOK, ids("abc```pyth"), 0, 8, ["```python"]) is None  # not complete yet
    # Only the current mode's text counts: a stop before ``start`` is ignored.
    assert straddling_stop(TOK, ids("``` x"), 3, 4, ["```"]) is None


def test_status_and_a_failed_call():
    result = ExecResult(ExecStatus.TIMEOUT, "", "", 5.0)
    assert status_of(result) == "timeout"
    failed = failed_call_result(ConnectionError("refused"))
    assert status_of(failed) == "sandbox_error" and "refused" in failed.stderr


def test_the_text_after_the_closing_fence_in_its_token_is_kept_and_only_the_rest_of_the_block_injected():
    block = "\n```output\n5\n```\n"
    assert text_after_end("\nprint(5)\n```\n```output\n", "```") == "\n```output\n"
    assert text_after_end("\nprint(5)\n```", "```") == ""
    assert injection_text(block, "") == block
    assert injection_text(block, "\n```output\n") == "5\n```\n"  # the model began the block: the rest of it
    assert injection_text(block, "\n```out") == "put\n5\n```\n"
    assert injection_text(block, "\n\n") == block  # any other tail stays, and the whole block follows it
