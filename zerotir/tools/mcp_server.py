"""``mcp``: every tool of an MCP server (stdio, through the ``mcp`` SDK, the ``tools`` extra), each a tool of its own.

The entry ``{class_path: mcp, init_args: {command: ..., args: [...]}}`` starts the server once per process, lists
its tools at start (their names, descriptions and input schemas, which the registry checks arguments against) and
stands for all of them (``expand``). The session lives on an event loop of its own in a daemon thread: the tool
loop's event loop is only driven between engine steps, and an MCP session must keep reading its server. A call
waits at most ``timeout`` seconds (status ``timeout``); a server that died answers every call at once with a
``tool_error`` observation, so a dead or stuck server never hangs the rollout. The server stays up until the process
ends (a later rollout reuses it; a dead one is started again when the tools are built again).
"""

from __future__ import annotations

import asyncio
import atexit
import threading
from typing import Any

from zerotir.tools.base import STATUS_ERROR, STATUS_TIMEOUT, STATUS_TOOL_ERROR, Observation, Tool

_SERVERS: dict[tuple, MCPConnection] = {}  # (command, args, env) -> the running server of this process
_LOCK = threading.Lock()


class MCPConnection:
    """One MCP server over stdio and its session, on an event loop in a thread of its own (module doc)."""

    def __init__(self, command: str, args: list[str], env: dict[str, str] | None, start_timeout: float):
        self.loop = asyncio.new_event_loop()
        self.tools: list[Any] = []
        self._session: Any = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.alive = False
        self._thread = threading.Thread(target=self.loop.run_until_complete, args=(self._main(command, args, env),),
                                        name=f"mcp:{command}", daemon=True)
        self._thread.start()
        if not self._ready.wait(start_timeout):
            self.close()
            raise ValueError(f"mcp init_args.command={command!r} {args}: the server did not list its tools within "
                             f"{start_timeout} s (init_args.start_timeout)")
        if self._error is not None:
            raise ValueError(f"mcp init_args.command={command!r} {args}: the server did not start "
                             f"({type(self._error).__name__}: {self._error})") from self._error

    async def _main(self, command: str, args: list[str], env: dict[str, str] | None) -> None:
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client

        self._stop = asyncio.Event()
        try:
            async with stdio_client(StdioServerParameters(command=command, args=args, env=env)) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    self.tools, self._session, self.alive = (await session.list_tools()).tools, session, True
                    self._ready.set()
                    await self._stop.wait()
        except BaseException as error:  # a server that never started, or one that died: its calls fail at once
            self._error = error
        finally:
            self.alive = False
            self._ready.set()

    async def call(self, name: str, arguments: dict[str, Any], timeout: float) -> Any:
        """The server's ``CallToolResult``; raises ``asyncio.TimeoutError`` after ``timeout`` s, or the SDK's error."""
        if not self.alive:
            raise ConnectionError("the MCP server is not running")
        future = asyncio.run_coroutine_threadsafe(self._session.call_tool(name, arguments), self.loop)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout)
        finally:
            future.cancel()

    def close(self) -> None:
        """Stop the session (the server process ends with it) and the thread."""
        if self._stop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(5.0)


class MCPTool(Tool):
    """One tool of an MCP server (built by ``MCPTools.expand``)."""

    def __init__(self, server: MCPConnection, listed: Any, timeout: float):
        self.server, self.timeout = server, timeout
        self.name, self.description = listed.name, listed.description or ""
        self.parameters = dict(listed.input_schema)

    async def call(self, arguments: dict[str, Any]) -> Observation:
        try:
            result = await self.server.call(self.name, arguments, self.timeout)
        except asyncio.TimeoutError:
            return Observation(f"Error: the tool {self.name!r} did not answer within {self.timeout} s.",
                               STATUS_TIMEOUT)
        except Exception as error:  # the server died or refused the request
            return Observation(f"Error: the tool {self.name!r} is unavailable ({type(error).__name__}: {error}).",
                               STATUS_TOOL_ERROR)
        text = "\n".join(getattr(part, "text", f"[{getattr(part, 'type', 'content')}]") for part in result.content)
        return Observation(text, STATUS_ERROR if result.is_error else "ok")


class MCPTools(Tool):
    """Every tool of the MCP server started by ``command`` ``args`` (module doc).

    Args:
        command: the program that runs the server over stdio (e.g. ``python``).
        args: its arguments (e.g. the server script).
        env: the server's environment (None: the SDK's default, a few safe variables).
        timeout: seconds one call may take.
        start_timeout: seconds the server may take to start and list its tools.
    """

    def __init__(self, command: str, args: list[str] | None = None, env: dict[str, str] | None = None,
                 timeout: float = 30.0, start_timeout: float = 30.0):
        if timeout <= 0 or start_timeout <= 0:
            raise ValueError(f"mcp init_args: timeout={timeout} and start_timeout={start_timeout} must be > 0")
        key = (command, tuple(args or ()), tuple(sorted((env or {}).items())))
        with _LOCK:
            server = _SERVERS.get(key)
            if server is None or not server.alive:
                server = _SERVERS[key] = MCPConnection(command, list(args or ()), env, start_timeout)
        self.server, self.timeout, self.name = server, timeout, f"mcp:{command}"

    def expand(self) -> list[Tool]:
        return [MCPTool(self.server, listed, self.timeout) for listed in self.server.tools]


@atexit.register
def close_all() -> None:
    """Stop every MCP server this process started (at exit; a test's teardown)."""
    with _LOCK:
        servers = list(_SERVERS.values())
        _SERVERS.clear()
    for server in servers:
        server.close()
