"""The worked examples of docs/extending.md, as written there: the tool (its file and its config entry) and the call
format, each in the tool loop."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from tests.rollout.scripted import ScriptedEngine, ScriptedSandbox
from tests.rollout.test_agent_loop_bpe import TurnEngine
from zerotir.config import ToolConfig
from zerotir.rollout import agent_loop
from zerotir.rollout.agent_loop import Schedule, rollout_sync
from zerotir.rollout.engine import SamplingParams
from zerotir.toy.tokenizer import build_byte_tokenizer

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"
TOK = build_byte_tokenizer()
PROMPT = "Q: days from 2024-01-01 to 2024-03-01?\n"


def block(marker: str) -> str:
    """The fenced block right after ``<!-- extending:<marker> -->`` in the doc."""
    found = re.search(rf"<!-- extending:{marker} -->\n```\w+\n(.*?)\n```", DOC.read_text(), re.S)
    assert found, f"docs/extending.md has no block marked extending:{marker}"
    return found.group(1)


def test_the_example_tool_is_one_file_and_one_config_entry(tmp_path, monkeypatch):
    (tmp_path / "my_tools").mkdir()
    (tmp_path / "my_tools" / "days.py").write_text(block("tool") + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    tool = ToolConfig(**yaml.safe_load(block("config"))["model"]["tool"])
    call = '<tool_call>{"name": "days_between", "arguments": {"start": "2024-01-01", "end": "2024-03-01"}}</tool_call>'
    bad = '<tool_call>{"name": "days_between", "arguments": {"start": "2024-02-30", "end": "2024-03-01"}}</tool_call>'
    engine = ScriptedEngine(TOK, {PROMPT: [[call, bad, "\\boxed{60}"]]})
    traj, _ = rollout_sync(engine, TOK, ScriptedSandbox(), [TOK.encode(PROMPT, add_special_tokens=False)],
                           SamplingParams(temperature=0.0, max_new_tokens=1024), tool)
    calls = traj.tool_calls[0]
    assert [(c.tool, c.status) for c in calls] == [("days_between", "ok"), ("days_between", "error")]
    assert calls[0].output == "60" and calls[1].output.startswith("Error: day is out of range")
    assert traj.response_texts[0].startswith(call + "\n<tool_response>\n60\n</tool_response>\n")


def tagged_bpe() -> PreTrainedTokenizerFast:
    """A byte-level BPE trained, without pre-splitting, on transcripts of the doc's format: merges cross its markers."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [f"Q: {a}*{b}?\nLet me compute <calc>{a}*{b}</calc><result>{a * b}</result>\n" for a in range(10)
              for b in range(10)] * 5
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>", "<eos>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>")


def test_the_example_format_calls_in_the_tool_loop_with_merges_across_its_markers(tmp_path, monkeypatch):
    (tmp_path / "my_formats.py").write_text(block("format") + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from my_formats import Tagged

    tool = ToolConfig(**yaml.safe_load(block("format-config"))["model"]["tool"])  # the doc's entry, nothing else
    tok = tagged_bpe()
    engine = TurnEngine(tok, ["Let me compute <calc>2*3</calc><result>", "\nSo \\boxed{6}."])
    prompt = tok.encode("Q: 2*3?\n", add_special_tokens=False)
    traj, _ = rollout_sync(engine, tok, None, [prompt], SamplingParams(temperature=0.0, max_new_tokens=256),
                           tool, None, Schedule("lockstep"))
    closing = tok.decode(engine.emitted[1][-1:])
    assert closing.endswith("</calc><result>"), closing  # one token: the stop and the output's opening after it
    assert [(c.tool, c.status, c.output) for c in traj.tool_calls[0]] == [("calculator", "ok", "6")]
    start, length = int(traj.prompt_lens[0]), int(traj.response_lens[0])
    response = traj.input_ids[0, start:start + length].tolist()
    action = traj.action_mask[0, start:start + length].tolist()
    assert [t for t, a in zip(response, action) if a] == [t for seg in engine.emitted for t in seg]  # token-out
    assert tok.decode(response, skip_special_tokens=True) == \
        "Let me compute <calc>2*3</calc><result>6</result>\nSo \\boxed{6}."  # the opening the model wrote kept once
    with pytest.raises(ValueError, match="tagged calls the calculator tool"):
        ToolConfig(**{**tool.__dict__, "tools": [{"class_path": "python"}]})  # refused when the group is built
    assert isinstance(agent_loop.call_format(tool), Tagged)
