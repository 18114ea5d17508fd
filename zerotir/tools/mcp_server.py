"""``mcp``: every tool of an MCP server (through the ``mcp`` SDK, the ``tools`` extra), each a tool of its own.

The server is reached one of two ways, exactly one set: ``command`` (with ``args``, ``env``) starts it as a child
process and speaks over its stdio; ``url`` (e.g. ``http://127.0.0.1:8000/mcp``) reaches a running one over
streamable HTTP. Both go through one connection class; only the transport that yields the SDK's read and write
streams differs. The entry ``{class_path: mcp, init_args: {command: ..., args: [...]}}`` (or ``{url: ...}``)
connects at ``start`` (once per toolbox: one per source and per engine host), lists its tools there (their names,
descriptions and input schemas, which the registry checks arguments against) and stands for all of them
(``expand``). The session lives on an event loop of its own in
a daemon thread: the tool loop's event loop is only driven between engine steps, and an MCP session must keep
reading its server. A call waits at most ``timeout`` seconds (status ``timeout``); a server that died answers every
call with a ``tool_error`` observation (at once once the session has ended, within ``timeout`` before), so a dead or
stuck server never hangs the rollout. The connection stays up until the toolbox closes (``close``: a stdio server's
process ends with its session).

The model need not write the server's names: ``include`` / ``exclude`` keep or drop tools by the server's names,
``rename`` maps a server's name to the name the model writes, and ``prefix`` goes before every other name (e.g.
``calc_``), so two servers with a tool of one name can sit in one toolbox. A name in ``include``, ``exclude`` or
``rename`` that the server does not list is an error at start naming the field, the server's tools and the closest
name. A stdio server's stderr (its log lines, one per call for many servers) goes to a log file, not the trainer's
console: ``log_file``, by default ``<run folder>/mcp/<script>-<hash>.log`` (the run folder is the run's
``trainer.default_root_dir``, which ``python -m zerotir`` puts in ``$ZEROTIR_RUN_DIR``; outside a run, the system's
temporary folder); its path is logged once, when the server starts.
"""

from __future__ import annotations

import asyncio
import difflib
import hashlib
import logging
import os
import tempfile
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

from zerotir.tools.base import STATUS_ERROR, STATUS_TIMEOUT, STATUS_TOOL_ERROR, Observation, Tool

log = logging.getLogger(__name__)

RUN_DIR_ENV = "ZEROTIR_RUN_DIR"  # the run's trainer.default_root_dir, set by ``python -m zerotir``

Transport = Callable[[], AbstractAsyncContextManager]  # opens the SDK's (read, write) streams to one server


def stdio_transport(command: str, args: list[str], env: dict[str, str] | None, log_file: Path) -> Transport:
    """The server started as ``command`` ``args`` (with ``env``), spoken to over its stdio; its stderr appended to
    ``log_file`` (a server run again, or by another process of the run, adds to the same file)."""
    @asynccontextmanager
    async def open_streams() -> AsyncIterator[Any]:
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(log_file, "a", encoding="utf-8") as errlog:
            async with stdio_client(StdioServerParameters(command=command, args=args, env=env),
                                    errlog=errlog) as streams:
                yield streams
    return open_streams


def default_log_file(command: str, args: list[str], key: tuple) -> Path:
    """``<run folder>/mcp/<script>-<hash of the server's settings>.log`` (module doc): one file per server."""
    folder = Path(os.environ.get(RUN_DIR_ENV) or Path(tempfile.gettempdir()) / "zerotir") / "mcp"
    stem = Path(args[0] if args else command).stem or "server"
    return folder / f"{stem}-{hashlib.sha1(repr(key).encode()).hexdigest()[:8]}.log"


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
    """One tool of an MCP server (built by ``MCPTools.expand``): called on the server as ``listed.name``, written
    by the model as ``name``."""

    def __init__(self, server: MCPConnection, listed: Any, timeout: float, name: str):
        self.server, self.timeout, self.remote = server, timeout, listed.name
        self.name, self.description = name, listed.description or ""
        self.parameters = dict(listed.input_schema)

    async def call(self, arguments: dict[str, Any]) -> Observation:
        try:
            result = await self.server.call(self.remote, arguments, self.timeout)
        except asyncio.TimeoutError:
            return Observation(f"Error: the tool {self.name!r} did not answer within {self.timeout} s.",
                               STATUS_TIMEOUT)
        except Exception as error:  # the server died or refused the request
            return Observation(f"Error: the tool {self.name!r} is unavailable ({type(error).__name__}: {error}).",
                               STATUS_TOOL_ERROR)
        from mcp.types import TextContent

        text = "\n".join(part.text if isinstance(part, TextContent) else f"[{part.type}]" for part in result.content)
        return Observation(text, STATUS_ERROR if result.is_error else "ok")


def model_names(listed: list[str], where: str, rename: dict[str, str] | None, prefix: str,
                include: list[str] | None, exclude: list[str] | None) -> dict[str, str]:
    """The server's tools the model gets, each server name -> the name the model writes, in the server's order
    (module doc). Raises ``ValueError`` naming the field for a name the server does not list."""
    if include is not None and exclude is not None:
        raise ValueError(f"mcp init_args ({where}): set one of include (the tools kept) and exclude (the tools "
                         "dropped), not both")
    if include is not None and not include:
        raise ValueError(f"mcp init_args.include ({where}) is empty: list the server's tools to keep, or drop it "
                         "to keep them all")
    for field, names in (("include", include), ("exclude", exclude), ("rename", list(rename or {}))):
        for name in names or ():
            if name not in listed:
                close = difflib.get_close_matches(name, listed, n=1, cutoff=0.5)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ValueError(f"mcp init_args.{field}: {name!r} is not a tool of the server {where}{hint} "
                                 f"(its tools: {', '.join(listed)}; use the server's names)")
    kept = [n for n in listed if (include is None or n in include) and n not in (exclude or ())]
    dropped = [n for n in rename or {} if n not in kept]
    if dropped:
        raise ValueError(f"mcp init_args.rename: {', '.join(map(repr, dropped))} renamed but not kept (include / "
                         f"exclude drop it): rename only the tools the model gets")
    rename = rename or {}
    return {n: rename[n] if n in rename else prefix + n for n in kept}


class MCPTools(Tool):
    """Every tool of one MCP server (or those selected): started by ``command`` ``args`` (stdio) or running at
    ``url`` (streamable HTTP); exactly one of the two is set (module doc). Connected at ``start``, ended at ``close``.

    Args:
        command: the program that runs the server over stdio (e.g. ``python``, or another environment's
            ``/path/to/venv/bin/python``).
        args: its arguments (e.g. the server script); with ``command`` only.
        env: the server's environment (None: the SDK's default, a few safe variables); with ``command`` only.
        url: the endpoint of a server over streamable HTTP (e.g. ``http://127.0.0.1:8000/mcp``).
        timeout: seconds one call may take (over HTTP also the bound of connecting and writing).
        start_timeout: seconds the server may take to start (or answer) and list its tools.
        rename: server tool name -> the name the model writes (as is: ``prefix`` is not added to it).
        prefix: put before the name of every tool not in ``rename`` (e.g. ``calc_``).
        include: the server's tools to keep (by the server's names; None: all).
        exclude: the server's tools to drop (by the server's names); not with ``include``.
        log_file: where a stdio server's stderr goes (None: ``<run folder>/mcp/<script>-<hash>.log``); with
            ``command`` only.
    """

    listed_at_start = True  # its tools are the server's, known once connected

    def __init__(self, command: str | None = None, args: list[str] | None = None,
                 env: dict[str, str] | None = None, url: str | None = None, timeout: float = 30.0,
                 start_timeout: float = 30.0, rename: dict[str, str] | None = None, prefix: str = "",
                 include: list[str] | None = None, exclude: list[str] | None = None, log_file: str | None = None):
        if (command is None) == (url is None):
            raise ValueError(f"mcp init_args: set exactly one of command (a server started over stdio) and url (a "
                             f"server over streamable HTTP); got {'both' if command else 'neither'}")
        if url is not None and (args or env or log_file):
            raise ValueError("mcp init_args: args, env and log_file belong to a stdio server (command); a server "
                             "at url runs already and keeps its own log: drop them")
        if timeout <= 0 or start_timeout <= 0:
            raise ValueError(f"mcp init_args: timeout={timeout} and start_timeout={start_timeout} must be > 0")
        if url is not None:
            where, transport = f"url={url!r}", http_transport(url, timeout)
            self.log_path: Path | None = None
        else:
            argv = list(args or ())
            key = ("stdio", command, tuple(argv), tuple(sorted((env or {}).items())))
            self.log_path = Path(log_file) if log_file else default_log_file(command, argv, key)
            where, transport = f"command={command!r} {argv}", stdio_transport(command, argv, env, self.log_path)
        self.where, self.transport, self.start_timeout = where, transport, start_timeout
        self.selection = (rename, prefix, include, exclude)
        self.server: MCPConnection | None = None  # connected by start
        self.names: dict[str, str] = {}  # the server's name -> the model's, of the tools kept (start)
        self.timeout, self.name = timeout, f"mcp:{url or command}"

    def start(self) -> None:
        """Start (stdio) or reach (HTTP) the server, list its tools and choose those the model gets; raises
        ``ValueError`` naming the field when it does not answer or a chosen name is not the server's."""
        if self.server is not None:
            return
        server = MCPConnection(self.transport, self.where, self.start_timeout)
        try:
            self.names = model_names([t.name for t in server.tools], self.where, *self.selection)
        except ValueError:
            server.close()
            raise
        self.server = server
        if self.log_path is not None:
            log.info("mcp: the server %s writes its stderr to %s", self.where, self.log_path)

    def expand(self) -> list[Tool]:
        if self.server is None:
            raise RuntimeError(f"mcp {self.where}: its tools are listed once started (Toolbox.start)")
        return [MCPTool(self.server, listed, self.timeout, self.names[listed.name])
                for listed in self.server.tools if listed.name in self.names]

    def close(self) -> None:
        """End the session (a stdio server's process ends with it)."""
        server, self.server = self.server, None
        if server is not None:
            server.close()
