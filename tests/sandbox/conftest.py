"""A real sandbox server process shared by the sandbox tests, and helpers to inspect what it leaves behind."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from sandbox import ExecResult, SandboxClient, local_sandbox
from sandbox.config import DEFAULT_ALLOWED_IMPORTS

SECRET_NAME = "ZEROTIR_SANDBOX_TEST_SECRET"
SECRET_VALUE = f"secret-{uuid.uuid4().hex}"
QUEUE_SIZE = 8
WORKERS = 2
MAX_OUTPUT_BYTES = 4096
# The adversarial snippets need os, socket, ... to reach the kernel layers; `shutil` stays out for the refusal test.
TEST_IMPORTS = [*DEFAULT_ALLOWED_IMPORTS, "os", "socket", "signal", "ctypes", "pathlib", "tempfile", "subprocess",
                "threading", "ast", "wave", "fcntl", "select", "struct"]
TEST_REFUSED_CALLS = ["eval"]
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: Steps around the static check in one line, as a curious model would (the kernel layers must hold regardless).
BYPASS = "o = getattr(__builtins__, '__imp' + 'ort__')('os')\n"


@dataclass
class HostFiles:
    """Host files a snippet must not see (canaries), and a folder exposed to it on purpose with ``extra_ro``.

    Attributes:
        canary_text: The content of every canary (unique per session).
        tmp_canary: A world-readable file in a world-readable folder under /tmp.
        cwd_canary: A world-readable file in the server's working directory.
        data_file: The checkout's own held-out data (questions with their answers).
        extra_ro: A world-readable folder passed as ``extra_ro``, holding ``shared.txt``.
        extra_ro_file: A single file passed as ``extra_ro``; its folder also holds a canary, which stays hidden.
    """

    canary_text: str
    tmp_canary: str
    cwd_canary: str
    data_file: str
    extra_ro: str
    extra_ro_file: str


def _world_readable_file(folder: str, name: str, text: str) -> str:
    os.chmod(folder, 0o755)
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o644)
    return path


@pytest.fixture(scope="session")
def host_files() -> Iterator[HostFiles]:
    """Create the canaries and the ``extra_ro`` folder for the session; remove them after it."""
    text = f"canary-{uuid.uuid4().hex}"
    kinds = ("canary", "server-cwd", "extra-ro", "extra-file")
    folders = [tempfile.mkdtemp(prefix=f"zerotir-{kind}-") for kind in kinds]
    try:
        _world_readable_file(folders[3], "answers.jsonl", text)
        yield HostFiles(text, _world_readable_file(folders[0], "answers.jsonl", text),
                        _world_readable_file(folders[1], "notes.txt", text),
                        os.path.join(CHECKOUT, "data", "toy", "heldout.jsonl"), folders[2],
                        _world_readable_file(folders[3], "constants.json", '{"g": 9.81}'))
    finally:
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)


@dataclass
class Server:
    """The running test server: its URL and its ``/health`` answer at start-up."""

    url: str
    health: dict[str, Any]

    @property
    def pid(self) -> int:
        """The server's process id."""
        return self.health["server_pid"]

    def require(self, *layers: str) -> None:
        """Skip the calling test, naming the reason, when a protection it checks is off on this machine."""
        off = {k: v for k, v in self.health["protections"].items() if k in layers and v != "on"}
        if off:
            pytest.skip("protection unavailable on this machine: " + "; ".join(f"{k} {v}" for k, v in off.items()))

    def reset_peak_rss(self) -> None:
        """Set the server's peak RSS (VmHWM) to its current RSS, so that ``peak_rss_bytes`` measures from now; skip
        the calling test where that is refused (it needs root)."""
        try:
            with open(f"/proc/{self.pid}/clear_refs", "w") as f:
                f.write("5")
        except OSError as e:
            pytest.skip(f"cannot reset the server's peak RSS (needs root): {e}")

    def peak_rss_bytes(self) -> int:
        """The server's peak resident memory (VmHWM) since it started or since ``reset_peak_rss``."""
        with open(f"/proc/{self.pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))

    def health_now(self) -> dict[str, Any]:
        """The server's ``/health`` right now."""
        return httpx.get(self.url + "/health", timeout=10, trust_env=False).json()

    def metrics(self) -> dict[str, Any]:
        """The server's ``/metrics`` right now."""
        return httpx.get(self.url + "/metrics", timeout=10, trust_env=False).json()

    def run(self, code: str, **kw: Any) -> ExecResult:
        """Run one snippet through the real client."""

        async def once() -> ExecResult:
            async with SandboxClient(self.url, retries=0) as client:
                return await client.run(code, **kw)

        return asyncio.run(once())


@pytest.fixture(scope="session")
def sandbox_server(host_files: HostFiles) -> Server:
    """Start ``python -m sandbox serve`` once for the whole session, with a secret in its environment, its working
    directory in the canary folder ``host_files.cwd_canary`` lies in, and ``host_files.extra_ro`` exposed."""
    previous = os.environ.get(SECRET_NAME)
    os.environ[SECRET_NAME] = SECRET_VALUE
    shared = _world_readable_file(host_files.extra_ro, "shared.txt", "shared on purpose")
    os.chmod(host_files.extra_ro, 0o777)  # writable by anyone on the host: only the read-only mount stops a write
    os.chmod(shared, 0o666)
    here = os.getcwd()
    try:
        with contextlib.ExitStack() as stack:
            os.chdir(os.path.dirname(host_files.cwd_canary))  # the server inherits it; ours comes back at once
            try:
                urls = stack.enter_context(local_sandbox(
                    workers=WORKERS, queue_size=QUEUE_SIZE, allow_imports=TEST_IMPORTS,
                    refused_calls=TEST_REFUSED_CALLS, run_timeout=2.0, max_output_bytes=MAX_OUTPUT_BYTES,
                    extra_ro=[host_files.extra_ro, host_files.extra_ro_file], startup_timeout=90,
                    log_level="warning"))
            finally:
                os.chdir(here)
            health = httpx.get(urls[0] + "/health", timeout=10, trust_env=False).json()
            yield Server(url=urls[0], health=health)
    finally:
        if previous is None:
            os.environ.pop(SECRET_NAME, None)
        else:
            os.environ[SECRET_NAME] = previous


def _process_table() -> dict[int, tuple[int, int]]:
    """{pid: (parent pid, real uid)} for every process on the machine."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            table[int(entry)] = (int(fields["PPid"]), int(fields["Uid"].split()[0]))
        except (OSError, KeyError, ValueError):
            continue  # exited while we looked
    return table


def leftover_processes(server: Server) -> list[int]:
    """Processes a snippet left: below the server's workers and their zygotes (a worker's only child), or running as
    a sandbox uid anywhere."""
    table = _process_table()
    workers = {pid for pid, (ppid, _) in table.items() if ppid == server.pid}
    workers |= {pid for pid, (ppid, _) in table.items() if ppid in workers}  # the zygotes
    uids = set(server.health["sandbox_uids"])
    left = []
    for pid, (ppid, uid) in table.items():
        if uid in uids:
            left.append(pid)
            continue
        if pid in workers:
            continue
        while ppid > 1 and ppid not in workers and ppid in table:  # walk up to see if a worker is an ancestor
            ppid = table[ppid][0]
        if ppid in workers:
            left.append(pid)
    return sorted(left)


def wait_for_no_leftovers(server: Server, timeout: float) -> list[int]:
    """Poll until no leftover process remains or ``timeout`` passes; returns what is left."""
    deadline = time.monotonic() + timeout
    left = leftover_processes(server)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = leftover_processes(server)
    return left
