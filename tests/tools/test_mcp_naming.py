"""The mcp tool's naming against a real server whose names are not the model's (tests/tools/named_mcp_server.py,
built with the SDK's ``MCPServer``): ``rename`` reaches it over stdio and over streamable HTTP (calls counted on the
server's side), ``include`` / ``exclude`` select, ``prefix`` renames them all, a name the server does not list is an
error naming the field, and the server's stderr goes to its log file, not the trainer's console."""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
import threading
from pathlib import Path

import pytest

from tests.rollout.scripted import ScriptedEngine, ScriptedSandbox
from tests.tools.named_mcp_server import STDERR_LINE, build
from zerotir.config import ToolConfig
from zerotir.rollout.agent_loop import rollout_sync
from zerotir.rollout.engine import SamplingParams
from zerotir.tools import Toolbox
from zerotir.tools.mcp_server import RUN_DIR_ENV
from zerotir.toy.tokenizer import build_byte_tokenizer

SERVER = str(Path(__file__).with_name("named_mcp_server.py"))
TOK = build_byte_tokenizer()
PROMPT = "Q: 6*7?\n"

pytestmark = pytest.mark.timeout(60)


OPEN: list[Toolbox] = []  # the toolboxes a test started (box_of), closed after it


@pytest.fixture(autouse=True)
def servers_stopped_after():
    yield
    while OPEN:
        OPEN.pop().close()


@pytest.fixture(scope="module")
def shared_calls(tmp_path_factory) -> Path:
    """The calls file of one stdio server that the tests of names and errors share (started once)."""
    return tmp_path_factory.mktemp("shared") / "calls.txt"


@pytest.fixture
def http_server(tmp_path):
    """The server's streamable HTTP app under uvicorn in a thread of this process, on a free loopback port bound
    before serving (no race for the port); its URL and calls file."""
    import uvicorn

    calls = tmp_path / "calls.txt"
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    server = uvicorn.Server(uvicorn.Config(build(str(calls)).streamable_http_app(), log_level="warning",
                                           timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/mcp", calls
    finally:  # the rollouts' toolboxes closed their sessions already: the server has no open stream to wait on
        server.should_exit = True
        thread.join(10)
        sock.close()


def entry(calls: Path | str, **init_args) -> dict:
    """The mcp entry of the server recording into ``calls`` (a URL: the server there)."""
    where = ({"url": calls} if str(calls).startswith("http://") else
             {"command": sys.executable, "args": [SERVER, str(calls)]})
    return {"class_path": "mcp", "init_args": {**where, "timeout": 20.0, **init_args}}


def box_of(*entries: dict) -> Toolbox:
    """A started toolbox of ``entries`` (closed after the test)."""
    box = Toolbox.build(ToolConfig(format="hermes", max_tool_calls=4, tools=list(entries)))
    box.start()
    OPEN.append(box)
    return box


def call(box: Toolbox, name: str, **arguments):
    return asyncio.run(box.call(name, arguments)).observation


def rollout_calling_calculator(tools: dict):
    """One rollout whose model writes ``calculator`` twice (the name it was trained on), then answers."""
    turns = ['<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>',
             '<tool_call>{"name": "calculator", "arguments": {"expression": "40+2"}}</tool_call>', "\\boxed{42}"]
    traj, _ = rollout_sync(ScriptedEngine(TOK, {PROMPT: [turns]}), TOK, ScriptedSandbox(),
                           [TOK.encode(PROMPT, add_special_tokens=False)],
                           SamplingParams(temperature=0.0, max_new_tokens=2048),
                           ToolConfig(format="hermes", max_tool_calls=4, tools=[tools]))
    return traj.tool_calls[0]


def test_rename_reaches_the_servers_tool_over_stdio(tmp_path):
    calls = tmp_path / "calls.txt"
    made = rollout_calling_calculator(entry(calls, rename={"calculate": "calculator"}))
    assert [(c.tool, c.status, c.output) for c in made] == [("calculator", "ok", "42"), ("calculator", "ok", "42")]
    assert calls.read_text().splitlines() == ["calculate", "calculate"]  # what the server received


def test_rename_reaches_the_servers_tool_over_streamable_http(http_server):
    url, calls = http_server
    made = rollout_calling_calculator(entry(url, rename={"calculate": "calculator"}))
    assert [(c.tool, c.status, c.output) for c in made] == [("calculator", "ok", "42"), ("calculator", "ok", "42")]
    assert calls.read_text().splitlines() == ["calculate", "calculate"]


def test_include_and_exclude_select_the_servers_tools(shared_calls):
    assert box_of(entry(shared_calls)).names == ["calculate", "lookup", "echo"]
    assert box_of(entry(shared_calls, include=["echo", "calculate"])).names == ["calculate", "echo"]
    box = box_of(entry(shared_calls, exclude=["lookup"]))
    assert box.names == ["calculate", "echo"]
    gone = call(box, "lookup", key="pi")
    assert gone.status == "invalid" and "there is no tool named 'lookup'" in gone.text


def test_prefix_names_every_tool_but_a_renamed_one_and_calls_reach_the_server(tmp_path):
    calls = tmp_path / "calls.txt"
    box = box_of(entry(calls, prefix="calc_", rename={"echo": "say"}), {"class_path": "calculator"})
    assert box.names == ["calc_calculate", "calc_lookup", "say", "calculator"]
    assert box.tools["calc_lookup"].description == "The value of a key."
    assert (call(box, "calc_lookup", key="pi").text, call(box, "say", text="hi").text) == ("3.14159", "hi")
    assert call(box, "calculator", expression="1+1").text == "2"  # the built-in beside them, its own name
    assert calls.read_text().splitlines() == ["lookup", "echo"]


@pytest.mark.parametrize(("init_args", "message"), [
    ({"include": ["calculator"]}, r"mcp init_args.include: 'calculator' is not a tool of the server .*; did you "
                                  r"mean 'calculate'\? \(its tools: calculate, lookup, echo"),
    ({"rename": {"calculator": "calc"}}, r"mcp init_args.rename: 'calculator' is not a tool .* did you mean "
                                         r"'calculate'"),
    ({"exclude": ["nothing_alike"]}, r"mcp init_args.exclude: 'nothing_alike' is not a tool of the server "
                                     r"command=.* \(its tools: calculate, lookup, echo; use the server's names\)"),
    ({"include": ["echo"], "exclude": ["lookup"]}, r"set one of include .* and exclude .*, not both"),
    ({"include": []}, r"mcp init_args.include .* is empty"),
    ({"exclude": ["echo"], "rename": {"echo": "say"}}, r"rename: 'echo' renamed but not kept"),
])
def test_a_name_the_server_does_not_list_is_an_error_naming_the_field(shared_calls, init_args, message):
    with pytest.raises(ValueError, match=message):
        box_of(entry(shared_calls, **init_args))


def test_the_servers_stderr_goes_to_the_log_file_in_the_run_folder_not_the_console(tmp_path, monkeypatch, capfd,
                                                                                   caplog):
    monkeypatch.setenv(RUN_DIR_ENV, str(tmp_path / "run"))
    with caplog.at_level(logging.INFO, logger="zerotir.tools.mcp_server"):
        box = box_of(entry(tmp_path / "calls.txt"))
    assert [call(box, "echo", text=str(i)).text for i in range(3)] == ["0", "1", "2"]
    box.close()  # the server process ends: all it wrote is in the file
    logs = list((tmp_path / "run" / "mcp").glob("named_mcp_server-*.log"))
    assert len(logs) == 1
    assert logs[0].read_text().count(STDERR_LINE.format(tool="echo")) == 3
    out, err = capfd.readouterr()
    assert "named-server log" not in out + err
    said = [r.getMessage() for r in caplog.records if str(logs[0]) in r.getMessage()]
    assert len(said) == 1 and "writes its stderr to" in said[0]
