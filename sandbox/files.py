"""A snippet's files in and out (SandboxFusion's ``files`` and ``fetch_files``) and its ``stdin``, confined and bounded.

The server checks every name and size before a job is admitted (:func:`check_io`, cheap: no base64 is decoded
there). The worker writes the input files into the snippet's fresh run dir before the fork (:func:`write_inputs`)
and reads the fetched ones after the snippet and everything it started are gone (:func:`read_outputs`). Both walk
each path one component at a time from a descriptor of the run dir with ``O_NOFOLLOW``: a symlink the snippet
left (``out.txt -> /etc/shadow``, or a folder link to ``/``) is refused, never followed, whatever it changes while
the walk goes on. A fetched file must be a regular file of the run dir's own file system with one link (a hard
link to a file outside a plain run dir has two). ``stdin`` is a sealed memfd (:func:`stdin_fd`): the child reads
it as fd 0, and nobody can write to it, grow it or shrink it.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import fcntl
import os
import stat

#: Most input files, and most names in ``fetch_files``, one request may carry.
MAX_FILES = 64
#: Longest file name (path) accepted, in characters.
MAX_NAME_CHARS = 255
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def check_name(field: str, name: str) -> str | None:
    """Why ``name`` cannot be a path in the run dir (None when it can): relative, no ``..``, no empty name."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS:
        return f"{field}: file name {name!r:.80} must be 1 to {MAX_NAME_CHARS} characters"
    if "\0" in name:
        return f"{field}: file name {name!r:.80} contains a NUL character"
    if name.startswith("/"):
        return f"{field}: {name!r:.80} is an absolute path; name files relative to the snippet's run dir (its cwd)"
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        return f"{field}: {name!r:.80} contains '..'; files must stay inside the snippet's run dir"
    if not parts:
        return f"{field}: {name!r:.80} names the run dir itself, not a file"
    return None


def check_io(stdin: str | None, files: dict[str, str | None], fetch: list[str], stdin_limit: int,
             files_limit: int) -> str | None:
    """Why a request's ``stdin``, ``files`` or ``fetch_files`` cannot run (None when they can), naming the field
    and the fix. Sizes are the decoded sizes (``files`` from the base64 length, without decoding)."""
    if stdin is not None and len(stdin) > stdin_limit:  # characters <= bytes; the exact count is in the worker
        return (f"stdin: {len(stdin)} characters, over the server's max_stdin_mb ({stdin_limit} bytes); "
                "send less or raise --limits.max_stdin_mb")
    for field, count in (("files", len(files)), ("fetch_files", len(fetch))):
        if count > MAX_FILES:
            return f"{field}: {count} entries, over the limit of {MAX_FILES}; pack them into fewer files"
    total = 0
    for name, content in files.items():
        why = check_name("files", name)
        if why is not None:
            return why
        total += len(content or "") * 3 // 4
    if total > files_limit:
        return (f"files: about {total} bytes decoded, over the run dir's tmpfs_size_mb ({files_limit} bytes); "
                "send less or raise --limits.tmpfs_size_mb")
    for name in fetch:
        why = check_name("fetch_files", name)
        if why is not None:
            return why
    return None


def decode_inputs(files: dict[str, str | None]) -> tuple[dict[str, bytes], str | None]:
    """(name -> content, None), or ({}, why) for content that is not base64 (whitespace aside: line-wrapped base64
    decodes). A null content is skipped, as in SandboxFusion."""
    decoded = {}
    for name, content in files.items():
        if content is None:
            continue
        try:
            decoded[name] = base64.b64decode("".join(content.split()), validate=True)  # line breaks allowed
        except (binascii.Error, ValueError) as e:
            return {}, f"files[{name!r:.80}]: not valid base64 ({e}); encode each file's bytes with base64"
    return decoded, None


def _walk(root_fd: int, parts: list[str], make: bool, uid: int | None) -> int:
    """A descriptor of the folder ``parts`` below ``root_fd``, never following a symlink (``make``: create the
    missing folders, mode 0700, owned by ``uid``)."""
    fd = os.dup(root_fd)
    try:
        for part in parts:
            if make:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o700, dir_fd=fd)
                    if uid is not None:
                        os.chown(part, uid, uid, dir_fd=fd, follow_symlinks=False)
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def _parts(name: str) -> list[str]:
    return [p for p in name.split("/") if p not in ("", ".")]


def write_inputs(run_dir: str, files: dict[str, bytes], uid: int | None) -> str | None:
    """Write ``files`` into the (fresh) run dir, owned by the snippet's ``uid``; returns why it failed, or None."""
    root = os.open(run_dir, _DIR_FLAGS)
    try:
        for name, content in files.items():
            why = check_name("files", name)  # checked by the server too; the worker does not rely on it
            if why is not None:
                return why
            parts = _parts(name)
            try:
                folder = _walk(root, parts[:-1], True, uid)
                try:
                    fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                                 0o600, dir_fd=folder)
                finally:
                    os.close(folder)
                with os.fdopen(fd, "wb") as f:
                    if uid is not None:
                        os.fchown(f.fileno(), uid, uid)
                    f.write(content)
            except OSError as e:
                return f"files[{name!r:.80}]: cannot be written to the run dir: {e.strerror or e}"
        return None
    finally:
        os.close(root)


def read_outputs(run_dir: str, names: list[str], limit: int) -> tuple[dict[str, str], list[str]]:
    """(name -> base64 content, problems): the fetched files, at most ``limit`` bytes in all. A missing file is
    left out (as in SandboxFusion); a symlink, a folder, a special file, a hard link or a file past the limit is
    left out and named in ``problems``."""
    out: dict[str, str] = {}
    problems: list[str] = []
    budget = limit
    root = os.open(run_dir, _DIR_FLAGS)
    try:
        device = os.fstat(root).st_dev
        for name in dict.fromkeys(names):
            why = check_name("fetch_files", name)
            if why is not None:
                problems.append(why)
                continue
            parts = _parts(name)
            try:
                content = _read_one(root, parts, device, budget)
            except FileNotFoundError:
                continue
            except OSError as e:
                problems.append(f"{name!r:.80}: {e.strerror or e}")
                continue
            except ValueError as e:
                problems.append(f"{name!r:.80}: {e}")
                continue
            budget -= len(content)
            out[name] = base64.b64encode(content).decode("ascii")
    finally:
        os.close(root)
    return out, problems


def _read_one(root: int, parts: list[str], device: int, budget: int) -> bytes:
    try:
        folder = _walk(root, parts[:-1], False, None)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ValueError("a folder on its path is a symlink or a file; only the run dir's own folders are "
                             "walked") from None
        raise
    try:
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ValueError("is a symlink; only regular files of the run dir are fetched") from None
        raise
    finally:
        os.close(folder)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("is not a regular file")
        if st.st_dev != device or st.st_nlink != 1:
            raise ValueError("is a hard link; only files of the run dir with one link are fetched")
        if st.st_size > budget:
            raise ValueError(f"{st.st_size} bytes, over what is left of max_fetch_mb ({budget} bytes); "
                             "write less or raise --limits.max_fetch_mb")
        content = f.read(budget + 1)
    if len(content) > budget:
        raise ValueError(f"grew past what is left of max_fetch_mb ({budget} bytes) while read")
    return content


def stdin_fd(data: str) -> int:
    """A sealed memfd holding ``data`` (UTF-8), at offset 0: the child's stdin, read-only for good."""
    fd = os.memfd_create("stdin", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data.encode("utf-8", "surrogatepass"))
        while view:
            view = view[os.write(fd, view):]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                    fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
        os.lseek(fd, 0, os.SEEK_SET)
        return fd
    except BaseException:
        os.close(fd)
        raise

