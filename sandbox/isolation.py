"""Kernel isolation layers for a worker and its snippet children (Linux, via libc through ctypes).

A worker calls :func:`enter_namespaces` once at start-up (after importing its modules):

- its own **network namespace**: the snippets see only a loopback interface that is down, so no connection leaves,
  not even to 127.0.0.1 of the host;
- its own **mount namespace**, in which it builds and enters the minimal root of :mod:`sandbox.rootfs` (the
  interpreter read-only and a private temp dir, nothing else of the host).

Where the minimal root cannot be built, the worker falls back to the host's tree made safe by :func:`host_layers`
(and reports ``filesystem_view: host`` with the reason): every mount remounted **read-only**, a size-capped
**tmpfs** on the worker's private temp dir, and directories that would hide the Python installation from the
snippet's uid (``/root`` is 0700 when Python lives under ``/root/.pyenv``) masked by a read-only tmpfs exposing only
the needed subdirectory.

Per snippet, :class:`PidNamespaces` gives each child a fresh **PID namespace** (the child is its init; when it exits
or is killed, the kernel kills every process left in it, double-forked daemons included), and the child drops to a
dedicated **unprivileged uid** (see :mod:`sandbox.child`).

Every layer is tried and reported; one that the platform refuses (not root, a container without CAP_SYS_ADMIN) is
reported as off with the reason, and the service runs without it.
"""

from __future__ import annotations

import ctypes
import os
import stat
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 32, 4096, 8192, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 36, 38
MNT_DETACH = 2
#: ``pivot_root(2)`` has no C library wrapper: its syscall number per architecture (``os.uname().machine``).
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "loongarch64": 41, "ppc64le": 203, "s390x": 217}
_MOUNT_FLAG_NAMES = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC}

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    """``unshare(2)``: Python 3.11 has no ``os.unshare``."""
    _check(_libc.unshare(flags), f"unshare({flags:#x})")


def setns(fd: int, nstype: int) -> None:
    """``setns(2)``."""
    _check(_libc.setns(fd, nstype), f"setns({nstype:#x})")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    """``mount(2)``; raises OSError naming the target."""
    def enc(text: str | None) -> bytes | None:
        return text.encode() if text is not None else None

    _check(_libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def umount(target: str, flags: int = 0) -> None:
    """``umount2(2)``; raises OSError naming the target."""
    _check(_libc.umount2(target.encode(), flags), f"umount {target}")


def pivot_root(new_root: str, put_old: str) -> None:
    """``pivot_root(2)``: make ``new_root`` this mount namespace's root; the old root moves to ``put_old``."""
    number = _SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise OSError(f"pivot_root: syscall number unknown for machine {os.uname().machine!r}")
    _check(_libc.syscall(number, new_root.encode(), put_old.encode()), f"pivot_root {new_root}")


def prctl(option: int, arg: int) -> None:
    """``prctl(2)`` with one argument."""
    _check(_libc.prctl(option, arg, 0, 0, 0), f"prctl({option})")


def mount_points() -> list[tuple[str, int]]:
    """(mount point, per-mount flags to keep) from /proc/self/mountinfo, parents before children."""
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            flags = sum(_MOUNT_FLAG_NAMES.get(opt, 0) for opt in fields[5].split(","))
            points.append((fields[4].replace("\\040", " "), flags))
    return sorted(points, key=lambda p: p[0].count("/") if p[0] != "/" else 0)


def _remount_readonly() -> list[str]:
    """Remount every mount read-only in this (private) mount namespace; return the ones that refused."""
    failed = []
    for point, flags in mount_points():
        try:
            mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
        except OSError:
            failed.append(point)
    return failed


def _needed_paths() -> list[str]:
    """Directories the snippet's interpreter reads: the installation and every existing sys.path entry."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    paths.update(p for p in sys.path if p and os.path.isdir(p))
    return sorted(os.path.realpath(p) for p in paths)


def _traversal_blockers(paths: list[str]) -> dict[str, set[str]]:
    """Map each ancestor directory that 'other' users cannot traverse to the child names that must stay visible."""
    blockers: dict[str, set[str]] = {}
    for path in paths:
        parts = path.strip("/").split("/")
        for depth in range(len(parts)):
            ancestor = "/" + "/".join(parts[:depth])
            if ancestor != "/" and not os.stat(ancestor).st_mode & stat.S_IXOTH:
                blockers.setdefault(ancestor, set()).add(parts[depth])
                break
    return blockers


def _mask_blockers(stage_root: str) -> list[str]:
    """Cover each blocking directory with a read-only tmpfs that exposes only the needed children (bind mounts)."""
    masked = []
    for _ in range(4):  # a needed child may itself sit under another blocker: repeat until none is left
        blockers = _traversal_blockers(_needed_paths())
        if not blockers:
            return masked
        for blocker, children in blockers.items():
            staged = []
            for n, child in enumerate(sorted(children)):
                stage = os.path.join(stage_root, f".stage{n}")
                os.mkdir(stage)
                mount(os.path.join(blocker, child), stage, None, MS_BIND | MS_REC)
                staged.append((stage, child))
            mount("tmpfs", blocker, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k")
            for stage, child in staged:
                os.mkdir(os.path.join(blocker, child))
                mount(stage, os.path.join(blocker, child), None, MS_MOVE)
                os.rmdir(stage)
            mount(None, blocker, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
            masked.append(blocker)
    still = sorted(_traversal_blockers(_needed_paths()))
    raise OSError(f"could not make the interpreter traversable: still blocked by {still}")


def enter_namespaces() -> dict[str, str | None]:
    """Enter private network and mount namespaces; return ``{layer: None if on, else why it is off}``."""
    layers: dict[str, str | None] = {}
    try:
        unshare(CLONE_NEWNET)
        layers["network_namespace"] = None
    except OSError as e:
        layers["network_namespace"] = str(e)
    try:
        unshare(CLONE_NEWNS)
        mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we mount propagates back to the host
        layers["mount_namespace"] = None
    except OSError as e:
        layers["mount_namespace"] = f"no private mount namespace: {e}"
    return layers


def host_layers(work_dir: str, tmpfs_size_mb: int) -> dict[str, str | None]:
    """The host view's layers: every mount read-only, a private tmpfs on ``work_dir``, the interpreter traversable."""
    layers: dict[str, str | None] = {}
    failed = _remount_readonly()
    layers["readonly_root"] = f"could not remount read-only: {', '.join(failed)}" if failed else None
    try:
        mount("tmpfs", work_dir, "tmpfs", MS_NOSUID | MS_NODEV,
              f"mode=0755,size={tmpfs_size_mb}m,nr_inodes=16384")
        layers["private_tmpfs"] = None
    except OSError as e:
        layers["private_tmpfs"] = str(e)
    try:
        masked = _mask_blockers(work_dir)
        layers["interpreter_exposed"] = None
        if masked:
            print(f"sandbox worker: masked {masked} so the snippet uid can read the interpreter", file=sys.stderr)
    except OSError as e:
        layers["interpreter_exposed"] = str(e)
    return layers


class PidNamespaces:
    """Gives each forked child a fresh PID namespace: call :meth:`before_fork`, fork, then :meth:`after_fork`.

    ``unshare(CLONE_NEWPID)`` only affects the *next* child, and can be repeated only once the caller's
    "namespace for children" is its own again, so :meth:`after_fork` switches back with ``setns``.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.error: str | None = None if enabled else "disabled by --isolate false"
        self._own = -1
        if not enabled:
            return
        try:
            self._own = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
            unshare(CLONE_NEWPID)
            setns(self._own, CLONE_NEWPID)
        except OSError as e:
            self.error = str(e)

    @property
    def enabled(self) -> bool:
        """True when each child gets its own PID namespace."""
        return self.error is None

    def before_fork(self) -> None:
        """Make the next forked child the init of a new PID namespace."""
        if self.enabled:
            unshare(CLONE_NEWPID)

    def after_fork(self) -> None:
        """Back to our own namespace for children (so later forks, and the next unshare, work)."""
        if self.enabled:
            setns(self._own, CLONE_NEWPID)


def probe_readable(uid: int, paths: list[str]) -> str | None:
    """Fork a probe that drops to ``uid`` and checks it can read ``paths`` (and enter the folders among them); None
    when it can, else the first failure."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the probe child
        code = 0
        try:
            os.close(read_fd)
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            bad = [p for p in paths if not os.access(p, os.R_OK | (os.X_OK if os.path.isdir(p) else 0))]
            os.write(write_fd, (bad[0] if bad else "").encode())
        except BaseException:  # the probe must never return into the worker
            code = 1
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as f:
        first_bad = f.read().decode()
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        return f"probe as uid {uid} failed"
    return f"uid {uid} cannot read {first_bad}" if first_bad else None


def interpreter_paths() -> list[str]:
    """The paths :func:`probe_readable` should check for the snippet interpreter."""
    return _needed_paths()

