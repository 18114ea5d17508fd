"""``FormatWatch``: a step whose responses wrote their calls in the other format than ``model.tool.format`` warns
once, naming the format to set; a step with a call in the configured format, or without the other's markers, does
not."""

from __future__ import annotations

import logging

import torch

from zerotir.config import ToolConfig
from zerotir.tools.formats import FormatWatch

HERMES = ToolConfig(format="hermes", tools=[{"class_path": "python"}])
FENCED = "Let me compute.\n```python\nprint(2 + 2)\n```\n"


def test_fenced_calls_under_hermes_warn_once_naming_the_format_to_set(caplog):
    watch = FormatWatch(HERMES)
    with caplog.at_level(logging.WARNING, logger="zerotir.tools.formats"):
        said = watch.update(3, [FENCED, "no call", FENCED], torch.tensor([0, 0, 0]))
        assert watch.update(4, [FENCED], torch.tensor([0])) is None  # once per run
    assert caplog.messages == [said]
    assert said.startswith("RL step 3: no response called a tool in model.tool.format=hermes, but 2 of 3 wrote "
                           "'```python', a call of the fences format")
    assert "--model.tool.format fences" in said


def test_hermes_calls_under_fences_warn_too():
    said = FormatWatch(ToolConfig()).update(1, ['<tool_call>{"name": "python"}</tool_call>'], torch.tensor([0]))
    assert said is not None and "model.tool.format=fences" in said and "--model.tool.format hermes" in said


def test_no_warning_with_a_call_in_the_format_or_without_the_others_markers():
    assert FormatWatch(HERMES).update(1, [FENCED, "x"], torch.tensor([0, 1])) is None  # the format's calls ran
    assert FormatWatch(HERMES).update(1, ["the answer is \\boxed{4}"], torch.tensor([0])) is None
    no_tools = ToolConfig(format="hermes", max_tool_calls=0, tools=[{"class_path": "python"}])
    assert FormatWatch(no_tools).update(1, [FENCED], torch.tensor([0])) is None
