"""The command line that the device checks of ``scripts/gpu_check.sh`` share (``gpu_check_fleet.py``,
``gpu_check_nccl.py``): ``--report PATH [--device cuda|cpu]``; without CUDA a ``cuda`` run writes a report that says
it was skipped and why; otherwise the check's findings with a status (``passed`` / ``failed``) and one line."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def device_check_main(argv: list[str] | None, description: str, check: Callable[[str], dict[str, Any]],
                      needs_cuda: str, name: str, line: Callable[[dict[str, Any]], str]) -> int:
    """Run ``check(device)`` (a report with its ``problems``) and write it to ``--report``; exit 1 when it failed.

    Args:
        needs_cuda: why the check needs a CUDA device (said in a skipped report).
        name: the check's name in the line of a skipped run.
        line: the line printed for a run, from its report (the status and problems are added).
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--report", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        report = {"device": args.device, "status": f"skipped: no CUDA device ({needs_cuda})"}
        print(f"{name}: SKIPPED (no CUDA device)")
    else:
        report = check(args.device)
        report["status"] = "passed" if not report["problems"] else "failed"
        print(f"{line(report)}: {report['status']} {report['problems'] or ''}")
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(json.dumps(report, indent=1))
    return 0 if report["status"] != "failed" else 1
