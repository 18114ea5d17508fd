"""The findings report's header: where the sweep's wall time comes from (its record, never the report's own run)."""

import subprocess
import sys
from pathlib import Path

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


def test_run_as_a_script_it_stops_at_once_and_names_the_module_command(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "toy_findings.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert f"python -m benchmarks.toy_findings --out {tmp_path}" in done.stderr
    assert list(tmp_path.iterdir()) == []  # nothing started
