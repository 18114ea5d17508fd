"""Where a run's code executes: the sandbox of the ``model.tool.sandbox`` group, reached once at start.

``model.tool.sandbox.urls`` set: those servers, checked with a health call (``SandboxUnavailable`` names every URL
tried and the fix). Unset: an embedded local server (``sandbox.local_sandbox``) with the group's options, stopped at ``close``,
or, given to ``start``, servers someone else started (the fleet's servers of each node, ``zerotir.fleet.sandboxes``).
Without tools (``model.tool.max_tool_calls: 0``, the paper's ZeroRL baseline) nothing is started or reached, and the
rollouts get no client: a dead sandbox never quietly turns into a no-tool run, because a run with tools always starts
one here first.

A client belongs to one event loop, so each thread that runs the tool loop takes its own: the
trainer's in-line rollouts use ``client``; an engine host builds its own from ``urls``, both with the python tool's
one builder (``zerotir.tools.python.connect_sandbox``).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from zerotir.config import SandboxConfig, ToolConfig

log = logging.getLogger(__name__)


class SandboxService:
    """The sandbox of one run; ``start`` before the first rollout (idempotent), ``close`` at teardown.

    Args:
        config: the ``model.tool.sandbox`` group.
        tool: the ``model.tool`` group (without tools there is no sandbox).
    """

    def __init__(self, config: SandboxConfig, tool: ToolConfig):
        self.config, self.tool = config, tool
        self.urls: list[str] = []
        self.client: Any = None  # the trainer thread's client (None without tools or before start)
        self._stack = contextlib.ExitStack()

    def start(self, started: list[str] | None = None) -> None:
        """Reach the sandbox, failing fast when it does not answer; start the embedded one when no URL is set.

        Args:
            started: servers already running for this run (the trainer's node's server of the fleet), used
                instead of the embedded one; ``model.tool.sandbox.urls`` win over them.
        """
        if self.client is not None or not self.tool.enabled:
            return
        from sandbox import SandboxUnavailable, local_sandbox

        from zerotir.tools.python import connect_sandbox

        if self.config.urls is None and started:
            self.urls = list(started)
        elif self.config.urls is None:
            self.urls = list(self._stack.enter_context(local_sandbox(**self.config.local_options)))
            log.info("started an embedded local sandbox at %s", ", ".join(self.urls))
        else:
            self.urls = list(self.config.urls)
        try:  # SandboxUnavailable names every URL tried and the fix
            self.client = connect_sandbox(self.urls, self.config.client_options)
        except SandboxUnavailable:
            self.close()
            raise

    @property
    def names(self) -> list[str]:
        """The sandbox as error messages name it: its URLs, or the embedded server before it started."""
        return self.urls or ["<embedded local sandbox>"]

    def close(self) -> None:
        """Stop the embedded server (if any) and drop the client."""
        self.client = None
        self._stack.close()
        self._stack = contextlib.ExitStack()
