"""Each server's own range of snippet uids, reserved on the host for the server's lifetime.

A snippet runs as an unprivileged uid whose ``RLIMIT_NPROC`` (``max_processes``) is its process budget, and the
kernel counts that limit per uid across the whole host. Two servers on one host using the same uids would share
one budget: a snippet of one holding its 16 processes makes ``fork()`` fail with EAGAIN in the other's snippets,
and each server would count the other's snippets as its own leftovers. So every server reserves its uids: one lock
file per uid under :data:`LOCK_DIR`, held with ``flock`` until the server exits (the kernel drops the locks of a
killed server, so nothing stale is left to clean up).

By default (``uid_base`` unset) a server takes the first free block of :data:`BLOCK` uids from
:data:`FIRST_UID`; a configured ``uid_base`` is taken as it is, and a start-up error names the conflict when
another server holds any of its uids.
"""

from __future__ import annotations

import contextlib
import fcntl
import os

#: Where the reservations live: one ``<uid>.lock`` per reserved uid, shared by every server on the host.
LOCK_DIR = "/run/zerotir-sandbox/uids"
#: The first uid the automatic choice tries, and the size of the blocks it steps by (the most workers a server has).
FIRST_UID = 61000
BLOCK = 256
#: Blocks the automatic choice tries before giving up (this many servers at once on one host).
MAX_BLOCKS = 256


class UidRange:
    """The uids ``base .. base + count - 1`` reserved for one server; :meth:`release` (or the server's exit) frees
    them."""

    def __init__(self, base: int, fds: list[int]) -> None:
        self.base = base
        self._fds = fds

    def release(self) -> None:
        """Drop the reservation (closing the lock files releases their locks)."""
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = []


def reserve(count: int, uid_base: int | None, lock_dir: str = LOCK_DIR) -> UidRange:
    """Reserve ``count`` consecutive uids: from ``uid_base`` if set, else the first free block.

    Raises:
        ValueError: ``count`` does not fit a block, or ``uid_base``'s range is held by another server.
        OSError: The lock folder cannot be made or written (it needs root, as the uid drop does).
    """
    if count > BLOCK:
        raise ValueError(f"--workers {count} exceeds the {BLOCK} snippet uids a sandbox server reserves; "
                         f"run fewer workers per server (or several servers)")
    try:
        os.makedirs(lock_dir, mode=0o755, exist_ok=True)
    except OSError as e:
        raise OSError(e.errno, f"cannot reserve snippet uids: {lock_dir}: {e.strerror}") from None
    if uid_base is not None:
        fds, holder = _try_lock(lock_dir, uid_base, count)
        if fds is None:
            raise ValueError(f"ExecConfig.uid_base: uid {holder} of {uid_base}..{uid_base + count - 1} is used by "
                             "another sandbox server on this host (their snippets would share one process budget); "
                             "pick another --limits.uid_base or leave it unset to take a free range")
        return UidRange(uid_base, fds)
    for block in range(MAX_BLOCKS):
        base = FIRST_UID + block * BLOCK
        fds, _ = _try_lock(lock_dir, base, count)
        if fds is not None:
            return UidRange(base, fds)
    raise ValueError(f"every one of the {MAX_BLOCKS} blocks of {BLOCK} snippet uids from {FIRST_UID} is held by "
                     f"another sandbox server on this host; stop one, or set --limits.uid_base to a free range")


def _try_lock(lock_dir: str, base: int, count: int) -> tuple[list[int] | None, int]:
    """Lock ``base .. base + count - 1``: (their lock fds, -1), or (None, the first uid another server holds)."""
    fds: list[int] = []
    for uid in range(base, base + count):
        fd = os.open(os.path.join(lock_dir, f"{uid}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            for held in fds:
                os.close(held)
            return None, uid
        fds.append(fd)
    return fds, -1
