"""A toolbox's life (zerotir.tools.registry.Toolbox): its tools started once, in order, before the first call and
closed once, in reverse, at the end; a tool that fails to start closes those started before it; nothing is called
before start. The python tool owns its sandbox: it starts or reaches one at start (failing fast with the sandbox's
message), and an observation is capped once, at ``model.tool.max_output_chars``, by the toolbox alone."""

from __future__ import annotations

import asyncio
import socket

import pytest

from sandbox import SandboxUnavailable
from sandbox.result import truncate_middle
from tests.rollout.scripted import ScriptedEngine, ScriptedSandbox, ok
from zerotir.config import SandboxConfig, ToolConfig
from zerotir.rollout.agent_loop import rollout_sync
from zerotir.rollout.engine import SamplingParams
from zerotir.tools import Observation, Tool, Toolbox
from zerotir.toy.tokenizer import build_byte_tokenizer


class Recorded(Tool):
    """A tool recording its life in ``log`` as ``(name, event)``; ``fails`` makes its start raise."""

    def __init__(self, name: str, log: list, fails: bool = False):
        self.name, self.log, self.fails = name, log, fails

    def start(self) -> None:
        self.log.append((self.name, "start"))
        if self.fails:
            raise ValueError(f"{self.name} cannot start")

    def close(self) -> None:
        self.log.append((self.name, "close"))

    async def call(self, arguments):
        self.log.append((self.name, "call"))
        return Observation("done")


def test_tools_start_once_in_order_and_close_once_in_reverse():
    log: list = []
    box = Toolbox([Recorded("a", log), Recorded("b", log)], max_chars=100)
    with pytest.raises(RuntimeError, match=r"not started: call Toolbox.start\(\) once before the first rollout"):
        asyncio.run(box.call("a", {}))
    assert log == []  # nothing started or called before start
    box.start()
    box.start()  # idempotent: a second start starts nothing again
    assert asyncio.run(box.call("b", {})).observation.text == "done"
    box.close()
    box.close()
    assert log == [("a", "start"), ("b", "start"), ("b", "call"), ("b", "close"), ("a", "close")]


def test_a_tool_that_fails_to_start_closes_those_started_before_it():
    log: list = []
    box = Toolbox([Recorded("a", log), Recorded("b", log, fails=True), Recorded("c", log)], max_chars=100)
    with pytest.raises(ValueError, match="b cannot start"):
        box.start()
    assert log == [("a", "start"), ("b", "start"), ("a", "close")] and not box.started
    box.close()  # nothing more to close
    assert log[-1] == ("a", "close") and len(log) == 3


def test_the_python_tool_fails_fast_when_its_sandbox_urls_point_nowhere():
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))  # bound, never listening: refused at once
        url = f"http://127.0.0.1:{free.getsockname()[1]}"
        box = Toolbox.build(ToolConfig(sandbox=SandboxConfig(urls=[url], retries=0)))
        with pytest.raises(SandboxUnavailable, match=rf"{url}.*python -m sandbox serve"):
            box.start()
    assert not box.started


def test_an_over_long_python_output_is_capped_once_at_max_output_chars():
    """The sandbox's 5000 characters reach the model as the toolbox's one cut at 2000 (head, marker naming the whole
    length, tail): not cut before it by the tool (whose sandbox formatting bounds at 1024 by default), nor after it by
    the loop."""
    tok, prompt = build_byte_tokenizer(), "Q: digits?\n"
    stdout = "".join(str(i % 10) for i in range(5000))
    code, tool = "\nprint(digits)\n", ToolConfig(max_output_chars=2000, max_output_tokens=None)
    turns = ["```python" + code + "```", "\\boxed{1}"]
    traj, _ = rollout_sync(ScriptedEngine(tok, {prompt: [turns]}), tok, ScriptedSandbox({code: ok(stdout)}),
                           [tok.encode(prompt, add_special_tokens=False)],
                           SamplingParams(temperature=0.0, max_new_tokens=8192), tool)
    seen = traj.tool_calls[0][0].output
    assert seen == truncate_middle(stdout, 2000) and len(seen) == 2000
    assert "5000 characters in all" in seen
