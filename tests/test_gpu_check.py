"""scripts/gpu_check.sh: its plumbing on CPU (always), the real ZeRO-2 / ZeRO-3 check on a CUDA GPU (marked gpu)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _run_check(out: Path, cpu: bool, timeout: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable}
    if cpu:  # this machine's packages (the carried .whl/ holds CPython 3.12 wheels for the GPU machine)
        env["GPU_CHECK_CPU"] = "1"
    return subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _assert_report(path: Path) -> None:
    report = json.loads(path.read_text())
    assert report["problems"] == [], report["problems"]
    steps = report["steps"]
    assert [s["step"] for s in steps] == [1, 2, 3]
    for s in steps:
        assert math.isfinite(s["grad_norm"]) and s["grad_norm"] > 0
        assert s["sync_buckets"] >= 1


def _assert_grads(path: Path) -> None:
    grads = json.loads(path.read_text())
    assert grads["problems"] == [], grads
    assert grads["zero2_vs_full_batch"] < grads["tolerance"] and grads["zero3_vs_zero2"] < grads["tolerance"]


def test_gpu_check_plumbing_runs_three_steps_on_cpu(tmp_path):
    done = _run_check(tmp_path, cpu=True, timeout=480)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "no wheels in" in done.stdout and "ZeRO-3 vs ZeRO-2" in done.stdout
    _assert_grads(tmp_path / "grads.json")  # DeepSpeed's CPU accelerator: the ZeRO-2 / ZeRO-3 gradient stage
    _assert_report(tmp_path / "zero2.json")
    summary = (tmp_path / "summary.md").read_text()
    assert summary.count("| zero2 |") == 3 and "Gradients on one batch" in summary


@pytest.mark.gpu
@pytest.mark.timeout(900)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the DeepSpeed ZeRO-2/3 check of docs/scale.md)")
def test_gpu_check_zero2_and_zero3_on_gpu(tmp_path):
    done = _run_check(tmp_path, cpu=False, timeout=850)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    _assert_grads(tmp_path / "grads.json")
    for zero in (2, 3):
        _assert_report(tmp_path / f"zero{zero}.json")
