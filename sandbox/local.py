"""``local_sandbox()``: start ``python -m sandbox serve`` on a free loopback port for the duration of a block.

This is the embedded default that lets ``zerotir fit`` run with no setup; a configured URL list skips it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import IO, Any

import httpx

from sandbox.config import ExecConfig

_SERVER_OPTIONS = {"queue_size", "startup_timeout", "log_level", "head_timeout"}
_LIMIT_OPTIONS = {f.name for f in dataclasses.fields(ExecConfig)}


def _argv_for(workers: int | None, port: int, listen_fd: int | None, options: dict[str, Any],
              host: str = "127.0.0.1") -> list[str]:
    argv = [sys.executable, "-m", "sandbox", "serve", "--host", host, "--port", str(port),
            "--exit_with_parent", str(os.getpid())]  # no orphaned server if this process is killed
    if listen_fd is not None:
        argv += ["--listen_fd", str(listen_fd)]
    if workers is not None:
        argv += ["--workers", str(workers)]
    for key, value in options.items():
        if key in _SERVER_OPTIONS:
            flag = f"--{key}"
        elif key in _LIMIT_OPTIONS:
            flag = f"--limits.{key}"
        else:
            known = ", ".join(sorted(_SERVER_OPTIONS | _LIMIT_OPTIONS))
            raise TypeError(f"local_sandbox() got an unknown server option {key!r}; known options: {known}")
        # Strings go as they are (jsonargparse keeps a str option verbatim); everything else as JSON.
        argv += [flag, value if isinstance(value, str) else json.dumps(value)]
    return argv


@contextlib.contextmanager
def local_sandbox(workers: int | None = None, port: int | None = None,
                  **server_options: Any) -> Iterator[list[str]]:
    """Run a sandbox server on 127.0.0.1 for the duration of the ``with`` block; yields ``[url]``.

    Args:
        workers: Worker processes (default: one per core).
        port: TCP port; None binds a free one here and hands the listening socket to the server (no race).
        **server_options: ``queue_size``, ``startup_timeout``, ``log_level``, ``head_timeout``, or any
            :class:`ExecConfig` field (``run_timeout=10``, ``allow_imports=["*"]``, ``extra_ro=["/data/tables"]``
            to expose a folder read-only, ...).

    Raises:
        RuntimeError: The server did not answer ``/health`` in time or exited; the message holds its output.
    """
    _argv_for(workers, 0, None, server_options)  # an unknown option is refused before anything starts
    sock = listening_socket("127.0.0.1", 0) if port is None else None
    url = f"http://127.0.0.1:{sock.getsockname()[1] if sock is not None else port}"
    with tempfile.TemporaryFile() as log:
        try:
            proc = start_server(sock, workers, server_options, log, port=port)
        finally:
            if sock is not None:
                sock.close()  # the server holds its own copy
        try:
            yield [url]
        finally:
            stop_process_group(proc)


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host:port`` (0: a free port) that a server started by :func:`start_server`
    inherits. Whoever keeps it open keeps the address: a server started again on it answers at the same URL, and
    connections made while none runs wait in its backlog instead of being refused."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


def start_server(sock: socket.socket | None, workers: int | None, options: dict[str, Any], log: IO[bytes], *,
                 port: int | None = None) -> subprocess.Popen:
    """Start ``python -m sandbox serve`` on ``sock`` (or on ``port`` of 127.0.0.1 when ``sock`` is None) and wait
    until it answers ``/health``; its output goes to ``log``. The process is its own session's leader, exits with
    this one, and is stopped by :func:`stop_process_group`.

    Raises:
        RuntimeError: The server did not answer ``/health`` in time or exited; the message holds its output.
    """
    startup_timeout = float(options.get("startup_timeout", 120.0))
    host, bound = sock.getsockname()[:2] if sock is not None else ("127.0.0.1", port)
    argv = _argv_for(workers, bound, sock.fileno() if sock is not None else None, options, host)
    env = dict(os.environ)
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True, pass_fds=(sock.fileno(),) if sock is not None else ())
    _wait_until_healthy(proc, f"http://{host}:{bound}", startup_timeout, log)
    return proc


def _wait_until_healthy(proc: subprocess.Popen, url: str, timeout: float, log: IO[bytes]) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(trust_env=False) as http:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the local sandbox server exited with code {proc.returncode} during start-up. "
                                   f"Its output:\n{_tail(log)}")
            try:
                if http.get(url + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
    stop_process_group(proc)
    raise RuntimeError(f"the local sandbox server at {url} did not answer /health within {timeout:.0f} s "
                       f"(raise startup_timeout on a slow machine). Its output:\n{_tail(log)}")


def stop_process_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the server (its graceful shutdown stops its workers); SIGKILL its whole group if it does not exit.

    Workers die with the server in any case (parent-death signal), and each running snippet with its worker.
    """
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the group still has its leader: the pgid cannot be reused
        proc.wait()


def _tail(log: IO[bytes], limit: int = 6000) -> str:
    log.flush()
    log.seek(0)
    return log.read().decode(errors="replace")[-limit:]
