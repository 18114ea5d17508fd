"""The tools of a run (zerotir.tools.registry) and the call formats (zerotir.tools.formats): building from
``model.tool.tools``, one call checked against its schema, the errors the model reads, the settings refused."""

from __future__ import annotations

import asyncio

import pytest

from tests.rollout.scripted import ScriptedSandbox, ok
from zerotir.config import ToolConfig
from zerotir.tools import Observation, Tool, Toolbox
from zerotir.tools.formats import Call, Hermes, call_format

HERMES = ToolConfig(format="hermes", tools=[{"class_path": "python"}, {"class_path": "calculator"}],
                    max_output_chars=100)


class Boom(Tool):
    name = "boom"
    parameters = {"type": "object"}

    async def call(self, arguments):
        raise RuntimeError("kaput")


class Long(Tool):
    name = "long"

    async def call(self, arguments):
        return Observation("x" * 500)


class LongError(Tool):
    """A tool whose answer is a long error with metrics: capping must keep both."""

    name = "long_error"

    async def call(self, arguments):
        return Observation("Error: " + "y" * 500, "error", {"passages": 3.0})


def call(box: Toolbox, name: str, arguments: dict):
    return asyncio.run(box.call(name, arguments))


def started(box: Toolbox) -> Toolbox:
    box.start()
    return box


def test_built_in_names_and_dotted_paths_build_bound_tools():
    sandbox = ScriptedSandbox(default=ok("4\n"))
    box = started(Toolbox.build(HERMES, sandbox))
    assert box.names == ["python", "calculator"]
    assert [s["function"]["name"] for s in box.schemas()] == ["python", "calculator"]
    used = call(box, "python", {"code": "print(2+2)"})
    assert (used.tool, used.observation.text, used.observation.status) == ("python", "4", "ok")
    assert sandbox.codes == ["print(2+2)"] and sandbox.timeouts == [5.0]
    own = started(Toolbox.build(ToolConfig(format="hermes", tools=[{"class_path": "tests.tools.test_registry.Long"}])))
    assert call(own, "long", {}).observation.text.startswith("xxx")
    assert Toolbox.build(ToolConfig(max_tool_calls=0)).names == []  # no tools: nothing built, no sandbox needed


def test_bad_calls_are_invalid_observations_that_name_the_problem():
    box = started(Toolbox.build(HERMES, ScriptedSandbox(default=ok(""))))
    unknown = call(box, "shell", {"cmd": "ls"}).observation
    assert unknown.status == "invalid" and "no tool named 'shell'" in unknown.text
    assert "the tools are: python, calculator" in unknown.text
    off = call(box, "calculator", {"expr": "1+1"}).observation
    assert off.status == "invalid" and "'expression' is a required property" in off.text
    typed = call(box, "python", {"code": 3}).observation
    assert typed.status == "invalid" and "code: 3 is not of type 'string'" in typed.text
    unparsed = asyncio.run(box.run(Call("", {}, "the tool call is not valid JSON")))
    assert unparsed.tool == "" and unparsed.observation.status == "invalid"


def test_a_tool_that_raises_is_a_tool_error_and_long_text_is_capped():
    box = started(Toolbox([Boom(), Long()], max_chars=100))
    failed = call(box, "boom", {}).observation
    assert failed.status == "tool_error" and "RuntimeError: kaput" in failed.text
    capped = call(box, "long", {}).observation.text
    assert len(capped) <= 100 and "500 characters in all" in capped


def test_a_capped_observation_keeps_its_status_and_metrics():
    capped = call(started(Toolbox([LongError()], max_chars=100)), "long_error", {}).observation
    assert len(capped.text) <= 100 and "507 characters in all" in capped.text  # it was cut
    assert capped.status == "error" and capped.metrics == {"passages": 3.0}  # a long error stays an error


@pytest.mark.parametrize("entry, says", [
    ({"class_path": "nope"}, "not a built-in tool"),
    ({"class_path": "calculater"}, r"not a built-in tool .*module.Class \(did you mean 'calculator'\?\)"),
    ({"class_path": "zerotir.tools.nothing.Tool"}, "cannot import"),
    ({"class_path": "zerotir.config.ToolConfig"}, "not a subclass of zerotir.tools.Tool"),
    ({"class_path": "calculator", "init_args": {"digits": 3}}, "'calculator' init_args"),
])
def test_tool_entries_that_cannot_be_built_are_named(entry, says):
    with pytest.raises(ValueError, match=says):
        Toolbox.build(ToolConfig(format="hermes", tools=[entry]))


def test_settings_that_cannot_apply_are_refused():
    with pytest.raises(ValueError, match="two tools are named 'calculator'"):
        Toolbox.build(ToolConfig(format="hermes", tools=[{"class_path": "calculator"}] * 2)).start()
    with pytest.raises(ValueError, match="fences calls the python tool only"):
        ToolConfig(tools=[{"class_path": "python"}, {"class_path": "calculator"}])
    assert ToolConfig(max_tool_calls=0, tools=[{"class_path": "calculator"}]).tools  # no tool at all: not checked
    with pytest.raises(ValueError, match=r"model.tool.code_start set with model.tool.format='hermes'"):
        ToolConfig(format="hermes", code_start="<code>")
    with pytest.raises(ValueError, match="model.tool.format='json'"):
        ToolConfig(format="json")
    with pytest.raises(ValueError, match="model.tool.tools is empty"):
        ToolConfig(tools=[])
    with pytest.raises(ValueError, match="model.tool.tools entry"):
        ToolConfig(tools=[{"class_path": "python", "args": {}}])


@pytest.mark.parametrize("block, call", [
    ('{"name": "calculator", "arguments": {"expression": "1+1"}}', Call("calculator", {"expression": "1+1"})),
    ('\n{"name": "search", "arguments": {}}\n', Call("search", {})),
    ('{"name": "search"}', Call("search", {})),  # no arguments: an empty object
])
def test_hermes_parses_calls(block, call):
    assert Hermes().parse(block) == call


@pytest.mark.parametrize("block, says", [
    ('{"name": "calculator", "arguments": {"expression": "1+1"}', "not valid JSON"),
    ('["calculator"]', 'a JSON object with a string "name"'),
    ('{"arguments": {}}', 'a JSON object with a string "name"'),
    ('{"name": "calculator", "arguments": "1+1"}', "must be a JSON object, got str"),
])
def test_hermes_refuses_malformed_calls_with_a_reason(block, says):
    parsed = Hermes().parse(block)
    assert parsed.name == "" and says in parsed.error


def test_each_format_renders_its_own_block_and_markers():
    fences, hermes = call_format(ToolConfig()), call_format(HERMES)
    assert (fences.call_start, fences.call_end, fences.output_start, fences.output_end) == (
        "```python", "```", "```output", "```")
    assert fences.render("5") == "\n```output\n5\n```\n"
    assert fences.parse("\nx=1\n") == Call("python", {"code": "\nx=1\n"})
    assert hermes.render("5") == "\n<tool_response>\n5\n</tool_response>\n"
    assert (hermes.call_start, hermes.call_end) == ("<tool_call>", "</tool_call>")


def test_tool_names_come_from_the_classes_without_building_them():
    from zerotir.tools.registry import tool_names

    entries = [{"class_path": "python"}, {"class_path": "search", "init_args": {"corpus": "no/such/file.jsonl"}},
               {"class_path": "mcp", "init_args": {"command": ["no-such-server"]}}]
    assert tool_names(entries) == ["python", "search"]  # an MCP server's tools are named once it runs
