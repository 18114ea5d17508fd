"""``mcp``: every tool of an MCP server (through the ``mcp`` SDK, the ``tools`` extra), each a tool of its own.

The server is reached one of two ways, exactly one set: ``command`` (with ``args``, ``env``) starts it as a child
process and speaks over its stdio; ``url`` (e.g. ``http://127.0.0.1:8000/mcp``) reaches a running one over
streamable HTTP. Both go through one connection class; only the transport that yields the SDK's read and write
streams differs. The entry ``{class_path: mcp, init_args: {command: ..., args: [...]}}`` (or ``{url: ...}``)
connects once per process, lists its tools at start (their names, descriptions and input schemas, which the registry
checks arguments against) and stands for all of them (``expand``). The session lives on an event loop of its own in
a daemon thread: the tool loop's event loop is only driven between engine steps, and an MCP session must keep
reading its server. A call waits at most ``timeout`` seconds (status ``timeout``); a server that died answers every
call with a ``tool_error`` observation (at once once the session has ended, within ``timeout`` before), so a dead or
stuck server never hangs the rollout. The connection stays up until the process ends or ``close_all`` runs (a later
rollout reuses it; a dead one is connected again when the tools are built again; an HTTP server must then be up
again).
"""

from __future__ import annotations

import asyncio
import atexit
import threading
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from zerotir.tools.base import STATUS_ERROR, STATUS_TIMEOUT, STATUS_TOOL_ERROR, Observation, Tool

_SERVERS: dict[tuple, MCPConnection] = {}  # ("stdio", command, args, env) or ("http", url) -> this process's session
_LOCK = threading.Lock()

Transport = Callable[[], AbstractAsyncContextManager]  # opens the SDK's (read, write) streams to one server


def stdio_transport(command: str, args: list[str], env: dict[str, str] | None) -> Transport:
    """The server started as ``command`` ``args`` (with ``env``), spoken to over its stdio."""
    def open_streams() -> AbstractAsyncContextManager:
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        return stdio_client(StdioServerParameters(command=command, args=args, env=env))
    return open_streams


def http_transport(url: str, timeout: float) -> Transport:
    """The running server at ``url`` over streamable HTTP. Connecting and writing are bounded by ``timeout``
    seconds, so a dead server's requests fail at once (a refused connection) or within it; reading a reply keeps
    the SDK's long bound (an event stream stays open between messages): a call is bounded by ``MCPConnection.call``.
    """
    def open_streams() -> AbstractAsyncContextManager:
        import httpx2
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, create_mcp_http_client

        client = create_mcp_http_client(timeout=httpx2.Timeout(timeout, read=MCP_DEFAULT_SSE_READ_TIMEOUT))
        return streamable_http_client(url, http_client=client)
    return open_streams


class MCPConnection:
    """One MCP server's session over ``transport``, on an event loop in a thread of its own (module doc).

    Args:
        transport: opens the streams to the server (``stdio_transport``, ``http_transport``).
        where: the server as the settings name it, for errors (``command=...`` or ``url=...``).
        start_timeout: seconds the server may take to answer and list its tools.
    """

    def __init__(self, transport: Transport, where: str, start_timeout: float):
        self.loop = asyncio.new_event_loop()
        self.tools: list[Any] = []
        self._session: Any = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.alive = False
        self._thread = threading.Thread(target=self.loop.run_until_complete, args=(self._main(transport),),
                                        name=f"mcp:{where}", daemon=True)
        self._thread.start()
        if not self._ready.wait(start_timeout):
            self.close()
            raise ValueError(f"mcp init_args.{where}: the server did not list its tools within {start_timeout} s "
                             "(init_args.start_timeout)")
        if self._error is not None:
            cause = _first_cause(self._error)
            raise ValueError(f"mcp init_args.{where}: the server did not start or answer "
                             f"({type(cause).__name__}: {cause})") from self._error

    async def _main(self, transport: Transport) -> None:
        from mcp import ClientSession

        self._stop = asyncio.Event()
        try:
            async with transport() as streams, ClientSession(streams[0], streams[1]) as session:
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
        """End the session (a stdio server's process ends with it) and the thread."""
        if self._stop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(5.0)


def _first_cause(error: BaseException) -> BaseException:
    """The first error inside the task groups' ``ExceptionGroup`` wrappers of the SDK (what went wrong)."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


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
        from mcp.types import TextContent

        text = "\n".join(part.text if isinstance(part, TextContent) else f"[{part.type}]" for part in result.content)
        return Observation(text, STATUS_ERROR if result.is_error else "ok")


class MCPTools(Tool):
    """Every tool of one MCP server: started by ``command`` ``args`` (stdio) or running at ``url`` (streamable
    HTTP); exactly one of the two is set (module doc).

    Args:
        command: the program that runs the server over stdio (e.g. ``python``).
        args: its arguments (e.g. the server script); with ``command`` only.
        env: the server's environment (None: the SDK's default, a few safe variables); with ``command`` only.
        url: the endpoint of a server over streamable HTTP (e.g. ``http://127.0.0.1:8000/mcp``).
        timeout: seconds one call may take (over HTTP also the bound of connecting and writing).
        start_timeout: seconds the server may take to start (or answer) and list its tools.
    """

    def __init__(self, command: str | None = None, args: list[str] | None = None,
                 env: dict[str, str] | None = None, url: str | None = None, timeout: float = 30.0,
                 start_timeout: float = 30.0):
        if (command is None) == (url is None):
            raise ValueError(f"mcp init_args: set exactly one of command (a server started over stdio) and url (a "
                             f"server over streamable HTTP); got {'both' if command else 'neither'}")
        if url is not None and (args or env):
            raise ValueError("mcp init_args: args and env start a stdio server (command); a server at url runs "
                             "already: drop them")
        if timeout <= 0 or start_timeout <= 0:
            raise ValueError(f"mcp init_args: timeout={timeout} and start_timeout={start_timeout} must be > 0")
        if url is not None:
            key, where, transport = ("http", url), f"url={url!r}", http_transport(url, timeout)
        else:
            argv = list(args or ())
            key = ("stdio", command, tuple(argv), tuple(sorted((env or {}).items())))
            where, transport = f"command={command!r} {argv}", stdio_transport(command, argv, env)
        with _LOCK:
            server = _SERVERS.get(key)
            if server is None or not server.alive:
                server = _SERVERS[key] = MCPConnection(transport, where, start_timeout)
        self.server, self.timeout, self.name = server, timeout, f"mcp:{url or command}"

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
