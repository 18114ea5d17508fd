"""Per-snippet cgroup v2 budgets: one cgroup for a snippet and every process it forks, made before it runs and
removed after it.

Rlimits are per process (RLIMIT_AS) or per uid (RLIMIT_NPROC): four forked children of 200 MB each all fit under a
256 MB ``memory_limit_MB``, and memfd memory is outside the address space. A cgroup counts the snippet as a whole:
``memory.max`` (swap 0, ``memory.oom.group`` so an out-of-memory kill takes every process of it), ``pids.max`` and
``cpu.max``. At the time limit the worker writes ``cgroup.kill``, which kills every process in the cgroup, those that
left the process group and the PID namespace's view too.

Layout under the cgroupfs root (``--limits.cgroup_root``, the cgroup v2 file interface):

- the server's own cgroup (from ``/proc/self/cgroup``) must have the ``cpu``, ``memory`` and ``pids`` controllers
  (delegated to it); the server enables them for its children, moving itself into a leaf ``sandbox-server-<pid>``
  first when it is alone in its cgroup (cgroup v2 lets only a cgroup without processes hand controllers down);
- ``zerotir-sandbox-<pid>/`` is the server's subtree, removed when it stops;
- ``zerotir-sandbox-<pid>/w<worker>-<job>/`` is one snippet's cgroup, made and removed by its worker.

Workers pivot into a minimal root where no cgroupfs exists, so they open the subtree before that and work
relative to the open folder (``dir_fd``). Where any of this is not available the layer is off with the reason, and
the per-process rlimits hold instead.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable

CONTROLLERS = ("cpu", "memory", "pids")
#: cpu.max's period in microseconds (the kernel's default).
CPU_PERIOD_US = 100_000
#: How long :meth:`SnippetCgroups.remove` waits for the killed processes of a cgroup to be gone before it gives up.
REMOVE_WAIT_S = 2.0


def rmdir_when_released(fs: CgroupFs, name: str, each_try: Callable[[], None] = lambda: None,
                        deadline: float | None = None) -> None:
    """``rmdir`` the cgroup ``name`` once the kernel has let its processes go (it answers EBUSY until then), trying
    until ``deadline`` (``time.monotonic``; None: ``REMOVE_WAIT_S`` from now); ``each_try`` runs before every try
    (cgroup v1, without ``cgroup.kill``: kill what is listed)."""
    deadline = time.monotonic() + REMOVE_WAIT_S if deadline is None else deadline
    while True:
        each_try()
        try:
            fs.rmdir(name)
            return
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() > deadline:
                raise OSError(e.errno, f"cannot remove the snippet cgroup {name}: {e.strerror}") from e
        time.sleep(0.002)


class CgroupFs:
    """The cgroup v2 file interface under one folder, through an open folder fd (valid after a ``pivot_root``).

    Tests replace :meth:`mkdir` and :meth:`rmdir` to act as the kernel does (make and drop the control files).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def mkdir(self, name: str) -> None:
        """Make a child cgroup (the kernel fills it with its control files)."""
        os.mkdir(name, 0o755, dir_fd=self.fd)

    def rmdir(self, name: str) -> None:
        """Remove a child cgroup; the kernel refuses (EBUSY) while a process is in it."""
        os.rmdir(name, dir_fd=self.fd)

    def write(self, rel: str, text: str) -> None:
        """Write a control file (never creates one: a missing file is an OSError naming it)."""
        fd = os.open(rel, os.O_WRONLY | os.O_TRUNC, dir_fd=self.fd)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)

    def read(self, rel: str) -> str:
        """Read a control file."""
        fd = os.open(rel, os.O_RDONLY, dir_fd=self.fd)
        try:
            return os.read(fd, 1 << 16).decode()
        finally:
            os.close(fd)

    def close(self) -> None:
        """Close the folder fd."""
        os.close(self.fd)


def budget_layer(cgroups: SnippetCgroups | None, why: str | None, max_processes: int) -> str | None:
    """The ``cgroup_budget`` layer for /health: None (on) with per-snippet cgroups, else why not and what holds."""
    if cgroups is not None:
        return None
    return (f"{why}; each process has its own budget instead (RLIMIT_AS: memory_limit_mb on top of the worker's "
            f"size, per process; at most max_processes={max_processes} processes of the snippet uid)")


def own_cgroup(pid: int | str = "self") -> str:
    """The cgroup v2 path of process ``pid`` (``/`` for the root), from its ``0::`` line in /proc."""
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            if line.startswith("0::"):
                return line[3:].strip()
    raise OSError(f"/proc/{pid}/cgroup has no cgroup v2 line (0::)")


def server_subtree(root: str, fs: type[CgroupFs] = CgroupFs) -> tuple[str | None, str | None]:
    """Server side, once at start: (the folder workers make snippet cgroups in, None) or (None, why not)."""
    if not os.path.exists(os.path.join(root, "cgroup.controllers")):
        return None, f"no cgroup v2 hierarchy at {root} (cgroup v1 or none; --limits.cgroup_root names another)"
    own = own_cgroup()
    parent_path = os.path.normpath(os.path.join(root, own.lstrip("/")))
    try:
        parent = fs(parent_path)
    except OSError as e:
        return None, f"the server's cgroup {own} is not under {root}: {e}"
    try:
        missing = sorted(set(CONTROLLERS) - set(parent.read("cgroup.controllers").split()))
        if missing:
            return None, (f"the server's cgroup {parent_path} lacks the {', '.join(missing)} controller(s): delegate "
                          f"them to it (its parent's cgroup.subtree_control)")
        why = _enable_controllers(parent, own)
        if why:
            return None, why
        name = f"zerotir-sandbox-{os.getpid()}"
        parent.mkdir(name)
        subtree = os.path.join(parent_path, name)
        if not os.path.exists(os.path.join(subtree, "cgroup.kill")):
            parent.rmdir(name)
            return None, "the kernel has no cgroup.kill (Linux >= 5.14) to end a snippet's cgroup as a whole"
        parent.write(f"{name}/cgroup.subtree_control", " ".join(f"+{c}" for c in CONTROLLERS))
        return subtree, None
    except OSError as e:
        return None, f"could not set up the sandbox's cgroups under {parent_path}: {e}"
    finally:
        parent.close()


def _enable_controllers(parent: CgroupFs, own: str) -> str | None:
    """Hand the controllers down from the server's cgroup, moving the server into a leaf if it is in the way."""
    enable = " ".join(f"+{c}" for c in CONTROLLERS)
    try:
        parent.write("cgroup.subtree_control", enable)
        return None
    except OSError as e:
        if e.errno != errno.EBUSY:
            raise
    leaf = f"sandbox-server-{os.getpid()}"
    parent.mkdir(leaf)
    parent.write(f"{leaf}/cgroup.procs", str(os.getpid()))
    try:
        parent.write("cgroup.subtree_control", enable)
        return None
    except OSError as e:
        return (f"cannot enable {enable} in the cgroup {own}: {e}; processes other than the server are in it "
                f"(start the server alone in a delegated cgroup)")


def remove_subtree(path: str) -> None:
    """Server side, at stop: remove the subtree (its snippet cgroups are gone with their workers' jobs)."""
    parent, name = os.path.split(path)
    fs = CgroupFs(parent)
    try:
        for entry in os.scandir(path):
            if entry.is_dir(follow_symlinks=False):
                SnippetCgroups.kill_and_remove(fs, f"{name}/{entry.name}")
        fs.rmdir(name)
    finally:
        fs.close()


class SnippetCgroups:
    """A worker's per-snippet cgroups inside the server's subtree.

    Args:
        subtree: The server's subtree (:func:`server_subtree`); opened here, so build this before the pivot.
        worker: The worker's index (part of each cgroup's name).
        cpu_cores: ``cpu.max`` of each snippet, in cores.
        fs: The file interface (a fake in tests).
    """

    def __init__(self, subtree: str, worker: int, cpu_cores: float, fs: type[CgroupFs] = CgroupFs) -> None:
        self.fs = fs(subtree)
        self.prefix = f"w{worker}-{os.getpid()}"  # a replaced worker of the same index never meets its old cgroups
        self.cpu_max = f"{max(1000, round(cpu_cores * CPU_PERIOD_US))} {CPU_PERIOD_US}"

    def create(self, job_id: int, memory_limit_mb: int, max_processes: int) -> str:
        """Make the cgroup of one snippet with its limits; returns its name."""
        name = f"{self.prefix}-{job_id}"
        self.fs.mkdir(name)
        try:
            self.fs.write(f"{name}/memory.max", str(memory_limit_mb * 2**20))
            try:
                self.fs.write(f"{name}/memory.swap.max", "0")
            except FileNotFoundError:  # no swap accounting on this kernel: there is no swap to limit
                pass
            self.fs.write(f"{name}/memory.oom.group", "1")
            self.fs.write(f"{name}/pids.max", str(max_processes))
            self.fs.write(f"{name}/cpu.max", self.cpu_max)
        except BaseException:
            self.fs.rmdir(name)
            raise
        return name

    def enter(self, name: str, pid: int) -> None:
        """Move ``pid`` (a child that has not started its snippet yet) into the cgroup; its forks stay in it."""
        self.fs.write(f"{name}/cgroup.procs", str(pid))

    def limits_hit(self, name: str) -> list[str]:
        """Which of the cgroup's limits the snippet hit: ``memory`` (an out-of-memory kill), ``pids`` (a fork
        refused), ``cpu`` (throttled to ``cpu.max``)."""
        hit = []
        if control_field(self.fs.read(f"{name}/memory.events"), "oom_kill") > 0:
            hit.append("memory")
        if control_field(self.fs.read(f"{name}/pids.events"), "max") > 0:
            hit.append("pids")
        if control_field(self.fs.read(f"{name}/cpu.stat"), "nr_throttled") > 0:
            hit.append("cpu")
        return hit

    def remove(self, name: str) -> None:
        """Kill what is left in the cgroup and remove it."""
        self.kill_and_remove(self.fs, name)

    @staticmethod
    def kill_and_remove(fs: CgroupFs, name: str) -> None:
        """``cgroup.kill``, then ``rmdir`` once the kernel has taken the processes out (it refuses until then)."""
        fs.write(f"{name}/cgroup.kill", "1")
        rmdir_when_released(fs, name)

    def close(self) -> None:
        """Close the subtree's folder fd."""
        self.fs.close()


def control_field(text: str, key: str) -> int:
    """The value of ``key`` in a flat-keyed control file (``memory.events``, ``pids.events``, ``cpu.stat``)."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key:
            return int(parts[1])
    return 0
