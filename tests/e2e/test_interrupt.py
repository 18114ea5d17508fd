"""Ctrl-C during ``python -m zerotir fit`` (a real SIGINT to a real process on the toy config) keeps a resumable
``last.ckpt`` at the last completed RL step and says in one line where ``--ckpt_path last`` resumes; the resume
starts there (``callbacks.SaveOnInterrupt``)."""

from __future__ import annotations

import re
import signal
import subprocess

import pytest
import torch

from tests.e2e.conftest import run_subprocess

pytestmark = pytest.mark.slow

# The toy config shrunk to seconds per step (2 prompts x 2 samples, short responses); no step is dropped by a filter.
SMALL = ["--model.sampling.n", "2", "--data.prompts_per_step", "2", "--model.sampling.max_response_tokens", "32",
         "--model.tool.sandbox.workers", "1", "--model.filters.pass_rate", "false", "--trainer.max_steps", "2"]


def _lines_until(fit: subprocess.Popen, wanted: str) -> list[str]:
    """The run's output lines up to the first that starts with ``wanted`` (AssertionError with them if it ends)."""
    lines: list[str] = []
    for line in fit.stdout:
        lines.append(line.rstrip("\n"))
        if line.startswith(wanted):
            return lines
    raise AssertionError(f"the run ended (status {fit.wait()}) before {wanted!r}:\n" + "\n".join(lines[-30:]))


def test_ctrl_c_saves_the_last_completed_step_and_a_resume_starts_after_it(tmp_path):
    root = tmp_path / "run"
    args = ["fit", "--config", "configs/toy_cpu.yaml", *SMALL, "--trainer.default_root_dir", str(root)]
    pause = ["--trainer.callbacks+=tests.e2e.helpers.PauseBeforeStep", "--trainer.callbacks.step", "2"]
    fit = run_subprocess([*args, *pause], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen = _lines_until(fit, "RL step 1/2")
        seen += _lines_until(fit, "paused before RL step 2")
        assert not (root / "checkpoints" / "last.ckpt").exists()  # every 5 steps: nothing saved yet
        fit.send_signal(signal.SIGINT)
        rest = fit.stdout.read().splitlines()
        assert fit.wait(timeout=120) != 0
    finally:
        fit.kill()
    said = [line for line in rest if line.startswith("zerotir: interrupted")]
    last = root / "checkpoints" / "last.ckpt"
    assert said == [f"zerotir: interrupted during RL step 2: saved RL step 1 to {last}; --ckpt_path last resumes "
                    "at RL step 2"], "\n".join(seen + rest)
    ckpt = torch.load(last, map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == 1 and ckpt["zerotir"]["rl_steps_done"] == 1

    resumed = run_subprocess([*args, "--ckpt_path", "last"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    out, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, out[-3000:]
    steps = re.findall(r"^RL step (\d+)/2", out, re.MULTILINE)
    assert steps == ["2"], out[-3000:]  # it starts at the said step, and trains only that one
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 2
