"""A seccomp filter refusing the system calls math code never needs, built with libseccomp through ctypes.

Refused (``EPERM``): making or entering namespaces and mounting (``unshare``, ``setns``, ``mount`` and the new mount
API, ``clone`` with a namespace flag), keyrings (``add_key``, ``request_key``, ``keyctl``: the sandbox uid's user
keyring would otherwise carry a key from one snippet to the next), SysV and POSIX message queues, shared memory and
semaphores, ``memfd_create`` (memory outside the address-space limit), ``ptrace`` and ``process_vm_*``, ``bpf``,
``perf_event_open``, ``userfaultfd`` and io_uring; file locks and file watches (``flock``, ``fcntl`` record locks,
leases and ``F_NOTIFY``, ``inotify_*``, ``fanotify_*``): every worker exposes the same host files (the Python
installation), so two snippets running at once on different workers could signal each other by locking the
Python binary, or see each other's opens through inotify. ``clone3`` answers ``ENOSYS``, so the C library falls back to
``clone``, whose flags the filter can read.

Sockets: only ``AF_UNIX`` (pipes between a snippet's own processes, asyncio's self-pipe) and ``AF_NETLINK`` with
``NETLINK_ROUTE`` (the worker's own network namespace: ``socket.if_nameindex`` lists its ``lo``). Every other
family is refused, whatever the network namespace would make of it: ``AF_VSOCK`` reaches the hypervisor and the
host's vsock services from outside any network namespace, ``AF_INET``/``AF_INET6`` find only a loopback that is down
(refused all the same), and the rarer families are kernel attack surface math never needs. A family is an ``int``
while the filter sees 64 bits, so every value of 17 or more (upper bits set included) is refused outright.

libseccomp (``libseccomp.so.2``, installed wherever Docker or systemd are) resolves the names for the running
architecture and compiles the rules; it is called through ctypes because the Python bindings are packaged only for
the system interpreter. The worker builds the program once (:func:`build_filter`, :class:`Filter`) and each child
loads it with one ``prctl`` (:meth:`Filter.install`), the last step of its set-up, after ``no_new_privs``.
"""

from __future__ import annotations

import ctypes
import errno
import os

from collections.abc import Callable

from sandbox.isolation import (CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWPID, PR_SET_NO_NEW_PRIVS, prctl,
                               unshare)

REFUSED = (
    "unshare", "setns", "mount", "umount2", "pivot_root", "fsopen", "fsconfig", "fsmount", "move_mount", "open_tree",
    "add_key", "request_key", "keyctl",
    "shmget", "shmat", "shmctl", "shmdt", "msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop", "semctl",
    "semtimedop", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr",
    "memfd_create", "memfd_secret", "ptrace", "process_vm_readv", "process_vm_writev", "bpf", "perf_event_open",
    "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "flock", "inotify_init", "inotify_init1", "inotify_add_watch", "fanotify_init", "fanotify_mark",
)
#: fcntl commands refused: record locks (classic and open-file-description), leases and dnotify.
#: F_GETLK, F_SETLK, F_SETLKW, F_OFD_GETLK, F_OFD_SETLK, F_OFD_SETLKW, F_SETLEASE, F_NOTIFY.
_REFUSED_FCNTL = (5, 6, 7, 36, 37, 38, 1024, 1026)
#: clone flags that make a namespace (user, uts, ipc, cgroup, time too): a clone with any of them is refused.
_NEW_NAMESPACE_FLAGS = (CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWIPC, 0x10000000, 0x04000000, 0x02000000,
                        0x00000080)
AF_UNIX, AF_NETLINK, NETLINK_ROUTE = 1, 16, 0
#: Every socket family below 17 but the allowed ones (17 and above are refused by one rule).
_REFUSED_FAMILIES = tuple(f for f in range(AF_NETLINK) if f != AF_UNIX)
_ACT_ALLOW = 0x7FFF0000
_SCMP_CMP_NE, _SCMP_CMP_EQ, _SCMP_CMP_GE, _SCMP_CMP_MASKED_EQ = 1, 4, 5, 7
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2


def _act_errno(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _libseccomp() -> ctypes.CDLL:
    name = "libseccomp.so.2"  # by soname: find_library would run ldconfig, absent from the minimal root
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as e:
        raise OSError(f"libseccomp is not installed (apt-get install libseccomp2): {e}") from e
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.POINTER(_ArgCmp)]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    return lib


def build_filter() -> bytes:
    """The compiled BPF program (``struct sock_filter`` array); raises OSError naming what failed."""
    lib = _libseccomp()
    ctx = lib.seccomp_init(_ACT_ALLOW)
    if not ctx:
        raise OSError("seccomp_init failed")
    try:
        def add(action: int, name: str, *cmps: tuple[int, ...]) -> None:
            """One rule: ``name`` gets ``action`` when every (argument, operator, value[, mask]) comparison holds."""
            number = lib.seccomp_syscall_resolve_name(name.encode())
            if number < 0:
                return  # unknown on this architecture (e.g. memfd_secret on an old libseccomp): nothing to refuse
            array = (_ArgCmp * len(cmps))(*(_ArgCmp(arg, op, *_datums(rest)) for arg, op, *rest in cmps))
            rc = lib.seccomp_rule_add_array(ctx, action, number, len(cmps), array if cmps else None)
            if rc < 0:
                raise OSError(-rc, f"seccomp rule for {name}: {os.strerror(-rc)}")

        eperm = _act_errno(errno.EPERM)
        for name in REFUSED:
            add(eperm, name)
        for flag in _NEW_NAMESPACE_FLAGS:
            add(eperm, "clone", (0, _SCMP_CMP_MASKED_EQ, flag, flag))
        add(_act_errno(errno.ENOSYS), "clone3")
        for command in _REFUSED_FCNTL:  # the kernel reads a 32-bit command: compare only those bits
            add(eperm, "fcntl", (1, _SCMP_CMP_MASKED_EQ, command, 0xFFFFFFFF))
        for name in ("socket", "socketpair"):
            add(eperm, name, (0, _SCMP_CMP_GE, AF_NETLINK + 1))
            for family in _REFUSED_FAMILIES:
                add(eperm, name, (0, _SCMP_CMP_EQ, family))
        add(eperm, "socket", (0, _SCMP_CMP_EQ, AF_NETLINK), (2, _SCMP_CMP_NE, NETLINK_ROUTE))
        add(eperm, "socketpair", (0, _SCMP_CMP_EQ, AF_NETLINK))
        read_fd, write_fd = os.pipe()
        try:
            rc = lib.seccomp_export_bpf(ctx, write_fd)
            os.close(write_fd)
            write_fd = -1
            if rc < 0:
                raise OSError(-rc, f"seccomp_export_bpf: {os.strerror(-rc)}")
            program = b""
            while chunk := os.read(read_fd, 65536):
                program += chunk
        finally:
            os.close(read_fd)
            if write_fd >= 0:
                os.close(write_fd)
    finally:
        lib.seccomp_release(ctx)
    return program


def _datums(rest: list[int]) -> tuple[int, int]:
    """libseccomp's two operands: (value, unused) for a comparison, (mask, value) for ``SCMP_CMP_MASKED_EQ``."""
    return (rest[1], rest[0]) if len(rest) == 2 else (rest[0], 0)


class Filter:
    """A compiled program ready to load: built in the worker, so a child's :meth:`install` is one ``prctl``."""

    def __init__(self, program: bytes) -> None:
        self._buffer = ctypes.create_string_buffer(program, len(program))
        self._prog = _SockFprog(len(program) // 8, ctypes.cast(self._buffer, ctypes.c_void_p))
        self._prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here, not in every child
        self._args = (_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.c_void_p(ctypes.addressof(self._prog)), 0, 0)

    def install(self) -> None:
        """Load the filter into this process (after ``no_new_privs``); raises OSError if the kernel refuses it."""
        if self._prctl(*self._args) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"loading the seccomp filter: {os.strerror(err)}")


def probe_child_layers(seccomp: Filter | None) -> tuple[str | None, str | None]:
    """Fork a probe that enters its own IPC namespace and loads ``seccomp``, as each child will; returns why each
    failed (None when it works): (ipc_namespace, seccomp)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the probe child
        try:
            os.close(read_fd)
            reasons = [_try(lambda: unshare(CLONE_NEWIPC))]
            if seccomp is None:
                reasons.append("no filter")
            else:
                prctl(PR_SET_NO_NEW_PRIVS, 1)
                reasons.append(_try(seccomp.install) or _refused_after_install())
            os.write(write_fd, "\n".join(r or "" for r in reasons).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as f:
        answer = f.read().decode().split("\n")
    os.waitpid(pid, 0)
    if len(answer) != 2:
        return "the probe child died", "the probe child died"
    ipc, filt = (a or None for a in answer)
    return ipc, filt


def _try(step: Callable[[], None]) -> str | None:
    try:
        step()
        return None
    except OSError as e:
        return str(e)


def _refused_after_install() -> str | None:
    try:
        unshare(CLONE_NEWIPC)
    except PermissionError:
        return None
    return "the filter loaded but unshare still works"
