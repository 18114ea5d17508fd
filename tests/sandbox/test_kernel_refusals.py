"""The kernel interfaces the sandbox's seccomp filter refuses a snippet, each tried from inside one against a real
server process: the ones a snippet could reach the host with (SysV IPC, keyrings, memfd, namespaces, ptrace, socket
families past its network namespace) and the ones two snippets could signal each other through (locks and watches
on a shared file). Every test asks for seccomp (``Server.require``) and checks the service answers afterwards.
"""

from __future__ import annotations

import ast
import asyncio
import fcntl
import os
import sys

from sandbox import ExecResult, SandboxClient
from tests.sandbox.conftest import BYPASS, Server


#: SysV IPC, a user key, a memfd, a new namespace, ptrace: each call's return value and errno (1 is EPERM).
KERNEL_CALLS = BYPASS + """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
def errno_of(rc):
    return (rc, ctypes.get_errno()) if rc == -1 else (rc, 0)
calls = {
    "shmget": lambda: libc.shmget(0x4A45, 4096, 0o1666),
    "msgget": lambda: libc.msgget(0x4A45, 0o1666),
    "semget": lambda: libc.semget(0x4A45, 1, 0o1666),
    "add_key": lambda: libc.syscall(248, b"user", b"zerotir", b"left", 4, ctypes.c_long(-4)),
    "keyctl": lambda: libc.syscall(250, 0, ctypes.c_long(-4), 0),
    "memfd_create": lambda: libc.syscall(319, b"x", 0),
    "unshare": lambda: libc.unshare(0x10000000),
    "ptrace": lambda: libc.ptrace(0, 0, 0, 0),
}
print({name: errno_of(call())[1] for name, call in calls.items()})
"""


def test_ipc_keyrings_memfd_namespaces_and_ptrace_are_refused_and_nothing_reaches_the_host(
        sandbox_server: Server) -> None:
    sandbox_server.require("seccomp", "ipc_namespace")
    result = sandbox_server.run(KERNEL_CALLS)
    with open("/proc/sysvipc/shm") as f:  # the host's IPC namespace: the child's own one is gone with it
        assert f"{0x4A45}" not in [line.split()[0] for line in f.read().splitlines()[1:]]
    assert result.ok and ast.literal_eval(result.stdout) == {
        name: 1 for name in ("shmget", "msgget", "semget", "add_key", "keyctl", "memfd_create", "unshare", "ptrace")
    }, result


#: Each socket family a snippet might reach past its network namespace with, and the errno socket() gives (1 is
#: EPERM). A vsock with its upper 32 bits set checks that the filter does not compare only the low half the kernel
#: reads. AF_UNIX and netlink's NETLINK_ROUTE (its own namespace's interfaces) stay allowed.
SOCKET_FAMILIES = BYPASS + """
import ctypes, socket
libc = ctypes.CDLL(None, use_errno=True)
def errno_of(family, kind, proto=0):
    try:
        socket.socket(family, kind, proto).close()
        return 0
    except OSError as e:
        return e.errno
rc = libc.syscall(41, ctypes.c_long(0x100000000 + socket.AF_VSOCK), socket.SOCK_STREAM, 0)
print({"vsock": errno_of(socket.AF_VSOCK, socket.SOCK_STREAM), "vsock_dgram": errno_of(socket.AF_VSOCK, 2),
       "vsock_upper_bits": ctypes.get_errno() if rc == -1 else 0,
       "inet": errno_of(socket.AF_INET, socket.SOCK_STREAM), "inet6": errno_of(socket.AF_INET6, socket.SOCK_DGRAM),
       "packet": errno_of(17, socket.SOCK_RAW), "alg": errno_of(38, socket.SOCK_SEQPACKET),
       "netlink_uevent": errno_of(socket.AF_NETLINK, socket.SOCK_DGRAM, 15),
       "unix": errno_of(socket.AF_UNIX, socket.SOCK_STREAM), "netlink_route": errno_of(socket.AF_NETLINK, 3, 0)})
"""


def test_socket_families_but_unix_and_netlink_route_are_refused(sandbox_server: Server) -> None:
    sandbox_server.require("seccomp")
    result = sandbox_server.run(SOCKET_FAMILIES)
    assert result.ok, result
    refused = ("vsock", "vsock_dgram", "vsock_upper_bits", "inet", "inet6", "packet", "alg", "netlink_uevent")
    assert ast.literal_eval(result.stdout) == {**dict.fromkeys(refused, 1), "unix": 0, "netlink_route": 0}, result
    assert sandbox_server.run("print(1+1)").stdout == "2\n"


#: Snippet A of two running at once: locks the Python binary and watches a stdlib file for opens, then waits.
LOCK_AND_WATCH = BYPASS + """
import ctypes, fcntl, os, select, sys
libc = ctypes.CDLL(None, use_errno=True)
def errno_of(step):
    try:
        step()
        return 0
    except OSError as e:
        return e.errno
binary = open(sys.executable, "rb")
seen = {"flock": errno_of(lambda: fcntl.flock(binary, fcntl.LOCK_EX))}
watch = libc.inotify_init1(0)
seen["inotify_init1"] = ctypes.get_errno() if watch == -1 else 0
if watch >= 0:
    libc.inotify_add_watch(watch, os.__file__.encode(), 0x20)  # IN_OPEN
    seen["saw_an_open"] = bool(select.select([watch], [], [], 1.5)[0])
print(seen)
"""
#: Snippet B: opens that stdlib file for a second and tests the lock without waiting.
OPEN_AND_TEST = BYPASS + """
import fcntl, os, sys, time
binary = open(sys.executable, "rb")
try:
    fcntl.flock(binary, fcntl.LOCK_SH | fcntl.LOCK_NB)
    lock = 0
except OSError as e:
    lock = e.errno
for _ in range(100):
    open(os.__file__, "rb").close()
    time.sleep(0.01)
print({"flock": lock})
"""


def test_two_snippets_at_once_can_neither_lock_nor_watch_a_shared_file(sandbox_server: Server) -> None:
    """flock on the Python binary is a channel between workers (held or not); inotify shows the other's opens."""
    sandbox_server.require("seccomp")

    async def both() -> list[ExecResult]:
        async with SandboxClient(sandbox_server.url, retries=0) as client:
            return list(await asyncio.gather(client.run(LOCK_AND_WATCH), client.run(OPEN_AND_TEST)))

    watcher, opener = asyncio.run(both())
    assert watcher.ok and opener.ok, (watcher, opener)
    assert ast.literal_eval(watcher.stdout) == {"flock": 1, "inotify_init1": 1}, watcher
    assert ast.literal_eval(opener.stdout) == {"flock": 1}, opener
    assert sandbox_server.run("print(1+1)").stdout == "2\n"


#: Every other lock or watch on the Python binary: fcntl record locks (classic and OFD), F_GETLK (which reports
#: another process's lock), a lease, dnotify, inotify_init, fanotify; (return value, errno) of each.
OTHER_LOCKS = BYPASS + """
import ctypes, fcntl, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open(sys.executable, os.O_RDONLY)
folder = os.open(os.path.dirname(os.__file__), os.O_RDONLY)
lock = struct.pack("hhqqi", fcntl.F_RDLCK, 0, 0, 0, 0)
probe = struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 0, 0)
def call(fd, command, arg):
    rc = libc.fcntl(fd, command, ctypes.c_char_p(arg) if isinstance(arg, bytes) else arg)
    return ctypes.get_errno() if rc == -1 else 0
def upper_bits(fd, command, arg):  # the raw syscall (x86_64's 72): the C wrapper would cut the command to an int
    rc = libc.syscall(72, fd, ctypes.c_long(0x100000000 + command), ctypes.c_char_p(arg))
    return ctypes.get_errno() if rc == -1 else 0
print({"F_SETLK": call(fd, fcntl.F_SETLK, lock), "F_SETLK_upper_bits": upper_bits(fd, fcntl.F_SETLK, lock),
       "F_GETLK": call(fd, fcntl.F_GETLK, probe), "F_OFD_SETLK": call(fd, 37, lock), "F_OFD_GETLK": call(fd, 36, probe),
       "F_SETLEASE": call(fd, 1024, fcntl.F_RDLCK), "F_NOTIFY": call(folder, 1026, 0x1),
       "inotify_init": (libc.inotify_init() == -1) and ctypes.get_errno(),
       "fanotify_init": (libc.fanotify_init(0x4, 0) == -1) and ctypes.get_errno()})
"""


def test_record_locks_leases_dnotify_and_fanotify_are_refused_while_the_host_holds_locks(
        sandbox_server: Server) -> None:
    sandbox_server.require("seccomp")
    with open(os.path.realpath(sys.executable), "rb") as binary:
        fcntl.flock(binary, fcntl.LOCK_SH)  # what a snippet on another worker would hold ...
        fcntl.lockf(binary, fcntl.LOCK_SH)  # ... and the record lock F_GETLK would report
        result = sandbox_server.run(OTHER_LOCKS)
    assert result.ok, result
    assert ast.literal_eval(result.stdout) == dict.fromkeys(
        ("F_SETLK", "F_SETLK_upper_bits", "F_GETLK", "F_OFD_SETLK", "F_OFD_GETLK", "F_SETLEASE", "F_NOTIFY",
         "inotify_init", "fanotify_init"), 1), result
    assert sandbox_server.run("print(1+1)").stdout == "2\n"
