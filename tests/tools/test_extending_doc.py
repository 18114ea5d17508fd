"""The worked example tool of docs/extending.md, as written there: its file and its config entry, in a rollout."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tests.rollout.scripted import ScriptedEngine, ScriptedSandbox
from zerotir.config import ToolConfig
from zerotir.rollout.agent_loop import rollout_sync
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
