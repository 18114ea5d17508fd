"""``SandboxService.start`` given servers someone else started (the fleet's server on the trainer's node): they are
used instead of an embedded server, and ``model.tool.sandbox.urls`` still win over them."""

from __future__ import annotations

import pytest

from sandbox import SandboxUnavailable, local_sandbox
from tests.ports import dead_url
from zerotir.config import SandboxConfig
from zerotir.tools.sandbox_service import SandboxService


def test_started_servers_are_used_instead_of_an_embedded_one() -> None:
    with local_sandbox(workers=1, log_level="warning") as urls:
        service = SandboxService(SandboxConfig())
        service.start(started=urls)
        try:
            assert service.urls == urls and service.names == urls and service.client.urls == urls
        finally:
            service.close()


def test_configured_urls_win_over_started_servers() -> None:
    configured = dead_url()
    service = SandboxService(SandboxConfig(urls=[configured]))
    with pytest.raises(SandboxUnavailable, match=configured):  # the configured server is the one reached
        service.start(started=["http://127.0.0.1:1"])
