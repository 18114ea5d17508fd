"""Each server's own snippet uids: reserved on the host, so two servers never share a process budget."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import httpx
import pytest

from sandbox import ExecResult, SandboxClient, local_sandbox
from sandbox.uids import BLOCK, FIRST_UID, reserve
from tests.sandbox.conftest import BYPASS, HostFiles, Server, _process_table


def test_two_reservations_get_disjoint_blocks_and_a_released_block_is_taken_again(tmp_path: Path) -> None:
    first = reserve(2, None, str(tmp_path))
    second = reserve(2, None, str(tmp_path))
    assert (first.base, second.base) == (FIRST_UID, FIRST_UID + BLOCK)
    first.release()
    assert reserve(2, None, str(tmp_path)).base == FIRST_UID


def test_a_set_uid_base_held_by_another_server_is_an_error_naming_the_field(tmp_path: Path) -> None:
    held = reserve(4, 70000, str(tmp_path))
    with pytest.raises(ValueError, match=r"ExecConfig\.uid_base: uid 70003 of 70003\.\.70004 is used by another"):
        reserve(2, 70003, str(tmp_path))
    held.release()
    assert reserve(2, 70003, str(tmp_path)).base == 70003


def test_more_workers_than_a_block_is_an_error_naming_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="run fewer workers per server"):
        reserve(BLOCK + 1, None, str(tmp_path))


#: Holds the snippet uid's whole process budget (itself and max_processes - 1 sleeping children) until released.
HOLD_BUDGET = BYPASS + """
import time
held = 0
while True:
    try:
        if o.fork() == 0:
            time.sleep(60)
            o._exit(0)
        held += 1
    except OSError:
        break
while not o.path.exists({release!r}):
    time.sleep(0.02)
print(held)
"""
FORK_ONE = BYPASS + """
try:
    pid = o.fork()
    if pid == 0:
        o._exit(0)
    o.waitpid(pid, 0)
    print("forked")
except OSError as e:
    print("fork failed:", e.errno)
"""


def test_a_snippet_holding_its_process_budget_on_one_server_leaves_another_servers_fork_alone(
        sandbox_server: Server, host_files: HostFiles) -> None:
    """Two servers sharing uid 61000: a snippet of one at its 16 processes makes the other's fork() fail (EAGAIN)."""
    sandbox_server.require("uid_drop")
    release = os.path.join(host_files.extra_ro, "release-the-budget")
    held: list[ExecResult] = []

    async def hold_both_workers() -> None:  # both workers of the session server: every uid it uses is full
        async with SandboxClient(sandbox_server.url, retries=0) as client:
            held.extend(await asyncio.gather(*(client.run(HOLD_BUDGET.format(release=release), run_timeout=60)
                                               for _ in range(2))))

    holder = threading.Thread(target=asyncio.run, args=(hold_both_workers(),))
    with local_sandbox(workers=1, preload=[], preamble=None, allow_imports=["*"], startup_timeout=90,
                       log_level="warning") as urls:
        other = Server(urls[0], httpx.get(urls[0] + "/health", timeout=10, trust_env=False).json())
        holder.start()
        try:
            full = 2 * sandbox_server.health["limits"]["max_processes"]
            mine = set(sandbox_server.health["sandbox_uids"])
            deadline = time.monotonic() + 60
            while sum(uid in mine for _, uid in _process_table().values()) < full and time.monotonic() < deadline:
                time.sleep(0.05)
            forked = other.run(FORK_ONE)
        finally:
            Path(release).touch()
            holder.join(90)
            os.unlink(release)
        assert forked.stdout == "forked\n", forked
        assert not set(other.health["sandbox_uids"]) & mine, (other.health["sandbox_uids"], mine)
        assert other.run("print(1+1)").stdout == "2\n"
    assert [r.stdout for r in held] == [f"{full // 2 - 1}\n"] * 2, held
    assert sandbox_server.run("print(1+1)").stdout == "2\n"
