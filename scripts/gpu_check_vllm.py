"""The vLLM stage of ``scripts/gpu_check.sh``: the checks of the scale path that need a vLLM wheel on the device.

The GPU machine's image has torch, lightning and transformers but no vllm, and the carried wheels (``.whl/``) hold
none (a CUDA vLLM wheel is far larger than what one device call carries). The bugs these checks guard against only
show with vLLM on CUDA, so the rest of ``gpu_check.sh`` cannot see them; this stage names them, and either runs them
(vllm importable and enough GPUs) or reports each as skipped with the reason, so a report never reads as if they had
passed. Each check runs the vLLM-marked tests of the suite that hold the fix, on the device:

    python scripts/gpu_check_vllm.py --report runs/gpu_check/vllm.json [--timeout 60]

Exit status: 0 when every check that could run passed (skipped ones included), 1 otherwise.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NEEDS_VLLM = "needs a vLLM wheel on the device"


@dataclass(frozen=True)
class VLLMCheck:
    """One check: the bug it guards against, what it verifies, the tests that verify it, the GPUs it needs."""

    name: str
    bug: str
    verifies: str
    tests: tuple[str, ...]
    min_gpus: int = 1


CHECKS = (
    VLLMCheck("prefix_cache_after_push", "stale prefix cache after a push in flight",
              "after a weight update with a request running, no request reuses keys / values of the old weights",
              ("tests/rollout/test_vllm_engine.py",)),
    VLLMCheck("thread_host_device", "model.hosts.device ignored by vLLM's uni executor",
              "the thread host's engine lands on model.hosts.device, not on cuda:0 beside the trainer",
              ("tests/rollout/test_source.py", "tests/fleet/test_thread_host.py"), min_gpus=2),
    VLLMCheck("push_stream_sync", "CUDA stream race in an engine host's push",
              "a push between two engine steps waits for the forward still queued on the engine's stream",
              ("tests/fleet/test_versioned.py", "tests/rollout/test_agent_loop_vllm.py")),
)


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def why_skipped(check: VLLMCheck, has_vllm: bool, gpus: int) -> str | None:
    """The reason ``check`` cannot run here, or None when it can."""
    if not has_vllm:
        return NEEDS_VLLM
    if gpus < check.min_gpus:
        return f"needs {check.min_gpus} GPUs, this machine has {gpus}"
    return None


def run_check(check: VLLMCheck, timeout: float) -> dict:
    """Run the check's vLLM-marked tests; the result row of the report."""
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-m", "vllm", *check.tests]
    try:
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
        status = "passed" if done.returncode == 0 else f"FAILED (pytest exit {done.returncode})"
        tail = (done.stdout + done.stderr)[-2000:]
    except subprocess.TimeoutExpired:
        status, tail = f"FAILED (timed out after {timeout:.0f} s)", ""
    print(f"[gpu_check] vLLM check {check.name}: {status}", flush=True)
    if tail:
        print(tail, flush=True)
    return {"status": status, "seconds": time.perf_counter() - start}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds for all the checks that run, together")
    args = parser.parse_args(argv)
    has_vllm = importlib.util.find_spec("vllm") is not None
    if not has_vllm:
        print("[gpu_check] vLLM is NOT checked on this device: vllm does not import (no vLLM wheel fits what a device "
              "run carries, 64 MiB); the checks below are skipped", flush=True)
    gpus = gpu_count()
    deadline = time.perf_counter() + args.timeout
    rows = []
    for check in CHECKS:
        row = {"name": check.name, "bug": check.bug, "verifies": check.verifies, "tests": list(check.tests)}
        reason = why_skipped(check, has_vllm, gpus)
        if reason is None and deadline - time.perf_counter() < 5:
            reason = "the stage's time was spent by the checks before it"
        if reason is not None:
            row["status"] = f"skipped: {reason}"
            print(f"[gpu_check] vLLM check {check.name} SKIPPED ({reason}): {check.bug}", flush=True)
        else:
            row.update(run_check(check, deadline - time.perf_counter()))
        rows.append(row)
    args.report.write_text(json.dumps({"vllm": has_vllm, "gpus": gpus, "checks": rows}, indent=2))
    return 1 if any(r["status"].startswith("FAILED") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
