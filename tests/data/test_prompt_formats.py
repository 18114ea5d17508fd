"""The prompt describes the call format in use (``model.tool.format``, linked as ``data.tool_format``): under
``hermes`` the text templates and the data's chat template ask for ``<tool_call>`` JSON calls and list the tools,
never the fences' code blocks; under ``fences`` they are the paper's, unchanged."""

from __future__ import annotations

import json

import pytest

from zerotir.data.datamodule import PromptDataModule, build_prompts
from zerotir.data.prompts import render_prompt, render_prompts
from zerotir.tools.calculator import CalculatorTool
from zerotir.toy.tokenizer import build_byte_tokenizer

TOOLS = [{"class_path": "calculator"}, {"class_path": "python"}]
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture(scope="module")
def tok():
    tok = build_byte_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    return tok


@pytest.mark.parametrize("template", ["orz_tool", "chat"])
def test_hermes_prompts_describe_tool_call_json_and_the_tools_not_code_fences(template, tok):
    text = render_prompts(template, ["What is 2*3?"], tok, TOOLS, "hermes")[0]
    assert "```" not in text and "in a block that starts with" not in text  # nothing of the fences' instructions
    assert '<tool_call>{"name": <tool name>, "arguments": <JSON object>}</tool_call>' in text
    assert "<tool_response>" in text and "\\boxed{" in text and "What is 2*3?" in text
    assert json.dumps(CalculatorTool().schema()["function"]) in text  # each tool as its schema, by name
    assert '"name": "python"' in text


@pytest.mark.parametrize("template", ["orz_tool", "chat", "plain"])
def test_fences_prompts_are_the_templates_own(template, tok):
    assert render_prompts(template, ["2*3?"], tok, None, "fences") == [render_prompt(template, "2*3?", tok)]


def test_plain_mentions_no_tool_under_any_format(tok):
    assert render_prompts("plain", ["2*3?"], tok, TOOLS, "hermes") == [render_prompt("plain", "2*3?")]


def test_the_data_module_renders_the_format_it_is_given(tok):
    rows = [{"id": "a", "problem": "2*3?", "answer": "6"}]
    kept, _ = build_prompts(rows, "s", "orz_tool", tok, None, TOOLS, "hermes")
    assert "<tool_call>" in kept[0]["prompt_text"] and "```python" not in kept[0]["prompt_text"]
    with pytest.raises(ValueError, match="data.tools .* model.tool.format is 'fences'"):
        PromptDataModule(template="orz_tool", tools=TOOLS, tool_format="fences")
    with pytest.raises(ValueError, match="model.tool.format: chat builds the prompts .* set data.template: chat"):
        PromptDataModule(template="orz_tool", tools=TOOLS, tool_format="chat")
