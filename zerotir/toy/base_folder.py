"""The toy base's folder on disk: its checksums, the build's temporary folder, and the base shipped with the repository.

* Every toy base holds ``SHA256SUMS`` (``sha256sum`` format: ``sha256sum -c SHA256SUMS`` checks it by hand), written
  last; a folder is verified before it is reused, so a damaged or edited copy fails with its file's name instead of
  training a model that is not the one its record describes.
* A build writes into ``.<name>.tmp-<pid>`` beside the target and moves it in place at the end, so a killed run
  never leaves a folder that looks done; the temporary folder is removed when the build fails or is interrupted
  (Ctrl-C, SIGTERM), and one left by a process that no longer runs (SIGKILL) is removed by the next build.
* ``data/toy_base`` is the default base of ``configs/toy_cpu.yaml``, shipped so that the main job starts at RL. A run
  never writes into it: when its settings differ from the ones asked for, the run fails naming a folder to build in.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

CHECKSUM_FILE = "SHA256SUMS"
INFO_FILE = "toy_base.json"
# Fields added after folders were first written: a folder without them was built with these values.
NEW_FIELD_DEFAULTS = {"world": "products", "text_error": 0.0, "code_bugs": 0.0, "kinds": "", "head_dim": 0,
                      "multi_share": 0.0, "serve_head_dim": 0}
# Settings that bound a build without shaping the base; a record that holds one (before the limit stopped shaping the
# schedule) differs from every current setting, so such a folder is rebuilt.
LIMIT_FIELDS = ("minutes",)
SHIPPED = Path(__file__).resolve().parents[2] / "data" / "toy_base"
SHIPPED_NAME = "data/toy_base"  # as the configs and the docs write it


class ChecksumError(ValueError):
    """A toy-base folder whose files do not match its ``SHA256SUMS``."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_checksums(folder: Path) -> None:
    """Write ``SHA256SUMS`` over every other file of ``folder`` (sorted by name)."""
    names = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != CHECKSUM_FILE)
    (folder / CHECKSUM_FILE).write_text("".join(f"{_sha256(folder / n)}  {n}\n" for n in names))


def _fix(folder: Path) -> str:
    if is_shipped(folder):
        return f"restore the shipped base (`git checkout -- {SHIPPED_NAME}`)"
    return (f"delete {folder} to have it rebuilt on the next run, or rebuild it now with "
            f"`python -m zerotir toy-base --out {folder} --rebuild`")


def verify_checksums(folder: Path) -> None:
    """Raise :class:`ChecksumError` naming the first file of ``folder`` that is missing or differs from its sum."""
    sums = folder / CHECKSUM_FILE
    if not sums.is_file():
        raise ChecksumError(f"{folder}: no {CHECKSUM_FILE}, so it is not a complete toy base; {_fix(folder)}")
    for line in sums.read_text().splitlines():
        expected, _, name = line.partition("  ")
        path = folder / name
        if not path.is_file():
            raise ChecksumError(f"{path}: listed in {CHECKSUM_FILE} but missing; {_fix(folder)}")
        if _sha256(path) != expected:
            raise ChecksumError(f"{path}: its sha256 differs from {CHECKSUM_FILE} (the file was changed or damaged); "
                                f"{_fix(folder)}")


def is_shipped(path: str | Path) -> bool:
    """``path`` is the repository's ``data/toy_base``."""
    return Path(path).expanduser().resolve() == SHIPPED


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def clear_stale_tmp(path: Path) -> list[Path]:
    """Remove the temporary build folders of ``path`` whose process is gone (or is this one); returns them."""
    removed = []
    for tmp in path.parent.glob(f".{path.name}.tmp-*"):
        pid = tmp.name.rpartition("-")[2]
        if not pid.isdigit() or int(pid) == os.getpid() or not _alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)
            removed.append(tmp)
    return removed


@contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    """Let SIGTERM unwind the build (``SystemExit``) so that its clean-up runs; only in the main thread and only
    where SIGTERM has its default action (a handler someone installed is left alone)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def exit_on_term(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, exit_on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextmanager
def building(path: Path) -> Iterator[Path]:
    """A fresh temporary folder beside ``path`` to build in; the caller moves it in place with :func:`replace`.
    Removed if the block fails or is interrupted; stale ones of dead processes are cleared first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    clear_stale_tmp(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.mkdir()
    try:
        with _sigterm_as_exit():
            yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def replace(tmp: Path, path: Path) -> None:
    """Move the finished build ``tmp`` to ``path``, replacing what was there."""
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)


def read_info(path: str | Path) -> dict | None:
    """The ``toy_base.json`` record of a toy-base folder, or None if there is none."""
    info = Path(path) / INFO_FILE
    return json.loads(info.read_text()) if info.is_file() else None


class Identified(Protocol):
    """Settings that name what they build (``zerotir.toy.pretrain.PretrainSettings``)."""

    def identity(self) -> dict: ...


def settings_differ(info: dict, s: Identified) -> dict[str, tuple]:
    """``{field: (recorded, asked)}`` for every setting where the folder's record and ``s`` differ (a field the record
    has and ``s`` lacks, from an older version, counts as a difference: that base was built another way)."""
    built = {**NEW_FIELD_DEFAULTS, **info.get("settings", {})}
    asked = s.identity()
    return {k: (built.get(k), asked.get(k)) for k in sorted(set(built) | set(asked)) if built.get(k) != asked.get(k)}
