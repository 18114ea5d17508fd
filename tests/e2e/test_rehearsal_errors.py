"""Errors on one rank of the CPU rehearsal: the 2-process ZeRO-3 fit of
``configs/rehearsal/zero3_reinforce.yaml``, with rank 1 alone given a sandbox URL where nothing listens, or a vLLM
engine whose KV cache cannot hold one request. Every rank stops with rank 1's message
(``zerotir.parallel.distributed.fail_together`` around ``EngineSource.start``), the run exits non-zero before step 1
and leaves no process behind (no rank waiting in a collective).

Rank 1's setting comes from a test callback (``tests/e2e/helpers.py``) that changes that rank's ``model.tool.sandbox`` /
``model.rollout`` before the rollout source starts: a per-rank misconfiguration, through the product's own start-up
path.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import cli_args, run_subprocess

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.usefixtures("needs_vllm")]

RUN_TIMEOUT_S = 420  # a bound far above the run's start-up (it fails before step 1): not a timing assertion
GROUP_GONE_WITHIN_S = 60  # after the launcher exits, its session (rank 1, the embedded sandboxes) is gone too


def _session_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def start_fit(args: list[str], log_path: Path) -> subprocess.Popen:
    """Start the fit in a session of its own, its output (both ranks') to ``log_path``."""
    with log_path.open("w") as out:
        return run_subprocess(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def fit_failing(fit: subprocess.Popen, log_path: Path) -> tuple[int | None, bool, str]:
    """Wait for the started ``fit``; ``(exit code or None if it ran past the bound, whether every process of its
    session was gone soon after, the combined log of both ranks)``."""
    try:
        code = fit.wait(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        code = None
    deadline = time.monotonic() + GROUP_GONE_WITHIN_S
    while _session_alive(fit.pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    gone = not _session_alive(fit.pid)
    if not gone or code is None:
        os.killpg(fit.pid, signal.SIGKILL)
        fit.wait(timeout=60)
    return code, gone, log_path.read_text()


def assert_both_ranks_stop_with(log: str, root, error_type: str) -> str:
    """Both ranks stopped with rank 1's error, the same text on each (``fail_together``'s report, then the command
    line's ``error:`` line of each rank), before any RL step ran; returns that text."""
    stops = dict(re.findall(rf"rank (\d) stops: rank 1 raised {error_type}: (.*)", log))
    assert set(stops) == {"0", "1"}, log[-4000:]
    assert stops["0"] == stops["1"], stops
    assert re.findall(r"^error: (.*)$", log, re.M) == [stops["0"]] * 2, log[-4000:]
    assert not list(root.rglob("step_*.jsonl.gz"))  # no RL step ran
    return stops["0"]


# Rank 1's misconfiguration of each run: a sandbox URL where nothing listens, a KV cache that holds no request.
FAILURES = {
    "sandbox": ["--trainer.callbacks+=tests.e2e.helpers.SandboxUnreachableOnRank", "--trainer.callbacks.rank", "1"],
    "engine": ["--trainer.callbacks+=tests.e2e.helpers.EngineKVCacheOnRank", "--trainer.callbacks.gib", "1e-5",
               "--trainer.callbacks.rank", "1"],
}


@pytest.fixture(scope="module")
def failed(e2e_base, e2e_data, tmp_path_factory) -> dict[str, tuple[int | None, bool, str, Path]]:
    """Both failing fits, started at once (each spends most of its start-up in one rank while the other waits at
    the rendezvous, so side by side they take little more than one), then waited for: ``{name: (exit code,
    session gone, log, run folder)}``."""
    started = {}
    for name, extra in FAILURES.items():
        folder = tmp_path_factory.mktemp(name)
        args = cli_args("fit", "rehearsal/zero3_reinforce", e2e_base, e2e_data, folder / "run",
                        "--trainer.max_steps", "2", *extra)
        started[name] = (start_fit(args, folder / "fit.log"), folder)
    return {name: (*fit_failing(fit, folder / "fit.log"), folder / "run") for name, (fit, folder) in started.items()}


def test_sandbox_unreachable_on_rank_1_stops_every_rank_with_its_message(failed):
    code, gone, log, root = failed["sandbox"]
    assert code not in (None, 0), log[-4000:]
    assert gone, log[-4000:]
    message = assert_both_ranks_stop_with(log, root, "SandboxUnavailable")
    assert "no sandbox server is healthy" in message and "127.0.0.1" in message


def test_engine_failing_to_start_on_rank_1_stops_every_rank_with_its_message(failed):
    code, gone, log, root = failed["engine"]
    assert code not in (None, 0), log[-4000:]
    assert gone, log[-4000:]
    message = assert_both_ranks_stop_with(log, root, "ValueError")
    assert "No available memory for the cache blocks" in message
