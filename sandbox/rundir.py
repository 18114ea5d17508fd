"""The snippet's run dir (cwd, ``HOME``, ``TMPDIR``), new for every snippet, and its clean-up that never walks it.

With a private mount namespace (the minimal root, or the host view as root), every snippet gets a fresh tmpfs
mounted on the run dir, its mode, owner and size set by the mount, and the worker detaches it when the child is
gone: nothing a snippet did to the dir (``chmod``, extended attributes, timestamps, 1200 nested folders) reaches
the next one, and the clean-up is one ``umount`` whatever the snippet left. Without a mount namespace
(``--isolate false``, or the namespace refused), the dir is removed with ``rm -rf`` (coreutils' iterative walk: a
recursive one in Python raises RecursionError on deep trees) and made again whenever it is not empty or its mode or
owner changed; extended attributes then carry over, which ``/health`` says.
"""

from __future__ import annotations

import os
import stat
import subprocess

from sandbox.isolation import MNT_DETACH, MS_NODEV, MS_NOSUID, mount, umount

#: Most files and folders a snippet may create in its run dir (a tmpfs inode limit).
RUN_DIR_INODES = 16384
_MODE = 0o700


class RunDir:
    """Gives each child a fresh run dir: call :meth:`prepare` before the fork and :meth:`clear` after the reap.

    Args:
        path: The run dir as the worker names it.
        uid: The uid that owns it (the snippet's), or None to keep the worker's.
        size_mb: Size cap of the per-snippet tmpfs.
        no_mount: Why the worker may not mount (no private mount namespace), or None when it may.
    """

    def __init__(self, path: str, uid: int | None, size_mb: int, no_mount: str | None) -> None:
        self.path = path
        self.uid = uid
        owner = f",uid={uid},gid={uid}" if uid is not None else ""
        self.options = f"mode={_MODE:o},size={size_mb}m,nr_inodes={RUN_DIR_INODES}{owner}"
        self.mounted = False
        self.error = no_mount
        self._make_plain_dir()
        if self.error is None:
            try:  # probe once: a refusal here means every snippet falls back to rm -rf, and /health says why
                self.prepare()
                self.clear()
            except OSError as e:
                self.error = f"cannot mount a tmpfs on the run dir: {e}"

    @property
    def layer(self) -> str | None:
        """The ``fresh_run_dir_tmpfs`` protection: None when on, else why it is off."""
        return self.error

    def prepare(self) -> None:
        """Before the fork: mount the snippet's own tmpfs on the run dir (no-op in the fallback)."""
        if self.error is None:
            mount("tmpfs", self.path, "tmpfs", MS_NOSUID | MS_NODEV, self.options)
            self.mounted = True

    def clear(self) -> None:
        """After the child and everything it started are gone: drop what the snippet left, without walking it."""
        if self.mounted:
            umount(self.path, MNT_DETACH)
            self.mounted = False
            return
        if self.error is not None:
            self._make_plain_dir()

    def _is_clean(self) -> bool:
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return False
        owner_ok = self.uid is None or st.st_uid == self.uid
        return (stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == _MODE and owner_ok
                and not os.listdir(self.path))

    def _make_plain_dir(self) -> None:
        """An empty dir of the right mode and owner at ``path``, made again unless it already is one."""
        if self._is_clean():
            return
        if os.path.lexists(self.path):
            subprocess.run(["rm", "-rf", "--one-file-system", "--", self.path], check=True,
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        os.mkdir(self.path, _MODE)
        os.chmod(self.path, _MODE)  # past the umask
        if self.uid is not None:
            os.chown(self.path, self.uid, self.uid)
