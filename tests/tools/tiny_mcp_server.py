"""A tiny MCP server for tests/tools/test_mcp_server.py: add, wait (sleeps), die (exits) and refuse (raises: the
server answers with ``isError``).

``python tiny_mcp_server.py <name>`` serves over stdio (``<name>`` is ignored: it gives a test a server of its own);
``python tiny_mcp_server.py http`` serves over streamable HTTP on a free loopback port, bound here before serving
(no race for the port), and prints that port as its first line.
"""

import os
import socket
import sys
import time

import anyio
import uvicorn

from mcp.server.mcpserver import MCPServer

app = MCPServer("tiny")


@app.tool()
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@app.tool()
def wait(seconds: float) -> str:
    """Sleep, then answer."""
    time.sleep(seconds)
    return "awake"


@app.tool()
def die() -> str:
    """Exit the server process at once."""
    os._exit(1)


@app.tool()
def refuse(reason: str) -> str:
    """Raise: the SDK's server answers the call as an error (``isError``)."""
    raise ValueError(f"refused: {reason}")


def serve_http() -> None:
    """Streamable HTTP at ``http://127.0.0.1:<port>/mcp``, the port printed first."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()  # connections wait in the backlog until uvicorn accepts them
    print(sock.getsockname()[1], flush=True)
    server = uvicorn.Server(uvicorn.Config(app.streamable_http_app(), log_level="warning"))
    anyio.run(server.serve, [sock])


if __name__ == "__main__":
    if sys.argv[1:] == ["http"]:
        serve_http()
    else:
        app.run("stdio")
