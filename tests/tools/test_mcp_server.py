"""The mcp tool against a tiny MCP server (tests/tools/tiny_mcp_server.py) that the test starts over stdio, and over
streamable HTTP on a free loopback port: the real protocol through the mcp SDK. Its tools are listed at start, each a tool of its own with the server's schema; a call
past its timeout and a server killed mid-run give error observations, never a hang, and the rollout goes on."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.rollout.scripted import ScriptedEngine, ScriptedSandbox
from tests.tools.test_extending_doc import block
from zerotir.config import ToolConfig
from zerotir.rollout.agent_loop import rollout_sync
from zerotir.rollout.engine import SamplingParams
from zerotir.tools import Toolbox
from zerotir.tools.stats import tool_metrics
from zerotir.toy.tokenizer import build_byte_tokenizer

SERVER = str(Path(__file__).with_name("tiny_mcp_server.py"))
TOK = build_byte_tokenizer()
PROMPT = "Q: 2+3?\n"

pytestmark = pytest.mark.timeout(60)  # what this guards against is a hang


@pytest.fixture
def opened():
    """Builds and starts a toolbox (its servers connected); every one is closed after the test (its servers
    ended), as a source closes its toolbox."""
    boxes: list[Toolbox] = []

    def open_box(tool: ToolConfig) -> Toolbox:
        box = Toolbox.build(tool)
        boxes.append(box)
        box.start()
        return box

    yield open_box
    for box in boxes:
        box.close()


@pytest.fixture
def http_server():
    """The tiny server over streamable HTTP in a process of its own; its URL (the port it bound and printed)."""
    process = subprocess.Popen([sys.executable, SERVER, "http"], stdout=subprocess.PIPE, text=True)
    try:
        yield f"http://127.0.0.1:{int(process.stdout.readline())}/mcp"
    finally:
        process.kill()
        process.wait()


def config(instance: str, timeout: float = 20.0) -> ToolConfig:
    """A hermes config with the server's tools; ``instance`` (an argument the server ignores) makes a server of
    the test's own, as servers are shared per command and arguments in a process; an ``http://`` instance is the
    URL of a server over streamable HTTP."""
    where = ({"url": instance} if instance.startswith("http://") else
             {"command": sys.executable, "args": [SERVER, instance]})
    return ToolConfig(format="hermes", max_tool_calls=4, tools=[
        {"class_path": "calculator"}, {"class_path": "mcp", "init_args": {**where, "timeout": timeout}}])


def call(box: Toolbox, name: str, **arguments):
    return asyncio.run(box.call(name, arguments)).observation


def test_the_servers_tools_are_listed_with_their_schemas_and_called(opened):
    box = opened(config("listed"))
    assert box.names == ["calculator", "add", "wait", "die", "refuse"]
    add = box.tools["add"]
    assert add.description == "Add two integers." and add.parameters["required"] == ["a", "b"]
    other = opened(config("listed"))  # another source's toolbox: a session of its own, closed with it
    server = other.tools["add"].server
    assert server is not add.server and server.alive
    other.close()
    assert not server.alive and add.server.alive
    assert (call(box, "add", a=2, b=3).text, call(box, "add", a=2, b=3).status) == ("5", "ok")
    off = call(box, "add", a="two", b=3)  # the server's schema says integer: refused before the server sees it
    assert off.status == "invalid" and "'two' is not of type 'integer'" in off.text


def test_a_call_the_server_answers_as_an_error_is_an_error_observation_counted_in_errors():
    turns = ['<tool_call>{"name": "refuse", "arguments": {"reason": "no"}}</tool_call>',
             '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>', "\\boxed{5}"]
    traj, _ = rollout_sync(ScriptedEngine(TOK, {PROMPT: [turns]}), TOK, ScriptedSandbox(),
                           [TOK.encode(PROMPT, add_special_tokens=False)],
                           SamplingParams(temperature=0.0, max_new_tokens=2048), config("refusing"))
    refused = traj.tool_calls[0][0]
    assert (refused.tool, refused.status) == ("refuse", "error") and "refuse" in refused.output
    assert traj.num_exec_errors.tolist() == [1] and traj.num_tool_errors.tolist() == [0]  # the call's, not the tool's
    metrics = tool_metrics(traj.tool_calls)
    assert (metrics["tools/refuse/errors"], metrics["tools/refuse/failures"]) == (1.0, 0.0)
    assert (metrics["tools/add/errors"], metrics["tools/add/calls"]) == (0.0, 1.0)


def test_a_call_past_its_timeout_is_a_timeout_observation(opened):
    box = opened(config("slow", timeout=0.5))
    late = call(box, "wait", seconds=30)
    assert late.status == "timeout" and "did not answer within 0.5 s" in late.text


def test_over_http_the_tools_are_listed_called_and_timed_out(http_server, opened):
    """The entry of docs/extending.md as written, pointed at the test's server, with a shorter timeout."""
    tool = yaml.safe_load(block("mcp-http"))["model"]["tool"]
    tool["tools"][1]["init_args"].update(url=http_server, timeout=2.0)
    box = opened(ToolConfig(**tool))
    assert box.names == ["calculator", "add", "wait", "die", "refuse"]
    assert box.tools["add"].parameters["required"] == ["a", "b"]
    assert (call(box, "add", a=2, b=3).text, call(box, "add", a=40, b=2).text) == ("5", "42")
    late = call(box, "wait", seconds=30)
    assert late.status == "timeout" and "did not answer within 2.0 s" in late.text
    assert call(box, "add", a=1, b=2).text == "3"  # the session outlives a call that timed out


@pytest.mark.parametrize("entry", [{"url": "http://127.0.0.1:9/mcp", "command": "python"}, {}])
def test_exactly_one_of_command_and_url_is_set(entry):
    with pytest.raises(ValueError, match="set exactly one of command .* and url"):
        Toolbox.build(ToolConfig(format="hermes", tools=[{"class_path": "mcp", "init_args": entry}]))


def test_a_url_with_the_settings_of_a_stdio_server_is_an_error():
    with pytest.raises(ValueError, match="args, env and log_file belong to a stdio server .* drop them"):
        Toolbox.build(ToolConfig(format="hermes", tools=[{"class_path": "mcp", "init_args": {
            "url": "http://127.0.0.1:9/mcp", "args": ["server.py"]}}]))


def test_a_url_where_no_server_answers_is_an_error_at_start():
    free = socket.socket()
    free.bind(("127.0.0.1", 0))  # bound, never listening: a refused connection, not a hang
    with free, pytest.raises(ValueError, match=r"mcp init_args.url='http://127.0.0.1:\d+/mcp': the server did not"):
        Toolbox.build(config(f"http://127.0.0.1:{free.getsockname()[1]}/mcp", timeout=2.0)).start()


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_a_server_killed_mid_run_gives_error_observations_and_the_rollout_goes_on(transport, request):
    turns = ['<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>',
             '<tool_call>{"name": "die", "arguments": {}}</tool_call>',
             '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 1}}</tool_call>',
             '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>',
             "\\boxed{5}"]
    engine = ScriptedEngine(TOK, {PROMPT: [turns]})
    server = request.getfixturevalue("http_server") if transport == "http" else "killed"
    traj, _ = rollout_sync(engine, TOK, ScriptedSandbox(), [TOK.encode(PROMPT, add_special_tokens=False)],
                           SamplingParams(temperature=0.0, max_new_tokens=2048), config(server, timeout=10.0))
    calls = traj.tool_calls[0]
    assert [(c.tool, c.status) for c in calls] == [("add", "ok"), ("die", "tool_error"), ("add", "tool_error"),
                                                   ("calculator", "ok")]
    assert "is unavailable" in calls[2].output and traj.num_tool_errors.tolist() == [2]
    assert traj.num_sandbox_errors.tolist() == [0]  # a tool's failure is not the sandbox's
    metrics = tool_metrics(traj.tool_calls)  # what TensorBoard shows: half of add's calls failed, die's all
    assert (metrics["tools/add/failures"], metrics["tools/die/failures"]) == (0.5, 1.0)
    assert traj.response_texts[0].endswith("\\boxed{5}") and traj.finish_reasons == ["stop"]
    assert json.loads(calls[0].code) == {"name": "add", "arguments": {"a": 2, "b": 3}}
