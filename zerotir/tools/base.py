"""The tool protocol: what the tool loop calls when the model writes a tool call.

A tool has a ``name`` (what the model writes), a ``description`` and a JSON schema of its arguments
(``parameters``: what a call format shows the model and what the arguments are checked against), and an async
``call(arguments)`` that returns an ``Observation``: the text the model reads, a status, and numbers for the logs.
Tools are configured as ``model.tool.tools``: a list of ``class_path`` entries with their ``init_args``
(``zerotir.tools.registry``); the run's runtime parts (the ``model.tool`` group, where the sandbox is) reach a tool
through ``bind(env)``. A tool has a life of its own: the run's ``Toolbox`` builds it once per source and per engine
host, calls ``start()`` once before the first rollout (connect to a server, load an index, reach a sandbox: the
slow and failing part, done once and failing fast) and ``close()`` once at teardown; both do nothing by default.

A tool never raises for the model's mistakes (bad code, a division by zero, a timeout): it returns an observation
with that status, so the model reads what went wrong. An exception that escapes ``call`` is the tool's own fault and
is recorded as a ``tool_error`` (``zerotir.tools.registry.Toolbox.call``).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["STATUS_ERROR", "STATUS_INVALID", "STATUS_OK", "STATUS_SANDBOX_ERROR", "STATUS_TIMEOUT",
           "STATUS_TOOL_ERROR", "TIMEOUT_STATUSES", "Observation", "Tool", "ToolEnv"]

# Statuses of an observation. The python tool keeps the sandbox's own (``sandbox.result.ExecStatus`` values: "ok",
# "error", "timeout", "memory", "killed", "sandbox_error"); the others use ok / error / timeout.
STATUS_OK, STATUS_ERROR, STATUS_TIMEOUT = "ok", "error", "timeout"
STATUS_SANDBOX_ERROR = "sandbox_error"  # the sandbox service failed to run the code (an infrastructure fault)
STATUS_TOOL_ERROR = "tool_error"  # a tool raised instead of returning an observation (an infrastructure fault)
STATUS_INVALID = "invalid"  # the call itself was malformed: bad JSON, an unknown tool, arguments off the schema
TIMEOUT_STATUSES = ("timeout", "memory", "killed")  # stopped at a limit


@dataclass(frozen=True)
class Observation:
    """What one tool call gives back.

    Attributes:
        text: what the model reads (the call format wraps it; the loop caps its characters and tokens).
        status: how the call ended (the ``STATUS_*`` values above, or the sandbox's).
        metrics: numbers about the call for the logs (e.g. ``passages``), never for the loss.
    """

    text: str
    status: str = STATUS_OK
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolEnv:
    """The run's parts a tool may need, handed to ``Tool.bind``.

    Attributes:
        tool: the ``model.tool`` group (the python tool's ``run_timeout`` and ``sandbox`` group).
        sandbox: a sandbox client handed in (``sandbox.SandboxClient`` or anything with ``async run(code, *,
            run_timeout)``: a test's scripted one, a benchmark's); None: the python tool reaches or starts its own
            at ``start`` (``zerotir.tools.sandbox_service``).
        sandbox_urls: the sandbox servers the python tool reaches in place of ``model.tool.sandbox``'s (an engine
            host reaches the trainer's: ``HostSettings.sandbox_urls``); None: ``model.tool.sandbox`` decides.
    """

    tool: Any
    sandbox: Any = None
    sandbox_urls: tuple[str, ...] | None = None


class Tool:
    """Base class of a tool (see the module doc). Subclasses set ``name``, ``description`` and ``parameters`` (as
    class attributes or in ``__init__``) and implement ``call``."""

    name: str = ""
    description: str = ""
    parameters: dict[str, Any] = {"type": "object", "properties": {}}
    # True where the tools this entry stands for are known only once started (an MCP server lists them): reading
    # their schemas for a prompt (``registry.tool_schemas``) starts and closes it.
    listed_at_start: bool = False

    def expand(self) -> list[Tool]:
        """The tools this entry stands for: itself (the ``mcp`` entry: each tool its server lists, once started)."""
        return [self]

    def bind(self, env: ToolEnv) -> None:
        """Take what the run provides (default: nothing). Raises ``ValueError`` when the tool cannot run there."""

    def start(self) -> None:
        """Acquire what the tool holds for the run (a server's session, a corpus index, a sandbox client), once,
        before its first call (default: nothing). Raises when the tool cannot run, naming the setting and the fix."""

    def close(self) -> None:
        """Release what ``start`` acquired (default: nothing); idempotent, and safe after a failed ``start``."""

    async def call(self, arguments: dict[str, Any]) -> Observation:
        """Run one call with ``arguments`` (already checked against ``parameters``)."""
        raise NotImplementedError(f"{type(self).__name__}.call")

    def schema(self) -> dict[str, Any]:
        """The tool as a function-calling schema (the shape Qwen / Hermes chat templates take in ``tools=``)."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


def close_match_hint(name: str, names: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``names`` to a mistyped ``name``, or ""."""
    close = difflib.get_close_matches(name, list(names), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def import_subclass(path: str, base: type, base_name: str, where: str) -> type:
    """The class at the dotted ``path`` (``module.Class``), which must subclass ``base`` (called ``base_name`` in
    the errors): the one import of a ``class_path`` that the tool and call-format registries share.

    Raises:
        ValueError: ``path`` cannot be imported, or is not a subclass of ``base``; ``where`` names the setting.
    """
    module, _, attr = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"{where}: cannot import {path} ({type(error).__name__}: {error})") from error
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ValueError(f"{where}: {path} is not a subclass of {base_name}")
    return cls
