"""The code and output blocks of a response text, and its turns: what the trajectory filters count.

A response (``Trajectories.response_texts``: sampled and injected text) reads

    text ```python\\n code\\n``` \\n```output\\n result\\n```\\n text ```python ... ``` ... \\boxed{answer}

A code block opens at ``model.tool.code_start`` and closes at the next ``code_end``; an output block opens at the
marker before ``{output}`` in ``model.tool.output_template`` and closes at the marker after it (with ``format:
hermes``, the <tool_call> and <tool_response> blocks are the code and output blocks) (the tool loop injects
one after every executed block; a model may also write one itself). A turn is what the model wrote between two output
blocks: the first turn runs from the start, the last to the end.

These are string rules on the whole response, as the paper's code counts them (``code_count``,
``partial_code_count``, ``output_count``): an output that itself prints a fence would be miscounted, as there.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from zerotir.config import ToolConfig
from zerotir.rewards.verify import count_boxed, extract_boxed
from zerotir.tools.formats import markers


@dataclass(frozen=True)
class Markers:
    """The strings that open and close the blocks of a response (from ``model.tool``)."""

    code_start: str  # "```python"
    code_end: str  # "```"
    output_start: str  # "```output": the stripped text before {output} in the output template
    output_end: str  # "```": the stripped text after it ("" : an output block runs to the next code block)

    @classmethod
    def of(cls, tool: ToolConfig) -> Markers:
        """The markers of ``model.tool.format`` (``fences``: the ones above; ``hermes`` and ``chat``: <tool_call>
        and <tool_response>, whose blocks count as code and output blocks)."""
        return cls(*markers(tool))


@dataclass(frozen=True)
class BlockCounts:
    """How many code blocks a response opened and closed, and how many output blocks it holds."""

    opened: int
    closed: int
    outputs: int

    @property
    def agree(self) -> bool:
        """Every opened block closed and has its output, and no output lacks its block (the paper's code:
        ``code_count == output_count == partial_code_count``)."""
        return self.opened == self.closed == self.outputs


def _blocks(text: str, m: Markers) -> Iterator[tuple[str, int, int, bool]]:
    """``(kind, start, end, closed)`` of each block in order: kind "code" or "output", ``text[start:end]`` the block
    with its markers (an unclosed block runs to the end of the text)."""
    at = 0
    while True:
        code = text.find(m.code_start, at)
        output = text.find(m.output_start, at) if m.output_start else -1
        if code < 0 and output < 0:
            return
        is_code = output < 0 or 0 <= code < output
        start = code if is_code else output
        body = start + len(m.code_start if is_code else m.output_start)
        closer = m.code_end if is_code else m.output_end
        close = text.find(closer, body) if closer else text.find(m.code_start, body)
        if close < 0:
            yield ("code" if is_code else "output"), start, len(text), False
            return
        end = close + len(closer)
        yield ("code" if is_code else "output"), start, end, True
        at = end


def block_counts(text: str, m: Markers) -> BlockCounts:
    """The code blocks ``text`` opened and closed and its output blocks. Example: "```python\\nx\\n```" with no
    output block after it is (1, 1, 0): a block whose output is missing."""
    opened = closed = outputs = 0
    for kind, _, _, is_closed in _blocks(text, m):
        if kind == "code":
            opened += 1
            closed += is_closed
        else:
            outputs += 1
    return BlockCounts(opened, closed, outputs)


def turns(text: str, m: Markers) -> list[str]:
    """What the model wrote between the output blocks of ``text``: one string per turn (at least one)."""
    pieces, at = [], 0
    for kind, start, end, _ in _blocks(text, m):
        if kind == "output":
            pieces.append(text[at:start])
            at = end
    pieces.append(text[at:])
    return pieces


def has_closed_code(text: str, m: Markers) -> bool:
    """``text`` holds a code block that was closed."""
    return any(kind == "code" and closed for kind, _, _, closed in _blocks(text, m))


def valid_answer(text: str, truncated: bool) -> bool:
    """The response ended by itself (not ``truncated`` at the budget) with a last ``\\boxed{}`` that parses: the
    answer format the reward reads (``zerotir.rewards.verify.extract_boxed``)."""
    return not truncated and extract_boxed(text) is not None


def answer_count(text: str) -> int:
    """How many ``\\boxed`` answers ``text`` writes (``zerotir.rewards.verify.count_boxed``)."""
    return count_boxed(text)
