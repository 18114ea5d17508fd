"""The tools of a run, built from ``model.tool.tools``, and one call: checked, timed, capped.

``model.tool.tools`` is a list of entries ``{class_path: ..., init_args: {...}}``. A ``class_path`` is a built-in
name (``BUILT_IN``: ``python``, ``calculator``, ``search``, ``mcp``: every tool of an MCP server) or the dotted path
of a ``zerotir.tools.Tool`` subclass of your own (docs/extending.md); the class is built with its ``init_args``, an
entry stands for the tools its ``expand`` gives (itself, or a server's tools), and each is bound to the run's
``ToolEnv``.

``Toolbox.call`` is the one place a call goes through: an unknown tool name or arguments that fail the tool's JSON
schema (checked with ``jsonschema``) give an ``invalid`` observation that names the problem, which the model reads;
a tool that raises gives a ``tool_error`` one. Every observation is capped at ``model.tool.max_output_chars``
characters (head and tail with a marker) and carries its wall time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from zerotir.tools.base import (
    STATUS_INVALID, STATUS_TOOL_ERROR, Observation, Tool, ToolEnv, close_match_hint, import_subclass,
)
from zerotir.tools.formats import Call

log = logging.getLogger(__name__)

__all__ = ["BUILT_IN", "Toolbox", "Used", "build_tool", "resolve", "tool_names", "tool_schemas"]

BUILT_IN = {
    "python": "zerotir.tools.python.PythonTool",
    "calculator": "zerotir.tools.calculator.CalculatorTool",
    "search": "zerotir.tools.search.SearchTool",
    "mcp": "zerotir.tools.mcp_server.MCPTools",
}


def resolve(class_path: str) -> type[Tool]:
    """The ``Tool`` subclass named by ``class_path`` (a built-in name or a dotted path).

    Raises:
        ValueError: the path does not import, or does not name a ``Tool`` subclass.
    """
    path = BUILT_IN.get(class_path, class_path)
    where = f"model.tool.tools class_path {class_path!r}"
    if "." not in path:
        raise ValueError(f"{where}: not a built-in tool ({', '.join(BUILT_IN)}) nor a dotted path "
                         f"module.Class{close_match_hint(class_path, BUILT_IN)}")
    return import_subclass(path, Tool, "zerotir.tools.Tool", where)


def build_tool(entry: dict[str, Any], env: ToolEnv) -> Tool:
    """The tool of one ``{class_path, init_args}`` entry (one, or an MCP server's), bound to ``env``, not started."""
    tool = _built(entry)
    tool.bind(env)
    return tool


def tool_schemas(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The function-calling schemas of the tools of ``model.tool.tools`` ``entries``, in order, without binding them
    to a run (what a chat template shows the model: ``zerotir.data.prompts``); an entry whose tools are listed only
    once started (an MCP server's) is started for the listing and closed again."""
    schemas = []
    for entry in entries:
        tool = _built(entry)
        if not tool.listed_at_start:
            schemas += [one.schema() for one in _named(tool.expand(), entry)]
            continue
        try:
            tool.start()
            schemas += [one.schema() for one in _named(tool.expand(), entry)]
        finally:
            tool.close()
    return schemas


def tool_names(entries: list[dict[str, Any]]) -> list[str]:
    """The names of the tools of ``model.tool.tools`` ``entries`` that their class names, in order, without building
    them; an entry whose tools are named only once built (an MCP server's) gives none."""
    classes = [resolve(entry["class_path"]) for entry in entries]
    return [cls.name for cls in classes if cls.name]


def _built(entry: dict[str, Any]) -> Tool:
    """The tool of one entry, built with its ``init_args``, not yet bound nor started."""
    cls = resolve(entry["class_path"])
    try:
        return cls(**entry.get("init_args") or {})
    except TypeError as error:
        raise ValueError(f"model.tool.tools {entry['class_path']!r} init_args: {error}") from error


def _named(tools: list[Tool], entry: Any) -> list[Tool]:
    """``tools`` (an entry's expansion), each checked to have a name."""
    for one in tools:
        if not one.name:
            raise ValueError(f"model.tool.tools {_label(entry)}: a tool has an empty name")
    return tools


def _label(entry: Any) -> str:
    return repr(entry["class_path"]) if isinstance(entry, dict) else type(entry).__name__


@dataclass(frozen=True)
class Used:
    """One call as the loop records it: the tool's name (as the model wrote it), its observation and wall time."""

    tool: str
    observation: Observation
    seconds: float


class Toolbox:
    """The tools of a run by name, with their life (see the module doc).

    Args:
        tools: the built tools, one per ``model.tool.tools`` entry (``build``: bound to the run); their names, once
            expanded at ``start``, must be distinct.
        max_chars: the character cap of every observation (``model.tool.max_output_chars``).
    """

    def __init__(self, tools: Iterable[Tool], max_chars: int):
        self.entries = list(tools)
        self.max_chars = max_chars
        self.tools: dict[str, Tool] = {}  # by name, once started
        self._validators: dict[str, Any] = {}
        self.started = False

    @classmethod
    def build(cls, tool_config: Any, sandbox: Any = None, sandbox_urls: tuple[str, ...] | None = None) -> Toolbox:
        """The tools of ``tool_config.tools`` (the ``model.tool`` group), bound to the run, not started; none
        without tools (``max_tool_calls: 0``). ``sandbox``: a client handed to the python tool (a test's); else it
        reaches ``sandbox_urls`` (an engine host's: the trainer's sandbox) or ``model.tool.sandbox`` at start."""
        if not tool_config.enabled:
            return cls([], tool_config.max_output_chars)
        env = ToolEnv(tool_config, sandbox, sandbox_urls)
        return cls([build_tool(entry, env) for entry in tool_config.tools], tool_config.max_output_chars)

    def start(self) -> None:
        """Start every tool, in order, and index the tools they stand for by name; idempotent. A tool that fails to
        start closes those started before it, and its error is raised (it names the setting and the fix)."""
        if self.started:
            return
        started: list[Tool] = []
        try:
            for entry in self.entries:
                entry.start()
                started.append(entry)
            self._index([one for entry in self.entries for one in _named(entry.expand(), entry)])
        except BaseException:
            self.tools, self._validators = {}, {}
            for entry in reversed(started):
                entry.close()
            raise
        self.started = True

    def close(self) -> None:
        """Close every tool, in reverse order (each one's error logged, the others still closed); idempotent."""
        started, self.started = self.started, False
        self.tools, self._validators = {}, {}
        if not started:
            return
        for entry in reversed(self.entries):
            try:
                entry.close()
            except Exception as error:  # the others still close; the run is ending anyway
                log.warning("closing the tool %s raised %s: %s", _label(entry), type(error).__name__, error)

    def _index(self, tools: list[Tool]) -> None:
        import jsonschema

        for tool in tools:
            if tool.name in self.tools:
                raise ValueError(f"model.tool.tools: two tools are named {tool.name!r}; tool names must be distinct")
            try:
                jsonschema.Draft202012Validator.check_schema(tool.parameters)
            except jsonschema.SchemaError as error:
                raise ValueError(f"the tool {tool.name!r}: its parameters are not a JSON schema ({error.message})") \
                    from None
            self.tools[tool.name] = tool
            self._validators[tool.name] = jsonschema.Draft202012Validator(tool.parameters)

    @property
    def names(self) -> list[str]:
        """The tools' names, in configuration order (once started)."""
        self._check_started()
        return list(self.tools)

    def _check_started(self) -> None:
        if not self.started and self.entries:
            raise RuntimeError("the toolbox is not started: call Toolbox.start() once before the first rollout (its "
                               "tools connect, load or reach their sandbox there) and Toolbox.close() at teardown")

    def schemas(self) -> list[dict[str, Any]]:
        """Every tool's function-calling schema, in configuration order."""
        self._check_started()
        return [t.schema() for t in self.tools.values()]

    async def run(self, call: Call) -> Used:
        """The observation of a parsed ``call`` (``zerotir.tools.formats``): one that did not parse is an
        ``invalid`` observation naming why, which the model reads; else ``call``."""
        if call.error is not None:
            return Used("", invalid(call.error), 0.0)
        return await self.call(call.name, call.arguments)

    async def call(self, name: str, arguments: dict[str, Any]) -> Used:
        """Call tool ``name`` with ``arguments``; never raises for a bad call or a failing tool (module doc)."""
        self._check_started()
        start = time.perf_counter()
        observation = await self._observe(name, arguments)
        observation = cap_observation(observation, self.max_chars)
        return Used(name, observation, time.perf_counter() - start)

    async def _observe(self, name: str, arguments: dict[str, Any]) -> Observation:
        tool = self.tools.get(name)
        if tool is None:
            return invalid(f"there is no tool named {name!r}; the tools are: {', '.join(self.tools)}")
        problem = schema_problem(arguments, self._validators[name])
        if problem is not None:
            return invalid(f"the arguments of {name!r} do not fit its schema: {problem}")
        try:
            return await tool.call(arguments)
        except Exception as error:  # the tool's own fault: recorded, and the run goes on
            log.warning("tool %r raised %s: %s (recorded as a tool error)", name, type(error).__name__, error)
            return Observation(f"Error: the tool {name!r} failed ({type(error).__name__}: {error}).",
                               STATUS_TOOL_ERROR)


def invalid(message: str) -> Observation:
    """The observation of a malformed call: the model reads ``Error: <message>``."""
    return Observation(f"Error: {message}", STATUS_INVALID)


def schema_problem(arguments: Any, validator: Any) -> str | None:
    """Why ``arguments`` fail the JSON schema of ``validator`` (the most relevant error, with its path), or None."""
    import jsonschema

    error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"{where}: {error.message}" if where else error.message


def cap_observation(observation: Observation, max_chars: int) -> Observation:
    """``observation`` with its text cut to ``max_chars`` characters (head and tail with a marker)."""
    from sandbox.result import truncate_middle

    if len(observation.text) <= max_chars:
        return observation
    return Observation(truncate_middle(observation.text, max_chars), observation.status, observation.metrics)
