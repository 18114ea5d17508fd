"""``python``: the paper's code interpreter behind the tool protocol.

The code runs in the sandbox (``sandbox.SandboxClient``, or anything with ``async run(code, *, run_timeout)``) that
the run built with ``connect_sandbox`` (below; ``SandboxService`` on the trainer, each fleet host its own), and hands in
through ``ToolEnv.sandbox``. The observation is the sandbox's own formatting of the result
(``sandbox.format_for_model``, capped at ``model.tool.max_output_chars``) with the sandbox's status; a client that
raises (instead of returning a ``sandbox_error`` result) is recorded as a sandbox error, as before.
"""

from __future__ import annotations

import enum
import logging
from typing import Any

from zerotir.tools.base import Observation, Tool, ToolEnv

log = logging.getLogger(__name__)


class PythonTool(Tool):
    """Runs Python code in the sandbox and shows its output (stdout, or the traceback reduced to its last lines)."""

    name = "python"
    description = "Run Python code in a sandbox and return what it prints (or its error)."
    parameters = {"type": "object", "properties": {"code": {"type": "string", "description": "The code to run."}},
                  "required": ["code"], "additionalProperties": False}

    def __init__(self) -> None:
        self._sandbox: Any = None
        self._run_timeout = 5.0
        self._max_chars = 512

    def bind(self, env: ToolEnv) -> None:
        if env.sandbox is None:
            raise ValueError("the python tool (model.tool.tools) needs a sandbox client, and this run has none: "
                             "start one (zerotir.rollout.sandbox_service.SandboxService) or drop python from "
                             "model.tool.tools")
        self._sandbox, self._run_timeout, self._max_chars = env.sandbox, env.tool.run_timeout, env.tool.max_output_chars

    async def call(self, arguments: dict[str, Any]) -> Observation:
        from sandbox.result import format_for_model

        try:
            result = await self._sandbox.run(arguments["code"], run_timeout=self._run_timeout)
        except Exception as error:
            result = failed_call_result(error)
        status = result.status
        return Observation(format_for_model(result, self._max_chars),
                           str(status.value if isinstance(status, enum.Enum) else status),
                           {"exec_seconds": float(result.elapsed)})


def failed_call_result(error: BaseException) -> Any:
    """A SANDBOX_ERROR result for a sandbox call that raised (the client is meant to return one instead).

    The model sees the same message as for any unavailable interpreter; the call is counted as a sandbox error,
    which the trainer's guard watches, and the exception is logged.
    """
    from sandbox.result import ExecResult, ExecStatus

    log.warning("sandbox call raised %s: %s (counted as a sandbox error)", type(error).__name__, error)
    return ExecResult(ExecStatus.SANDBOX_ERROR, "", f"{type(error).__name__}: {error}", 0.0)


def connect_sandbox(urls: list[str], options: dict[str, Any]) -> Any:
    """The python tool's sandbox client for ``urls``, checked with one health call: the one client builder of a run,
    for the trainer's ``SandboxService`` and each fleet engine host alike (a client belongs to the event loop of the
    thread that uses it, so each builds its own).

    Args:
        urls: the sandbox servers (``model.tool.sandbox.urls``, or the embedded server's).
        options: ``sandbox.SandboxClient`` keywords (``SandboxConfig.client_options``).

    Raises:
        SandboxUnavailable: no server answered; it names every URL tried and the fix.
    """
    from sandbox import SandboxClient

    client = SandboxClient(list(urls), **options)
    client.check_health()
    return client
