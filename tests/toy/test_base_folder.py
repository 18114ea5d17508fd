"""Tests of the toy base's folder: checksums, the build's temporary folder (cleaned on failure, interrupt, SIGTERM
and after a kill), and the shipped ``data/toy_base``."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from zerotir.toy import base_folder
from zerotir.toy.base_folder import (CHECKSUM_FILE, SHIPPED, ChecksumError, building, clear_stale_tmp,
                                     verify_checksums, write_checksums)
from zerotir.toy.pretrain import NEW_FIELD_DEFAULTS, PretrainSettings, read_info

REPO = Path(__file__).resolve().parents[2]


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "base"
    folder.mkdir()
    (folder / "config.json").write_text('{"a": 1}\n')
    (folder / "model.safetensors").write_bytes(b"\0\1\2" * 1000)
    write_checksums(folder)
    return folder


def test_checksums_are_sha256sum_lines_and_verify(tmp_path):
    folder = _folder(tmp_path)
    lines = (folder / CHECKSUM_FILE).read_text().splitlines()
    assert [line.split("  ")[1] for line in lines] == ["config.json", "model.safetensors"]
    assert all(len(line.split("  ")[0]) == 64 for line in lines)
    verify_checksums(folder)


def test_a_changed_file_fails_naming_it_and_the_fix(tmp_path):
    folder = _folder(tmp_path)
    (folder / "model.safetensors").write_bytes(b"\0\1\3" * 1000)
    with pytest.raises(ChecksumError, match=r"model.safetensors: its sha256 differs from SHA256SUMS.*--rebuild"):
        verify_checksums(folder)


def test_a_missing_file_or_sums_file_fails(tmp_path):
    folder = _folder(tmp_path)
    (folder / "config.json").unlink()
    with pytest.raises(ChecksumError, match="config.json: listed in SHA256SUMS but missing"):
        verify_checksums(folder)
    (folder / CHECKSUM_FILE).unlink()
    with pytest.raises(ChecksumError, match="no SHA256SUMS, so it is not a complete toy base"):
        verify_checksums(folder)


def test_the_shipped_base_names_git_checkout_as_the_fix(tmp_path, monkeypatch):
    folder = _folder(tmp_path)
    monkeypatch.setattr(base_folder, "SHIPPED", folder.resolve())
    (folder / "config.json").write_text("{}")
    with pytest.raises(ChecksumError, match=r"git checkout -- data/toy_base"):
        verify_checksums(folder)


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid


def test_stale_tmp_folders_of_dead_processes_are_cleared(tmp_path):
    path = tmp_path / "base"
    dead = tmp_path / f".base.tmp-{_dead_pid()}"
    alive = tmp_path / f".base.tmp-{os.getppid()}"  # the parent runs: another build in progress
    other = tmp_path / f".other.tmp-{_dead_pid()}"  # another folder's build
    for folder in (dead, alive, other):
        folder.mkdir()
    assert clear_stale_tmp(path) == [dead]
    assert not dead.exists() and alive.exists() and other.exists()


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt()])
def test_a_failed_or_interrupted_build_leaves_no_tmp_folder(tmp_path, error):
    with pytest.raises(type(error)), building(tmp_path / "base") as tmp:
        (tmp / "model.safetensors").write_text("half written")
        raise error
    assert list(tmp_path.iterdir()) == []


def test_sigterm_during_a_build_leaves_no_tmp_folder(tmp_path):
    code = ("import os, signal, sys; from pathlib import Path; from zerotir.toy.base_folder import building\n"
            "with building(Path(sys.argv[1])) as tmp:\n"
            "    (tmp / 'x').write_text('x'); os.kill(os.getpid(), signal.SIGTERM); signal.pause()\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "base")], cwd=REPO, timeout=120)
    assert done.returncode == 128 + signal.SIGTERM
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # this process's handler was never touched


def test_the_shipped_base_is_the_default_settings_verified_and_small():
    assert SHIPPED == REPO / "data" / "toy_base"
    verify_checksums(SHIPPED)
    info = read_info(SHIPPED)
    assert {**NEW_FIELD_DEFAULTS, **info["settings"]} == PretrainSettings().identity()  # fields added since: defaults
    record = info["record"]
    # Copying was learned (the probe, not the step cap, started the decay) and the run ended after the decay.
    assert record["decay_reason"] == "probe" and record["probe"][-1]["both"] >= 0.5
    assert record["steps_done"] == record["decay_start"] + PretrainSettings().decay_steps
    assert sum(p.stat().st_size for p in SHIPPED.iterdir()) < 8 * 2**20  # git stores it: a few MB
    assert {"model.safetensors", "tokenizer.json", "config.json", CHECKSUM_FILE} <= {p.name for p in SHIPPED.iterdir()}
    assert json.loads((SHIPPED / "config.json").read_text())["model_type"] == "llama"
