"""Where the python tool's code executes: the sandbox of the ``model.tool.sandbox`` group, reached once at start.

Given URLs (an engine host's: the trainer's sandbox, ``HostSettings.sandbox_urls``) or ``model.tool.sandbox.urls``
set: those servers, checked with a health call (``SandboxUnavailable`` names every URL tried and the fix); then
servers the fleet started for the run (one on each node, ``zerotir.fleet.sandboxes``). None of them:
an embedded local server (``sandbox.local_sandbox``) with the group's options, stopped at ``close``. Only a run whose
tools include python starts one (the python tool's ``start``, or the fleet's trainer for its engine hosts:
``zerotir.tools.python.sandbox_needed``); a calculator-only run, or one without tools, starts and reaches nothing.

A client belongs to one event loop at a time (``SandboxClient`` makes its connection pool again on another), and
each process that runs the tool loop builds its own, with the one builder ``connect_sandbox``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)

EMBEDDED = "<embedded local sandbox>"  # how errors name the embedded server before it started


class SandboxService:
    """The sandbox one python tool (or the fleet's trainer) uses; ``start`` before the first call (idempotent),
    ``close`` at teardown.

    Args:
        config: the ``model.tool.sandbox`` group (``SandboxConfig``).
        urls: the servers to reach in place of ``config.urls`` (an engine host's); None: ``config`` decides.
    """

    def __init__(self, config: Any, urls: Sequence[str] | None = None):
        self.config, self.given = config, None if urls is None else list(urls)
        self.urls: list[str] = []
        self.client: Any = None  # None before start and after close
        self._stack = contextlib.ExitStack()

    def start(self, started: Sequence[str] | None = None) -> None:
        """Reach the sandbox, failing fast when it does not answer; start the embedded one when no URL is set.

        Args:
            started: servers already running for this run (the fleet's server on the trainer's node,
                ``zerotir.fleet.sandboxes``), reached in place of an embedded one; given URLs and
                ``model.tool.sandbox.urls`` win over them.
        """
        if self.client is not None:
            return
        from sandbox import SandboxUnavailable, local_sandbox

        if self.given is not None:
            self.urls = list(self.given)
        elif self.config.urls is not None:
            self.urls = list(self.config.urls)
        elif started:
            self.urls = list(started)
        else:
            self.urls = list(self._stack.enter_context(local_sandbox(**self.config.local_options)))
            log.info("started an embedded local sandbox at %s", ", ".join(self.urls))
        try:  # SandboxUnavailable names every URL tried and the fix
            self.client = connect_sandbox(self.urls, self.config.client_options)
        except SandboxUnavailable:
            self.close()
            raise

    @property
    def names(self) -> list[str]:
        """The sandbox as error messages name it: its URLs, those it will reach, or the embedded server."""
        planned = self.urls or (self.given if self.given is not None else self.config.urls)
        return list(planned) if planned else [EMBEDDED]

    def close(self) -> None:
        """Stop the embedded server (if any) and drop the client; idempotent."""
        self.client = None
        self._stack.close()
        self._stack = contextlib.ExitStack()


def connect_sandbox(urls: Sequence[str], options: dict[str, Any]) -> Any:
    """A sandbox client for ``urls``, checked with one health call: the one client builder of a run.

    Args:
        urls: the sandbox servers (``model.tool.sandbox.urls``, the trainer's, or the embedded server's).
        options: ``sandbox.SandboxClient`` keywords (``SandboxConfig.client_options``).

    Raises:
        SandboxUnavailable: no server answered; it names every URL tried and the fix.
    """
    from sandbox import SandboxClient

    client = SandboxClient(list(urls), **options)
    client.check_health()
    return client
