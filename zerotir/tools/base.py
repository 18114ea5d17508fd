"""The tool protocol: what the tool loop calls when the model writes a tool call.

A tool has a ``name`` (what the model writes), a ``description`` and a JSON schema of its arguments
(``parameters``: what a call format shows the model and what the arguments are checked against), and an async
``call(arguments)`` that returns an ``Observation``: the text the model reads, a status, and numbers for the logs.
Tools are configured as ``model.tool.tools``: a list of ``class_path`` entries with their ``init_args``
(``zerotir.tools.registry``); the run's runtime parts (the sandbox client, the ``model.tool`` group) reach a tool
through ``bind(env)``, called once before its first call.

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
        tool: the ``model.tool`` group (output caps, the python tool's ``run_timeout``).
        sandbox: the sandbox client of this thread (``sandbox.SandboxClient`` or anything with ``async run(code, *,
            run_timeout)``), built where it is today (``SandboxService`` on the trainer, the fleet host's own);
            None where the run has no sandbox.
    """

    tool: Any
    sandbox: Any = None


class Tool:
    """Base class of a tool (see the module doc). Subclasses set ``name``, ``description`` and ``parameters`` (as
    class attributes or in ``__init__``) and implement ``call``."""

    name: str = ""
    description: str = ""
    parameters: dict[str, Any] = {"type": "object", "properties": {}}

    def expand(self) -> list[Tool]:
        """The tools this entry stands for: itself (the ``mcp`` entry: each tool its server lists)."""
        return [self]

    def bind(self, env: ToolEnv) -> None:
        """Take what the run provides (default: nothing). Raises ``ValueError`` when the tool cannot run there."""

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
