"""The minimal root a snippet runs in: the Python runtime read-only, its own temp dir writable, nothing else.

A worker builds the root once, in its private mount namespace, after it has imported and warmed up its modules (so
the view can be computed from what the running interpreter really uses, never from a hard-coded list):

- read-only bind mounts, at their host paths, of the Python installations behind ``sys.prefix`` /
  ``sys.base_prefix``, the folders of loaded modules that live outside them (the sandbox's own package excepted:
  it is already in memory, and its folder is the project checkout), the folders of the shared libraries the worker
  maps (``/proc/self/maps``: libc, libstdc++, the locale), and any ``extra_ro`` path the operator exposes on purpose;
- a generated ``/etc`` (``passwd``/``group`` naming the sandbox uid, ``hosts`` with localhost, ``nsswitch.conf``,
  the dynamic linker's ``ld.so.cache``), ``/dev`` with null, zero, random and urandom only, an empty ``/proc``;
- a size-capped tmpfs on ``/tmp`` holding the snippet's private temp dir ``/tmp/run`` (its cwd, ``HOME`` and
  ``TMPDIR``); only that folder is writable, and only by the snippet's uid.

The worker then ``pivot_root``s into it and detaches the host's tree, so neither it nor its children can name a
host path again. Per snippet two mounts are left to do: the worker mounts a fresh tmpfs on ``/tmp/run``
(:mod:`sandbox.rundir`), and the child, the init of a fresh PID namespace, mounts a ``proc`` of that namespace on
``/proc`` (:class:`FreshProc`), so it sees its own processes and nothing else. The
child shares the worker's mount namespace (a mount namespace per child costs more than the whole snippet's fork);
the worker detaches the stale proc mounts of finished children in batches.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
from dataclasses import dataclass, field
from typing import Any

from sandbox.isolation import (MNT_DETACH, MS_BIND, MS_NODEV, MS_NOEXEC, MS_NOSUID, MS_RDONLY, MS_REC, MS_REMOUNT,
                               mount, mount_points, pivot_root, umount)

#: Where the private tmpfs is mounted inside the root, and the snippet's temp dir in it (emptied between jobs).
TMP_DIR = "/tmp"
RUN_DIR = "/tmp/run"
DEVICES = ("null", "zero", "random", "urandom")
#: Stale proc mounts of finished children the worker lets pile up on /proc before it detaches them all.
PROC_BATCH = 32
_ROOT_TMPFS = "mode=0755,size=8m,nr_inodes=4096"
_OLD_ROOT = ".old_root"
_PROC_FLAGS = MS_NOSUID | MS_NODEV | MS_NOEXEC


@dataclass
class RootPlan:
    """What a worker needs to build its minimal root.

    Attributes:
        uid: The uid snippets run as (named in the generated ``/etc/passwd``).
        extra_ro: Host paths exposed read-only on purpose, at the same path.
        tmpfs_size_mb: Size cap of the writable ``/tmp``.
    """

    uid: int
    extra_ro: list[str]
    tmpfs_size_mb: int


@dataclass
class FilesystemView:
    """What a snippet's file system is: reported by each worker in its handshake and by ``GET /health``.

    Attributes:
        view: ``"minimal"`` (the root of this module) or ``"host"`` (the host's tree, read-only where the mount layer
            is on).
        reason: Why the view is ``"host"``; None for ``"minimal"``.
        run_dir: The snippet's cwd, ``HOME`` and ``TMPDIR``, as the worker names it.
        read_only: What the snippet can read (for ``"minimal"``); empty for ``"host"`` (everything world-readable).
        writable: What the snippet can write.
        proc_options: Mount options of the child's fresh ``/proc``; None when the child mounts none.
    """

    view: str
    reason: str | None
    run_dir: str
    read_only: list[str] = field(default_factory=list)
    writable: list[str] = field(default_factory=list)
    proc_options: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The handshake's ``filesystem`` entry."""
        return {"view": self.view, "reason": self.reason, "read_only": self.read_only, "writable": self.writable}


def host_view(reason: str, run_dir: str) -> FilesystemView:
    """The view when the minimal root cannot be built: the host's tree, with the reason."""
    return FilesystemView("host", reason, run_dir, writable=[run_dir])


def _outermost(paths: set[str]) -> list[str]:
    """Sorted paths without those inside another one of them."""
    kept: list[str] = []
    for path in sorted(paths):
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return kept


def _existing(path: str) -> str | None:
    """``path``, or its nearest existing ancestor (a module inside a zip file), resolved; None for ``/``."""
    while path and path != "/" and not os.path.exists(path):
        path = os.path.dirname(path)
    return os.path.realpath(path) if path and path != "/" else None


def _module_folders(installations: list[str]) -> set[str]:
    """Top-level package folders (or single-module files) of loaded modules that live outside ``installations``."""
    folders = set()
    entries = sorted((os.path.realpath(p) for p in sys.path if p), key=len, reverse=True)
    for name, module in list(sys.modules.items()):
        top = name.split(".")[0]
        if top in ("__main__", "sandbox"):
            continue
        source = getattr(module, "__file__", None)  # a module's __file__ is optional by definition (builtins)
        path = _existing(os.path.realpath(source)) if isinstance(source, str) else None
        if path is None or any(path.startswith(i + "/") for i in installations):
            continue
        entry = next((e for e in entries if path.startswith(e + "/")), None)
        folders.add(os.path.join(entry, path[len(entry) + 1:].split("/")[0]) if entry else path)
    return folders


def _library_folders() -> set[str]:
    """Folders of the files this process maps (shared libraries, the locale), world-writable folders excepted."""
    folders = set()
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) < 6 or not fields[5].startswith("/") or fields[5].rstrip().endswith("(deleted)"):
                continue
            folder = os.path.dirname(os.path.realpath(fields[5].rstrip("\n")))
            if folder != "/" and os.path.isdir(folder) and not os.stat(folder).st_mode & stat.S_IWOTH:
                folders.add(folder)
    return folders


def interpreter_view(extra_ro: list[str]) -> list[str]:
    """Every host path the minimal root exposes read-only, outermost only (computed from this interpreter)."""
    installations = _outermost({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                                                  sys.base_exec_prefix)}
                               | {os.path.dirname(os.path.realpath(sys.executable))})
    return _outermost(set(installations) | _module_folders(installations) | _library_folders()
                      | {os.path.abspath(p) for p in extra_ro})


def _bind(source: str, root: str) -> None:
    target = root + source
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    mount(source, target, None, MS_BIND | MS_REC)


def _write_etc(root: str, uid: int) -> list[str]:
    """The generated /etc: what the C library needs to name users and hosts and to find shared libraries."""
    etc = os.path.join(root, "etc")
    os.mkdir(etc)
    files = {
        "passwd": f"root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:{uid}:{uid}:zerotir sandbox:{RUN_DIR}:"
                  "/usr/sbin/nologin\n",
        "group": f"root:x:0:\nsandbox:x:{uid}:\n",
        "hosts": "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n",
        "nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files\n",
    }
    for name, text in files.items():
        with open(os.path.join(etc, name), "w") as f:
            f.write(text)
    if os.path.isfile("/etc/ld.so.cache"):
        shutil.copyfile("/etc/ld.so.cache", os.path.join(etc, "ld.so.cache"))
        files["ld.so.cache"] = ""
    return [f"/etc/{name}" for name in sorted(files)]


def _make_devices(root: str) -> None:
    os.mkdir(os.path.join(root, "dev"))
    for name in DEVICES:
        target = os.path.join(root, "dev", name)
        open(target, "w").close()
        mount(f"/dev/{name}", target, None, MS_BIND)


def _link_top_level(root: str) -> None:
    """Recreate the host's top-level symlinks (``/lib -> usr/lib``) whose target exists in the root."""
    for name in sorted(os.listdir("/")):
        path = "/" + name
        if os.path.islink(path) and os.path.isdir(root + os.path.realpath(path)):
            os.symlink(os.readlink(path), root + path)


def _remount_readonly(root: str) -> None:
    """Every mount under ``root`` read-only and nosuid (and nodev, the device files excepted)."""
    devices = os.path.join(root, "dev") + "/"
    for point, flags in mount_points():
        if point.startswith(root + "/") and point != root + TMP_DIR:
            nodev = 0 if point.startswith(devices) else MS_NODEV
            mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | nodev | flags)


def _proc_options(target: str) -> str:
    """Mount options of the children's /proc: ``subset=pid`` (only process folders: no kernel command line, no
    /proc/sys) where the kernel has it (5.8+), else none. Tried once, on the root's empty /proc."""
    for options in ("subset=pid", ""):
        try:
            mount("proc", target, "proc", _PROC_FLAGS, options or None)
        except OSError:
            continue
        umount(target, MNT_DETACH)
        return options
    raise OSError("cannot mount a proc file system for the snippets")


def enter_minimal_root(plan: RootPlan, work_dir: str) -> FilesystemView:
    """Build the minimal root on ``work_dir`` (in this process's private mount namespace) and pivot into it.

    Raises OSError naming what failed before the pivot (the caller then reports the host view with that reason),
    RuntimeError for a failure after it (the host's tree is gone then, so the worker cannot start).
    """
    exposed = interpreter_view(plan.extra_ro)
    clash = [p for p in exposed if p in (TMP_DIR, RUN_DIR) or p.startswith(RUN_DIR + "/")]
    if clash:
        raise RuntimeError(f"--extra-ro {clash[0]}: the snippets' private temp dir is {RUN_DIR}; expose a folder "
                           "that is not it or above it")
    mount("tmpfs", work_dir, "tmpfs", MS_NOSUID | MS_NODEV, _ROOT_TMPFS)
    os.mkdir(work_dir + TMP_DIR)
    mount("tmpfs", work_dir + TMP_DIR, "tmpfs", MS_NOSUID | MS_NODEV,
          f"mode=0755,size={plan.tmpfs_size_mb}m,nr_inodes=16384")  # first: an exposed path may lie below /tmp
    for path in exposed:
        _bind(path, work_dir)
    generated = _write_etc(work_dir, plan.uid)
    _make_devices(work_dir)
    _link_top_level(work_dir)
    for name in ("proc", _OLD_ROOT):
        os.mkdir(os.path.join(work_dir, name), 0o555 if name == "proc" else 0o755)
    proc_options = _proc_options(os.path.join(work_dir, "proc"))
    _remount_readonly(work_dir)
    pivot_root(work_dir, os.path.join(work_dir, _OLD_ROOT))
    try:
        os.chdir("/")
        umount("/" + _OLD_ROOT, MNT_DETACH)
        os.rmdir("/" + _OLD_ROOT)
        mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    except OSError as e:
        raise RuntimeError(f"entering the minimal root failed after pivot_root: {e}") from e
    _forget_host_paths()
    devices = [f"/dev/{name}" for name in DEVICES]
    proc = f"/proc (the snippet's own PID namespace{', subset=pid' if proc_options else ''})"
    return FilesystemView("minimal", None, RUN_DIR, [*exposed, *generated, *devices, proc],
                          [f"{RUN_DIR} (tmpfs, {plan.tmpfs_size_mb} MB)"], proc_options)


def _forget_host_paths() -> None:
    """Drop the sys.path entries the root does not have, and the import system's cached listings of them."""
    sys.path[:] = [p for p in sys.path if p and os.path.exists(p)]
    sys.path_importer_cache.clear()


class FreshProc:
    """Each child's own /proc: the child mounts it (:meth:`mount_in_child`), the worker clears up (:meth:`done`).

    A child's proc mount stays on the worker's /proc after the child ends (it shows nothing: its PID namespace is
    gone); the next child mounts on top of it. Every :data:`PROC_BATCH` children the worker detaches the pile, which
    costs less than one umount per child.
    """

    def __init__(self, options: str) -> None:
        self.options = options
        self.stacked = 0

    def done(self) -> None:
        """After a child was reaped: count its mount, and detach the pile when it is :data:`PROC_BATCH` high."""
        self.stacked += 1
        if self.stacked >= PROC_BATCH:
            self.stacked = 0
            while True:  # until EINVAL: /proc is the root's plain (empty) folder again
                try:
                    umount("/proc", MNT_DETACH)
                except OSError:
                    return


def mount_fresh_proc(options: str) -> None:
    """In the child, still root, as the init of its new PID namespace: a proc of that namespace on /proc."""
    mount("proc", "/proc", "proc", _PROC_FLAGS, options or None)
