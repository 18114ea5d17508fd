"""``format: chat`` (zerotir.tools.chat, zerotir.tools.formats.Chat): the prompt and the tool turn rendered by the
model's own chat template (a Qwen2.5-style one, built in the test), the calls parsed as hermes's, the data's chat
template giving the tools' schemas, and the settings refused at start with the setting and the fix named."""

from __future__ import annotations

import json

import pytest

from tests.rollout.chat_model import chat_bpe
from zerotir.config import ToolConfig
from zerotir.data.datamodule import PromptDataModule, build_prompts
from zerotir.tools.calculator import CalculatorTool
from zerotir.tools.chat import CHAT_TOOLS_SYSTEM_PROMPT, chat_prompt, tool_turn
from zerotir.tools.formats import Call, Chat, call_format, markers
from zerotir.toy.tokenizer import build_byte_tokenizer

CHAT = ToolConfig(format="chat", tools=[{"class_path": "calculator"}])
SCHEMAS = [CalculatorTool().schema()]


@pytest.fixture(scope="module")
def tok():
    return chat_bpe(SCHEMAS)


def test_the_prompt_is_the_template_with_the_tools_and_the_generation_prompt(tok):
    text = chat_prompt(tok, "Be brief.", "2*3?", SCHEMAS)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert json.dumps(SCHEMAS[0]) in text  # the template's tools block holds the schema as given
    assert text.endswith("<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                         "<args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\n2*3?<|im_end|>\n"
                         "<|im_start|>assistant\n")
    assert "# Tools" not in chat_prompt(tok, "Be brief.", "2*3?")  # no tools: the template's plain system turn


def test_the_tool_turn_is_what_the_template_writes_after_the_assistant_content(tok):
    assert tool_turn(tok, "6") == ("<|im_end|>\n<|im_start|>user\n<tool_response>\n6\n</tool_response><|im_end|>\n"
                                   "<|im_start|>assistant\n")
    fmt = call_format(CHAT, tok)
    assert isinstance(fmt, Chat) and fmt.render("a\nb") == tool_turn(tok, "a\nb")
    # The calls are hermes's, markers and parser (the filters count these blocks).
    assert (fmt.call_start, fmt.call_end) == ("<tool_call>", "</tool_call>")
    assert markers(CHAT) == ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
    assert fmt.parse('\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n') == \
        Call("calculator", {"expression": "1+1"})
    assert fmt.parse("{oops").error.startswith("the tool call is not valid JSON")


def test_a_tokenizer_without_a_chat_template_is_refused_naming_the_setting_and_the_fix():
    with pytest.raises(ValueError, match=r"model.tool.format: chat: .* has no chat template .* use an instruct or "
                                         r"thinking model .* or format: fences / hermes"):
        call_format(CHAT, build_byte_tokenizer())
    with pytest.raises(ValueError, match="model.tool.format: chat: the tokenizer has no chat template"):
        call_format(CHAT)


def test_a_template_that_does_not_write_tool_call_json_is_refused():
    tok = build_byte_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    for build in (lambda: Chat().bind(tok), lambda: build_prompts([{"id": "a", "problem": "1?", "answer": "1"}], "s",
                                                           "chat", tok, None, CHAT.tools, "chat")):
        with pytest.raises(ValueError, match="model.tool.format: chat parses <tool_call> JSON calls, and the chat "
                                             "template .* does not use them"):
            build()


def test_the_data_chat_template_shows_the_tools_of_model_tool(tok):
    rows = [{"id": "a", "problem": "2*3?", "answer": "6"}]
    kept, _ = build_prompts(rows, "s", "chat", tok, None, CHAT.tools, "chat")
    assert kept[0]["prompt_text"] == chat_prompt(tok, CHAT_TOOLS_SYSTEM_PROMPT, "2*3?", SCHEMAS)
    assert kept[0]["prompt_ids"] == tok(kept[0]["prompt_text"], add_special_tokens=False)["input_ids"]
    assert "```python" not in kept[0]["prompt_text"]  # the fences' system prompt is not used
    with pytest.raises(ValueError, match="model.tool.format: chat: .* has no chat template"):
        build_prompts(rows, "s", "chat", build_byte_tokenizer(), None, CHAT.tools, "chat")


def test_the_tools_need_the_chat_data_template():
    with pytest.raises(ValueError, match="model.tool.format: chat builds the prompts .* set data.template: chat"):
        PromptDataModule(template="orz_tool", tools=[{"class_path": "calculator"}], tool_format="chat")
