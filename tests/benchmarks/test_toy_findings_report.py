"""The findings report's header: where the sweep's wall time comes from (its record, never the report's own run)."""

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.toy_findings_report import markdown

REPO = Path(__file__).resolve().parents[2]
SWEPT = {"command": "python -m benchmarks.toy_findings", "minutes": 88.4, "ended": "2026-12-03 12:22"}


def _header(tmp_path: Path, command: str, swept: dict | None) -> str:
    return markdown({}, {}, [], command, swept, steps=40, seeds=[0], pseeds=[0], out=tmp_path).splitlines()[2]


def test_the_sweep_that_wrote_the_report_gives_its_own_time(tmp_path):
    header = _header(tmp_path, SWEPT["command"], SWEPT)
    assert header.startswith("Produced by `python -m benchmarks.toy_findings` (88 min of sweep, ended 2026-12-03")


def test_a_later_report_names_the_sweep_and_its_time(tmp_path):
    header = _header(tmp_path, "python -m benchmarks.toy_findings --report-only", SWEPT)
    assert "Runs of `python -m benchmarks.toy_findings` (88 min of sweep" in header
    assert "report written by `python -m benchmarks.toy_findings --report-only`" in header


def test_runs_without_a_record_say_the_time_is_unknown(tmp_path):
    header = _header(tmp_path, "python -m benchmarks.toy_findings --report-only", None)
    assert "recorded no wall time" in header and "min of sweep" not in header


@pytest.mark.e2e
def test_run_as_a_script_from_elsewhere_it_runs_as_the_module(tmp_path):
    """``python benchmarks/toy_findings.py`` (the issue's command) re-executes itself as ``python -m``; with no runs
    under ``--out`` the report says every finding is not measured, and relative paths keep the caller's directory."""
    (tmp_path / "runs").mkdir()
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "toy_findings.py"), "--report-only",
                           "--out", "runs", "--docs", "docs"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    report = (tmp_path / "docs" / "findings.md").read_text()
    assert "written by `python -m benchmarks.toy_findings --report-only --out runs --docs docs`" in report
    assert report.count("**not measured**") == 11
