"""Loopback ports for the tests: one nothing listens on, found by binding port 0 and closing it at once."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dead_url(path: str = "") -> str:
    """``http://127.0.0.1:<port><path>`` at a port nothing listens on: a server that does not answer."""
    return f"http://127.0.0.1:{free_port()}{path}"
