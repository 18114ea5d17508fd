"""Which layer holds a snippet's budget as a whole: cgroup v2, else cgroup v1's ``memory`` and ``pids``, else rlimits.

Rlimits alone are per process: four forks of 200 MB each live under a 256 MB budget, and kernel memory (socket
buffers: one snippet queued 375-500 MB in socketpairs under a 128 MB budget) is in no process's address space.
A memory cgroup counts both. cgroup v2 is :mod:`sandbox.cgroup`; hosts without it often have cgroup v1's
``memory`` and ``pids`` hierarchies mounted writable (``/sys/fs/cgroup/memory``, ``/sys/fs/cgroup/pids``), and
this module uses them much the same way: the child enters a cgroup in each before it gets its code (so all it
forks is counted), and nothing of the snippet is left in them after; a worker keeps its cgroups from one snippet
to the next while the limits stay the same (:class:`SnippetCgroupsV1`).

cgroup v1 limits: ``memory.limit_in_bytes`` = the budget, and where the files exist the same value in
``memory.memsw.limit_in_bytes`` (no swapping past it), ``memory.kmem.limit_in_bytes`` (kernel memory, socket
buffers included: older kernels count it only once it is limited) and ``memory.kmem.tcp.limit_in_bytes``;
``pids.max`` = ``max_processes``. v1 has no ``cgroup.kill`` and no ``memory.oom.group``: an out-of-memory kill takes
one process, and at the end the worker kills every process still listed until the cgroups can be removed (with PID
namespaces the snippet's end has already killed them). No ``cpu.max`` under v1.

The budget spec the server hands its workers: ``{"v2": subtree}`` or ``{"memory": subtree, "pids": subtree}``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time

from sandbox.cgroup import (REMOVE_WAIT_S, CgroupFs, SnippetCgroups, control_field, remove_subtree,
                            rmdir_when_released, server_subtree)

V1_CONTROLLERS = ("memory", "pids")
#: Files of the memory controller set to the budget where the kernel has them (the first one always).
V1_MEMORY_LIMITS = ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes", "memory.kmem.limit_in_bytes",
                    "memory.kmem.tcp.limit_in_bytes")


def server_budget(root: str) -> tuple[dict[str, str] | None, str | None]:
    """Server side, once at start: (the budget spec, None) or (None, why neither cgroup version is usable)."""
    subtree, why_v2 = server_subtree(root)
    if subtree is not None:
        return {"v2": subtree}, None
    spec, why_v1 = _v1_subtrees(root)
    if spec is not None:
        return spec, None
    return None, f"{why_v2}; and no usable cgroup v1 memory and pids hierarchies: {why_v1}"


def budget_kind(spec: dict[str, str] | None) -> str:
    """What ``/health`` says holds the budget: ``cgroup v2``, ``cgroup v1`` or ``rlimits only``."""
    if spec is None:
        return "rlimits only (per process)"
    return "cgroup v2" if "v2" in spec else "cgroup v1 (memory, pids)"


def remove_budget(spec: dict[str, str]) -> None:
    """Server side, at stop: remove the server's subtrees."""
    if "v2" in spec:
        remove_subtree(spec["v2"])
        return
    for controller in V1_CONTROLLERS:
        parent, name = os.path.split(spec[controller])
        fs = CgroupFs(parent)
        try:
            for entry in os.scandir(spec[controller]):
                if entry.is_dir(follow_symlinks=False):
                    _kill_and_remove_v1([fs], f"{name}/{entry.name}")
            fs.rmdir(name)
        finally:
            fs.close()


def snippet_cgroups(spec: dict[str, str], worker: int, cpu_cores: float) -> SnippetCgroups | SnippetCgroupsV1:
    """Worker side, before the pivot: the per-snippet cgroups of the spec's version."""
    if "v2" in spec:
        return SnippetCgroups(spec["v2"], worker, cpu_cores)
    return SnippetCgroupsV1(spec, worker)


def _own_v1_path(controller: str) -> str | None:
    """This process's cgroup in the v1 hierarchy of ``controller``, from /proc/self/cgroup (None: not mounted)."""
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if controller in controllers.split(","):
                return path
    return None


def _v1_subtrees(root: str) -> tuple[dict[str, str] | None, str | None]:
    parents = {}
    for controller in V1_CONTROLLERS:
        own = _own_v1_path(controller)
        mount = os.path.join(root, controller)
        parent = os.path.normpath(os.path.join(mount, (own or "").lstrip("/")))
        if own is None or not os.path.exists(os.path.join(parent, "tasks")):  # ``tasks``: only v1 has it
            return None, f"no cgroup v1 {controller} hierarchy at {mount} holding this process ({own})"
        parents[controller] = parent
    spec: dict[str, str] = {}
    try:
        for controller, parent in parents.items():
            spec[controller] = os.path.join(parent, f"zerotir-sandbox-{os.getpid()}")
            os.mkdir(spec[controller], 0o755)
        return spec, None
    except OSError as e:
        for path in spec.values():
            with contextlib.suppress(OSError):
                os.rmdir(path)
        return None, f"cannot make the sandbox's cgroups: {e}"


class SnippetCgroupsV1:
    """A worker's snippet cgroups in the v1 ``memory`` and ``pids`` hierarchies (the interface of
    :class:`sandbox.cgroup.SnippetCgroups`).

    One cgroup per worker in each hierarchy, made for its first snippet and kept while the limits stay the same
    (made again when they change): v1 makes and removes a memory cgroup slowly (~0.35 ms per snippet measured, ~5%
    of a trivial snippet's cost). The snippets of a worker run one at a time, and each starts only once every
    process of the previous one is gone from both cgroups; the limits hit are the counters' increase over the run.

    Args:
        spec: The server's subtrees, ``{"memory": path, "pids": path}``; opened here, so build this before the pivot.
        worker: The worker's index (part of the cgroups' name).
        fs: The file interface (a fake in tests).
    """

    def __init__(self, spec: dict[str, str], worker: int, fs: type[CgroupFs] = CgroupFs) -> None:
        self.memory = fs(spec["memory"])
        self.pids = fs(spec["pids"])
        self.name = f"w{worker}-{os.getpid()}"
        self._limits: tuple[int, int] | None = None  # those of the cgroups as they are; None: to be made again
        self._made = False
        self._before = (0, 0)

    def create(self, job_id: int, memory_limit_mb: int, max_processes: int) -> str:
        """The cgroups for the next snippet, with its limits (made again when they change); returns their name."""
        if self._limits != (memory_limit_mb, max_processes):
            self._limits = None
            if self._made:
                _kill_and_remove_v1([self.memory, self.pids], self.name)
                self._made = False
            self._make(memory_limit_mb, max_processes)
        self._before = self._counters()
        return self.name

    def _make(self, memory_limit_mb: int, max_processes: int) -> None:
        self.memory.mkdir(self.name)
        try:
            self.pids.mkdir(self.name)
        except BaseException:
            self.memory.rmdir(self.name)
            raise
        try:
            budget = str(memory_limit_mb * 2**20)
            for i, control in enumerate(V1_MEMORY_LIMITS):
                try:
                    self.memory.write(f"{self.name}/{control}", budget)
                except OSError as e:  # the extra limits where this kernel has (and still takes) them
                    if i == 0 or e.errno not in (errno.ENOENT, errno.EOPNOTSUPP):
                        raise
            self.pids.write(f"{self.name}/pids.max", str(max_processes))
        except BaseException:
            self.memory.rmdir(self.name)
            self.pids.rmdir(self.name)
            raise
        self._made, self._limits = True, (memory_limit_mb, max_processes)

    def enter(self, name: str, pid: int) -> None:
        """Move ``pid`` (a child that has not started its snippet yet) into both cgroups; its forks stay in them."""
        self.memory.write(f"{name}/cgroup.procs", str(pid))
        self.pids.write(f"{name}/cgroup.procs", str(pid))

    def _counters(self) -> tuple[int, int]:
        """(out-of-memory kills, or limit hits where the kernel does not count kills; refused forks) so far."""
        oom = self.memory.read(f"{self.name}/memory.oom_control")
        memory = (control_field(oom, "oom_kill") if "oom_kill" in oom
                  else int(self.memory.read(f"{self.name}/memory.failcnt") or 0))
        return memory, control_field(self.pids.read(f"{self.name}/pids.events"), "max")

    def limits_hit(self, name: str) -> list[str]:
        """``memory`` (an out-of-memory kill in the cgroup) and ``pids`` (a fork refused) during the snippet."""
        after = self._counters()
        return [limit for limit, b, a in zip(("memory", "pids"), self._before, after, strict=True) if a > b]

    def remove(self, name: str) -> None:
        """Kill what is left of the snippet; the cgroups stay for the next one (made again if that fails)."""
        try:
            for fs in (self.memory, self.pids):
                _empty(fs, name)
        except BaseException:
            self._limits = None  # the next snippet starts from new cgroups, or fails to
            raise

    def close(self) -> None:
        """Remove the cgroups and close the subtrees' folder fds."""
        if self._made:
            _kill_and_remove_v1([self.memory, self.pids], self.name)
        self.memory.close()
        self.pids.close()


def _empty(fs: CgroupFs, name: str) -> None:
    """SIGKILL every process listed in the cgroup until it lists none."""
    deadline = time.monotonic() + REMOVE_WAIT_S
    while pids := fs.read(f"{name}/cgroup.procs").split():
        if time.monotonic() > deadline:
            raise OSError(errno.EBUSY, f"the snippet cgroup {name} still holds processes {pids[:8]}")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.002)


def _kill_and_remove_v1(hierarchies: list[CgroupFs], name: str) -> None:
    """v1 has no ``cgroup.kill``: SIGKILL every process listed, until the kernel lets each cgroup be removed (one
    ``REMOVE_WAIT_S`` for them all)."""
    deadline = time.monotonic() + REMOVE_WAIT_S
    for fs in hierarchies:
        rmdir_when_released(fs, name, lambda fs=fs: _kill_listed(fs, name), deadline)


def _kill_listed(fs: CgroupFs, name: str) -> None:
    for pid in fs.read(f"{name}/cgroup.procs").split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
