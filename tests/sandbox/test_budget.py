"""The snippet's budget as a whole where cgroup v2 is absent: cgroup v1's ``memory`` and ``pids`` hierarchies.

Rlimits are per process: forks each fit the budget, and socket buffers are in no process's address space. These
run against a real server on the host's own cgroups (root; skipped, with the reason, where no cgroup layer is on).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import pytest

from sandbox import local_sandbox

#: Four children of 200 MB each under a 256 MB budget: each fits per process, the snippet as a whole does not.
FORKS = """
import os, time
pids = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        b = bytearray(200 * 2**20)
        b[::4096] = b'x' * len(b[::4096])
        time.sleep(3)
        os._exit(0)
    pids.append(pid)
lived = sum(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0 for pid in pids)
print("lived", lived)
"""

#: Kernel memory: 400 MB queued in socketpairs (4 MB send buffers), outside every process's address space.
SOCKETS = """
import socket
pairs, queued = [], 0
while queued < 400 * 2**20:
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    a.setblocking(False)
    try:
        while True:
            queued += a.send(b'x' * 65536)
    except BlockingIOError:
        pass
    pairs.append((a, b))
print("queued", queued >> 20, "MB")
"""


#: A host where the layer must be on: root, with cgroup v2 or v1's memory and pids hierarchies writable.
HOST_HAS_CGROUPS = os.geteuid() == 0 and (os.path.exists("/sys/fs/cgroup/cgroup.controllers") or all(
    os.access(f"/sys/fs/cgroup/{c}/tasks", os.W_OK) for c in ("memory", "pids")))


@pytest.fixture(scope="module")
def budget_server() -> Iterator[str]:
    with local_sandbox(workers=1, allow_imports=["*"], refused_calls=[], log_level="warning",
                       startup_timeout=90) as urls:
        layer = httpx.get(urls[0] + "/health", timeout=10, trust_env=False).json()["protections"]["cgroup_budget"]
        if layer != "on" and not HOST_HAS_CGROUPS:
            pytest.skip(f"no cgroup layer on this host (not root, or neither v2 nor v1 mounted): {layer}")
        assert layer == "on", f"the host has cgroups, but the layer is {layer}"
        yield urls[0]


def run(url: str, code: str, memory_mb: int) -> dict:
    body = {"language": "python", "code": code, "memory_limit_MB": memory_mb, "run_timeout": 20}
    return httpx.post(url + "/run_code", json=body, timeout=60, trust_env=False).json()


def test_health_names_the_cgroup_version_that_holds_the_budget(budget_server: str) -> None:
    health = httpx.get(budget_server + "/health", timeout=10, trust_env=False).json()
    assert health["budget"] in ("cgroup v2", "cgroup v1 (memory, pids)")


@pytest.mark.parametrize(("code", "memory_mb"), [(FORKS, 256), (SOCKETS, 128)], ids=["forks", "socketpairs"])
def test_the_snippet_as_a_whole_stays_under_its_budget(budget_server: str, code: str, memory_mb: int) -> None:
    answer = run(budget_server, code, memory_mb)
    details = answer["details"]
    assert "memory" in details["limits_hit"] and details["reason"] in ("memory", "signal", "error"), answer
    assert answer["run_result"]["stdout"] in ("", *(f"lived {n}\n" for n in range(4))), answer  # not 4, not queued
    benign = run(budget_server, "print(1+1)", 128)  # after the socketpairs: the same limits, the same v1 cgroups
    assert (benign["status"], benign["run_result"]["stdout"], benign["details"]["limits_hit"]) == ("Success", "2\n",
                                                                                                   [])
