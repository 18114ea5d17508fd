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


def _argv_for(workers: int | None, port: int, listen_fd: int | None, options: dict[str, Any]) -> list[str]:
    argv = [sys.executable, "-m", "sandbox", "serve", "--host", "127.0.0.1", "--port", str(port),
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
    startup_timeout = float(server_options.get("startup_timeout", 120.0))
    sock = None
    if port is None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(1024)
        sock.set_inheritable(True)
        port = sock.getsockname()[1]
    argv = _argv_for(workers, port, sock.fileno() if sock else None, server_options)
    env = dict(os.environ)
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True, pass_fds=(sock.fileno(),) if sock else ())
        finally:
            if sock is not None:
                sock.close()  # the server holds its own copy
        try:
            _wait_until_healthy(proc, url, startup_timeout, log)
            yield [url]
        finally:
            stop_process_group(proc)


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
