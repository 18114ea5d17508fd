"""The block counts, turns and answer format of a response text, on hand-written responses."""

from __future__ import annotations

from zerotir.config import ToolConfig
from zerotir.filters.blocks import Markers, block_counts, has_closed_code, turns, valid_answer

M = Markers.of(ToolConfig())  # ```python / ``` ; ```output / ```
RAN = "```python\nprint(1+1)\n```\n```output\n2\n```\n"  # an executed block and its injected output


def test_the_markers_come_from_the_tool_group():
    assert M == Markers("```python", "```", "```output", "```")
    bare = Markers.of(ToolConfig(output_template="<out>{output}"))
    assert bare.output_start == "<out>" and bare.output_end == ""


def test_an_executed_block_and_its_output_agree():
    counts = block_counts(RAN + "so \\boxed{2}", M)
    assert (counts.opened, counts.closed, counts.outputs) == (1, 1, 1) and counts.agree


def test_a_block_whose_output_is_missing_disagrees():
    # Two blocks written, the second after the call budget was spent: never run, no output block -> (2, 2, 1).
    counts = block_counts(RAN + "check:\n```python\nprint(2)\n```\n\\boxed{2}", M)
    assert (counts.opened, counts.closed, counts.outputs) == (2, 2, 1) and not counts.agree


def test_an_unclosed_block_and_a_written_output_disagree():
    cut = block_counts("```python\nwhile True:\n    pass", M)  # cut inside the block: opened 1, closed 0
    assert (cut.opened, cut.closed, cut.outputs) == (1, 0, 0) and not cut.agree
    invented = block_counts("```output\n42\n```\n\\boxed{42}", M)  # an output the model wrote itself: (0, 0, 1)
    assert (invented.opened, invented.closed, invented.outputs) == (0, 0, 1) and not invented.agree


def test_an_output_block_without_a_closing_marker_runs_to_the_next_block():
    bare = Markers.of(ToolConfig(output_template="\n<out>{output}\n"))
    text = "```python\nprint(1)\n```\n<out>1\n```python\nprint(2)\n```\n<out>2\n\\boxed{2}"
    counts = block_counts(text, bare)
    assert (counts.opened, counts.closed, counts.outputs) == (2, 2, 2)
    assert turns(text, bare) == ["```python\nprint(1)\n```\n", "```python\nprint(2)\n```\n", ""]


def test_turns_are_the_text_between_output_blocks():
    assert turns(RAN + "I am not sure.", M) == ["```python\nprint(1+1)\n```\n", "\nI am not sure."]
    assert turns("just text", M) == ["just text"]
    assert has_closed_code(RAN, M) and not has_closed_code("```python\nx = 1", M)


def test_a_valid_answer_ends_by_itself_with_a_last_boxed_that_parses():
    assert valid_answer("so \\boxed{2}", truncated=False)
    assert not valid_answer("so \\boxed{2}", truncated=True)  # cut at the budget
    assert not valid_answer("so \\boxed{2", truncated=False)  # an unclosed box
    assert not valid_answer("no answer", truncated=False)
