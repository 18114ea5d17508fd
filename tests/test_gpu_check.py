"""scripts/gpu_check.sh: its plumbing on CPU (always), the real ZeRO-2 / ZeRO-3 check on a CUDA GPU (marked gpu)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _run_check(out: Path, cpu: bool, timeout: int, **extra_env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_WORK": str(out / "work"), **extra_env}
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
    assert grads["zero3_chunked_vs_full_logits"] < grads["tolerance"]  # ZeRO-3 through the chunked LM head
    assert grads["zero3_chunked_logprob_max_abs"] < grads["tolerance"] and grads["chunk_tokens"] < 48


@pytest.mark.e2e
@pytest.mark.slow
def test_gpu_check_plumbing_runs_three_steps_on_cpu(tmp_path):
    done = _run_check(tmp_path, cpu=True, timeout=5400)  # a hang guard: the run's time depends on the machine's load
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "no wheels in" in done.stdout and "ZeRO-3 vs ZeRO-2" in done.stdout
    _assert_grads(tmp_path / "grads.json")  # DeepSpeed's CPU accelerator: the ZeRO-2 / ZeRO-3 gradient stage
    _assert_report(tmp_path / "zero2.json")
    summary = (tmp_path / "summary.md").read_text()
    assert summary.count("| zero2 |") == 3 and "Gradients on one batch" in summary
    assert "vLLM checks" in summary and "skipped" in summary  # no GPU here: listed, not run
    assert "**vLLM is NOT checked on this device**: " in summary  # said plainly, not only skipped
    assert "Fleet push with CUDA tensors (gloo): no report" in summary  # left out on CPU, said so
    assert "NCCL weight group (one rank): no report" in summary  # left out on CPU, said so
    stages = _stages(tmp_path)
    assert stages["fleet"] == stages["nccl"] == "skipped: CPU plumbing run"
    assert stages["lora"] == "skipped: CPU plumbing run (config written)"
    assert stages["zero2"] == "passed" and not (tmp_path / "model").exists()  # the model stays in WORK
    zero2 = json.loads((tmp_path / "zero2.json").read_text())["steps"]
    assert all("wait_for_rollout" in s["timings"] for s in zero2)  # zero2's rollouts: the engine host in a thread
    _assert_the_lora_config_builds_an_adapted_actor(tmp_path / "lora.yaml")


def _assert_the_lora_config_builds_an_adapted_actor(config: Path) -> None:
    """The lora stage's config (written by the plumbing run, run on a GPU only) passes the CLI's checks and builds
    the module: rank-8 adapters on the actor, REINFORCE++ (no critic), in line."""
    from zerotir.cli.app import ZeroTIRCLI

    cli = ZeroTIRCLI(args=["--config", str(config)], run=False)
    assert cli.model.rl.algorithm == "reinforce_pp" and cli.model.base.lora.rank == 8


def _stages(out: Path) -> dict[str, str]:
    rows = [line.split("\t") for line in (out / "stages.tsv").read_text().splitlines()[1:]]
    return {row[0]: row[1] for row in rows}


def test_the_default_stage_limits_fit_one_device_call():
    """Every stage's limit plus its kill delay, summed, stays under the budget, and the budget 40 s under one device
    call (600 s): the python starts and the transfers of the call."""
    plan = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "GPU_CHECK_PLAN": "1"}, timeout=60, check=True).stdout
    stages = [line.split()[1] for line in plan.splitlines() if line.startswith("stage ")]
    assert stages == ["install", "env", "build", "vllm", "fleet", "nccl", "grads", "zero2", "zero3", "lora", "summary"]
    worst, budget = (int(w) for w in re.search(r"worst case (\d+) s .* budget (\d+) s", plan).groups())
    assert worst <= budget <= 560


FAKE_PYTHON = """#!/usr/bin/env bash
# stands in for python: the gradient and fit stages print a line and hang; everything else is the real python
case "$1 $2" in
  "scripts/gpu_check.py grads") echo "grads started"; sleep 300 ;;
  "scripts/gpu_check.py run") echo "fit started"; sleep 300 ;;
  "scripts/gpu_check.py env" | "scripts/gpu_check.py build" | "scripts/gpu_check.py config") echo "fake $2" ;;
  "scripts/gpu_check_fleet.py --report") echo "fake fleet" ;;
  "scripts/gpu_check_nccl.py --report") echo "fake nccl" ;;
  *) exec {python} "$@" ;;
esac
"""


@pytest.mark.e2e
def test_hung_stages_are_cut_to_the_budget_and_their_logs_are_already_in_out(tmp_path):
    """A stage that hangs is killed at its limit, the last ones at what the budget leaves (the summary's share kept),
    and what each stage printed before it was killed is in OUT_DIR: a run cut short still reports."""
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON.format(python=sys.executable))
    fake.chmod(0o755)
    (tmp_path / "wheels").mkdir()
    out = tmp_path / "out"
    done = _run_check(out, cpu=False, timeout=300, PYTHON=str(fake), GPU_CHECK_WHEELS=str(tmp_path / "wheels"),
                      GPU_CHECK_BUDGET="70", GPU_CHECK_LIMIT_GRADS="2", GPU_CHECK_LIMIT_SUMMARY="40")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    stages = _stages(out)
    assert [stages[s] for s in ("env", "build", "vllm", "grads")] == ["passed", "passed", "passed", "timed out"]
    assert stages["zero2"] in ("timed out", "skipped: budget spent")  # cut by the budget, however loaded the machine
    assert stages["zero3"] == stages["lora"] == "skipped: budget spent" and stages["summary"] == "passed"
    assert (out / "grads.log").read_text() == "grads started\n"
    assert "FAILED: no report" in (out / "summary.md").read_text()
    checks = json.loads((out / "vllm.json").read_text())["checks"]
    assert {c["name"] for c in checks} == {"prefix_cache_after_push", "thread_host_device", "push_stream_sync"}
    assert all(c["status"].startswith("skipped: ") for c in checks)  # no GPU here: none of them ran


def _script(monkeypatch, name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # a dataclass of the script looks its module up there
    spec.loader.exec_module(module)
    return module


def test_the_fleet_stage_pushes_every_bucket_into_the_engine_and_says_when_it_cannot_run(tmp_path, monkeypatch,
                                                                                       capsys):
    """The fleet's push over gloo (CUDA tensors on a GPU; the same code with CPU tensors here), and
    without CUDA a report that says it was skipped and why."""
    script = _script(monkeypatch, "gpu_check_fleet")
    assert script.main(["--report", str(tmp_path / "cpu.json"), "--device", "cpu"]) == 0
    report = json.loads((tmp_path / "cpu.json").read_text())
    assert report["status"] == "passed" and report["problems"] == [] and report["buckets"] == 5  # embed, 2 layers..
    if not torch.cuda.is_available():
        assert script.main(["--report", str(tmp_path / "cuda.json")]) == 0
        assert json.loads((tmp_path / "cuda.json").read_text())["status"].startswith("skipped: no CUDA device")
        assert "SKIPPED (no CUDA device)" in capsys.readouterr().out


def test_the_nccl_stage_forms_pushes_aborts_and_leaves_the_environment_and_says_when_it_cannot_run(
        tmp_path, monkeypatch, capsys):
    """The nccl stage's steps (a group of one rank, a broadcast, a push, interrupt, abandon, the environment as before)
    over gloo here; without CUDA its default run says it was skipped and why."""
    script = _script(monkeypatch, "gpu_check_nccl")
    assert script.main(["--report", str(tmp_path / "cpu.json"), "--device", "cpu"]) == 0
    report = json.loads((tmp_path / "cpu.json").read_text())
    assert report["status"] == "passed" and report["backend"] == "gloo" and report["push_buckets"] == 5
    monkeypatch.setenv("ZEROTIR_PROBE", "1")  # a variable set while the check runs is a change it reports
    real_form = script.form_weight_group

    def form_and_leak(*args, **kwargs):
        os.environ.pop("ZEROTIR_PROBE")
        return real_form(*args, **kwargs)

    monkeypatch.setattr(script, "form_weight_group", form_and_leak)
    assert script.main(["--report", str(tmp_path / "leak.json"), "--device", "cpu"]) == 1
    assert json.loads((tmp_path / "leak.json").read_text())["problems"] == ["the environment changed: ['ZEROTIR_PROBE']"]
    if not torch.cuda.is_available():
        assert script.main(["--report", str(tmp_path / "cuda.json")]) == 0
        assert json.loads((tmp_path / "cuda.json").read_text())["status"].startswith("skipped: no CUDA device")
        assert "SKIPPED (no CUDA device)" in capsys.readouterr().out


def test_the_summary_says_plainly_when_no_vllm_check_ran(tmp_path, monkeypatch):
    lines = _script(monkeypatch, "gpu_check")._vllm_lines
    report = tmp_path / "vllm.json"
    skipped = {"name": "thread_host_device", "bug": "b", "status": "skipped: needs a vLLM wheel on the device"}
    report.write_text(json.dumps({"vllm": False, "gpus": 1, "checks": [skipped]}))
    assert "**vLLM is NOT checked on this device**: no vLLM wheel here (a device run carries at most 64 MiB" in \
        "\n".join(lines(report))
    report.write_text(json.dumps({"vllm": True, "gpus": 1, "checks": [{**skipped, "status": "passed"}]}))
    assert "NOT checked" not in "\n".join(lines(report))


def _vllm_script(monkeypatch):
    spec = importlib.util.spec_from_file_location("gpu_check_vllm", ROOT / "scripts" / "gpu_check_vllm.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_check_vllm", module)  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_without_vllm_every_vllm_check_is_skipped_saying_it_needs_a_vllm_wheel(tmp_path, monkeypatch, capsys):
    script = _vllm_script(monkeypatch)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "vllm" else real_find_spec(name))
    monkeypatch.setattr(script, "gpu_count", lambda: 8)
    assert script.main(["--report", str(tmp_path / "vllm.json")]) == 0
    report = json.loads((tmp_path / "vllm.json").read_text())
    assert report["vllm"] is False
    assert [c["status"] for c in report["checks"]] == ["skipped: needs a vLLM wheel on the device"] * 3
    out = capsys.readouterr().out
    assert out.count("SKIPPED (needs a vLLM wheel on the device)") == 3 and "vLLM is NOT checked on this device" in out
    two_gpus = next(c for c in script.CHECKS if c.name == "thread_host_device")
    assert script.why_skipped(two_gpus, has_vllm=True, gpus=1) == "needs 2 GPUs, this machine has 1"
    assert script.why_skipped(two_gpus, has_vllm=True, gpus=2) is None


@pytest.mark.gpu
@pytest.mark.timeout(900)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the DeepSpeed ZeRO-2/3 check of docs/scale.md)")
def test_gpu_check_zero2_and_zero3_on_gpu(tmp_path):
    done = _run_check(tmp_path, cpu=False, timeout=850)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    _assert_grads(tmp_path / "grads.json")
    for zero in (2, 3):
        _assert_report(tmp_path / f"zero{zero}.json")
