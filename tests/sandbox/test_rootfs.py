"""The minimal root's pure parts and its settings: which paths it keeps, ``extra_ro`` checked at start."""

from __future__ import annotations

import os
import sys

import pytest

from sandbox import local_sandbox
from sandbox.__main__ import build_parser, exec_config
from sandbox.config import ExecConfig
from sandbox.rootfs import _outermost, interpreter_view


def test_outermost_drops_paths_inside_another_but_not_mere_prefixes() -> None:
    paths = {"/usr/lib/x", "/usr/lib/x/gconv", "/usr/lib/xy", "/opt/py", "/opt/py/lib/site"}
    assert _outermost(paths) == ["/opt/py", "/usr/lib/x", "/usr/lib/xy"]


def test_interpreter_view_holds_the_installation_and_the_extra_paths(tmp_path) -> None:
    view = interpreter_view([str(tmp_path)])
    base = os.path.realpath(sys.base_prefix)
    assert any(base == p or base.startswith(p + "/") for p in view)
    assert str(tmp_path) in view
    assert "/" not in view


def test_extra_ro_that_does_not_exist_is_an_error_naming_it(tmp_path) -> None:
    missing = str(tmp_path / "nowhere")
    with pytest.raises(ValueError, match=f"ExecConfig.extra_ro: {missing} does not exist"):
        ExecConfig(extra_ro=[missing])


def test_extra_ro_of_the_whole_host_is_refused() -> None:
    with pytest.raises(ValueError, match="would expose the whole host"):
        ExecConfig(extra_ro=["/"])


def test_repeated_extra_ro_flags_add_to_the_limits_list(tmp_path) -> None:
    a, b, c = (tmp_path / n for n in "abc")
    for folder in (a, b, c):
        folder.mkdir()
    cfg = build_parser().parse_args(["serve", "--extra-ro", str(a), "--extra-ro", str(b),
                                     "--limits.extra_ro", f'["{c}"]'])
    assert exec_config(cfg.serve).extra_ro == [str(c), str(a), str(b)]


def test_local_sandbox_with_a_missing_extra_ro_fails_at_start_naming_it(tmp_path) -> None:
    missing = str(tmp_path / "nowhere")
    with pytest.raises(RuntimeError, match=f"{missing} does not exist"):
        with local_sandbox(workers=1, extra_ro=[missing], startup_timeout=60, log_level="warning"):
            pass


AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="the minimal root (and so these start-up checks) needs root")
FAST_WORKER = {"workers": 1, "preload": ["math"], "preamble": None, "startup_timeout": 60, "log_level": "warning"}


@AS_ROOT
def test_extra_ro_the_sandbox_uid_cannot_read_fails_the_start_naming_it(tmp_path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    with pytest.raises(RuntimeError, match=f"--extra-ro: uid \\d+ cannot read {private}"):
        with local_sandbox(extra_ro=[str(private)], **FAST_WORKER):
            pass


@AS_ROOT
def test_extra_ro_over_the_snippets_temp_dir_fails_the_start() -> None:
    with pytest.raises(RuntimeError, match="--extra-ro /tmp: the snippets' private temp dir is /tmp/run"):
        with local_sandbox(extra_ro=["/tmp"], **FAST_WORKER):
            pass
