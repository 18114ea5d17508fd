"""``model.tool.chat_template_kwargs`` reaches every ``apply_chat_template`` zerotir makes: the data's ``chat``
prompt under every format and the ``chat`` format's tool turn in the tool loop, tested with a template that reads
the keyword as Qwen3's does (``enable_thinking`` false: the assistant turn opens with an empty think block). A key
the template never reads, one zerotir sets itself, or the setting with a template that applies no chat template is
refused, naming the setting and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.rollout.chat_model import QWEN3_TEMPLATE, QWEN25_TEMPLATE, call
from tests.rollout.test_agent_loop_bpe import TurnEngine
from zerotir.cli.app import ZeroTIRCLI
from zerotir.config import ToolConfig
from zerotir.data.datamodule import PromptDataModule, build_prompts
from zerotir.rollout.agent_loop import Schedule, rollout_sync
from zerotir.rollout.engine import SamplingParams
from zerotir.tools.formats import call_format
from zerotir.toy.tokenizer import build_byte_tokenizer

REPO = Path(__file__).resolve().parents[2]
NO_THINKING = {"enable_thinking": False}
OPEN = "<|im_start|>assistant\n"
ROWS = [{"id": "a", "problem": "2*3?", "answer": "6"}]
CALCULATOR = [{"class_path": "calculator"}]


@pytest.fixture(scope="module")
def tok():
    tok = build_byte_tokenizer()
    tok.chat_template = QWEN3_TEMPLATE
    return tok


@pytest.mark.parametrize("tool_format,tools", [("fences", None), ("hermes", CALCULATOR), ("chat", CALCULATOR)])
def test_the_data_chat_prompt_gets_the_kwargs_under_every_format(tok, tool_format, tools):
    text = build_prompts(ROWS, "s", "chat", tok, None, tools, tool_format, NO_THINKING)[0][0]["prompt_text"]
    assert text.endswith(OPEN + "<think>\n\n</think>\n\n")  # Qwen3's non-thinking turn
    thinking = build_prompts(ROWS, "s", "chat", tok, None, tools, tool_format)[0][0]["prompt_text"]
    assert thinking.endswith(OPEN) and text == thinking + "<think>\n\n</think>\n\n"  # nothing else changes


def test_the_chat_formats_tool_turn_in_the_loop_gets_the_kwargs(tok):
    tool = ToolConfig(format="chat", tools=CALCULATOR, chat_template_kwargs=NO_THINKING)
    assert call_format(tool, tok).render("6").endswith(OPEN + "<think>\n\n</think>\n\n")
    prompt = build_prompts(ROWS, "s", "chat", tok, None, CALCULATOR, "chat", NO_THINKING)[0][0]["prompt_ids"]
    engine = TurnEngine(tok, ["Let me compute.\n" + call("calculator", expression="2*3"), "So \\boxed{6}."])
    traj, _ = rollout_sync(engine, tok, None, [prompt], SamplingParams(temperature=0.0, max_new_tokens=600), tool,
                           None, Schedule("lockstep"))
    assert [(c.tool, c.output) for c in traj.tool_calls[0]] == [("calculator", "6")]
    assert traj.response_texts[0].endswith("</tool_response><|im_end|>\n" + OPEN + "<think>\n\n</think>\n\n"
                                           "So \\boxed{6}.")  # the injected tool turn opened a non-thinking turn


def test_kwargs_that_cannot_apply_are_refused_naming_the_setting(tok):
    qwen25 = build_byte_tokenizer()
    qwen25.chat_template = QWEN25_TEMPLATE
    with pytest.raises(ValueError, match=r"model.tool.chat_template_kwargs.thinking_budget: the chat template of .* "
                                         r"never reads 'thinking_budget'"):
        build_prompts(ROWS, "s", "chat", tok, None, None, "fences", {"thinking_budget": 5})
    with pytest.raises(ValueError, match=r"model.tool.chat_template_kwargs.enable_thinking: the chat template"):
        call_format(ToolConfig(format="chat", tools=CALCULATOR, chat_template_kwargs=NO_THINKING),
                    qwen25)  # a template without the keyword: the tool turn would not change
    with pytest.raises(ValueError, match=r"model.tool.chat_template_kwargs.tools: zerotir sets tools itself"):
        build_prompts(ROWS, "s", "chat", tok, None, None, "fences", {"tools": []})
    with pytest.raises(ValueError, match=r"model.tool.chat_template_kwargs=\{'enable_thinking': False\} with "
                                         r"data.template 'orz_tool', which applies no chat template"):
        PromptDataModule(template="orz_tool", chat_template_kwargs=NO_THINKING)


def test_the_command_line_links_the_kwargs_to_the_data(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    cli = ZeroTIRCLI(args=["--config", str(REPO / "configs" / "tiny_cpu_ppo.yaml"), "--model.base.path",
                           str(tiny_dir), "--toy_base", "null", "--trainer.default_root_dir", str(tmp_path),
                           "--data.template", "chat", "--model.tool.chat_template_kwargs", "{enable_thinking: false}"],
                     run=False)
    assert cli.model.tool.chat_template_kwargs == cli.datamodule.chat_template_kwargs == NO_THINKING
