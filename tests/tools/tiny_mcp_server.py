"""A tiny MCP server over stdio for tests/tools/test_mcp_server.py: add, wait (sleeps) and die (exits)."""

import os
import time

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


if __name__ == "__main__":
    app.run("stdio")
