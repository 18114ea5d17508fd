"""``python``: the paper's code interpreter behind the tool protocol.

The tool owns its sandbox: ``start`` reaches the servers it is given (an engine host's, the trainer's sandbox) or
``model.tool.sandbox.urls``, or starts an embedded local server when neither is set (``SandboxService``), checked
with one health call, so a dead sandbox fails the run at start with ``SandboxUnavailable`` naming every URL;
``close`` stops what it started. A run whose tools do not include python starts no sandbox (``sandbox_needed``). A
client handed in through ``ToolEnv.sandbox`` (a test's, a benchmark's) is used as is and never closed here.

The observation is the sandbox's own formatting of the result (``sandbox.format_for_model``, uncut: the model-facing
cap is ``Toolbox.call``'s alone) with the sandbox's status; a client that raises (instead of returning a
``sandbox_error`` result) is recorded as a sandbox error.
"""

from __future__ import annotations

import enum
import logging
from typing import Any

from zerotir.tools.base import Observation, Tool, ToolEnv
from zerotir.tools.registry import resolve
from zerotir.tools.sandbox_service import SandboxService

log = logging.getLogger(__name__)


class PythonTool(Tool):
    """Runs Python code in the sandbox and shows its output (stdout, or the traceback reduced to its last lines)."""

    name = "python"
    description = "Run Python code in a sandbox and return what it prints (or its error)."
    parameters = {"type": "object", "properties": {"code": {"type": "string", "description": "The code to run."}},
                  "required": ["code"], "additionalProperties": False}

    def __init__(self) -> None:
        self._env: ToolEnv | None = None
        self._service: SandboxService | None = None  # the sandbox this tool reached or started (None: handed in)
        self._sandbox: Any = None

    def bind(self, env: ToolEnv) -> None:
        self._env = env

    def start(self) -> None:
        """The sandbox client: the one handed in, else the servers given or configured, else an embedded server."""
        if self._sandbox is not None:
            return
        if self._env is None:
            raise RuntimeError("PythonTool.start before bind(env): build it through zerotir.tools.Toolbox.build")
        if self._env.sandbox is not None:
            self._sandbox = self._env.sandbox
            return
        service = SandboxService(self._env.tool.sandbox, self._env.sandbox_urls)
        service.start()  # raises SandboxUnavailable, naming every URL and the fix
        self._service, self._sandbox = service, service.client

    @property
    def urls(self) -> list[str]:
        """Where the code runs, as error messages name it (the sandbox's URLs); [] for a client handed in."""
        return self._service.names if self._service is not None else []

    def close(self) -> None:
        service, self._service, self._sandbox = self._service, None, None
        if service is not None:
            service.close()

    async def call(self, arguments: dict[str, Any]) -> Observation:
        from sandbox.result import format_for_model

        if self._sandbox is None:
            raise RuntimeError("the python tool is not started (Toolbox.start before the first rollout)")
        try:
            result = await self._sandbox.run(arguments["code"], run_timeout=self._env.tool.run_timeout)
        except Exception as error:
            result = failed_call_result(error)
        status = result.status
        return Observation(format_for_model(result, None), str(status.value if isinstance(status, enum.Enum) else status),
                           {"exec_seconds": float(result.elapsed)})


def failed_call_result(error: BaseException) -> Any:
    """A SANDBOX_ERROR result for a sandbox call that raised (the client is meant to return one instead).

    The model sees the same message as for any unavailable interpreter; the call is counted as a sandbox error,
    which the trainer's guard watches, and the exception is logged.
    """
    from sandbox.result import ExecResult, ExecStatus

    log.warning("sandbox call raised %s: %s (counted as a sandbox error)", type(error).__name__, error)
    return ExecResult(ExecStatus.SANDBOX_ERROR, "", f"{type(error).__name__}: {error}", 0.0)


def sandbox_needed(tool: Any) -> bool:
    """Whether the tools of ``tool`` (the ``model.tool`` group) include the python tool (a subclass counts), so the
    run needs a sandbox: the fleet's trainer starts one for its engine hosts only then."""
    return tool.enabled and any(issubclass(resolve(entry["class_path"]), PythonTool) for entry in tool.tools)


def sandbox_urls(tools: Any) -> list[str]:
    """Where the python tools of a started ``Toolbox`` run their code (their sandboxes' URLs), for error messages."""
    return [url for one in tools.entries if isinstance(one, PythonTool) for url in one.urls]
