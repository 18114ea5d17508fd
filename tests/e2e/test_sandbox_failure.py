"""A dead sandbox must never quietly turn ZeroTIR into a no-tool run.

* no server answering at start: the run stops before step 1 with the sandbox's message;
* the server killed during ``python -m zerotir fit``: the run stops with a message naming the RL step, the URL and the
  fix; restarting the server and ``fit --ckpt_path last`` continue from the last checkpoint to the end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch

from sandbox import SandboxUnavailable
from tests.e2e.conftest import REPO, cli_args, read_scalars, run_cli, run_subprocess
from tests.ports import dead_url, free_port
from zerotir import metric_names as mn

pytestmark = pytest.mark.slow


def start_server(port: int) -> subprocess.Popen:
    """``python -m sandbox serve`` on ``port``, waited for until /health answers."""
    proc = subprocess.Popen([sys.executable, "-m", "sandbox", "serve", "--host", "127.0.0.1", "--port", str(port),
                             "--workers", "1", "--log_level", "warning"], cwd=REPO, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, "the sandbox server exited at start"
        time.sleep(0.3)
    kill(proc)
    raise TimeoutError("the sandbox server did not answer /health within 120 s")


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL the server's process group (its workers die with it: they hold PR_SET_PDEATHSIG)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def checkpointed_steps(folder: Path) -> list[int]:
    """The global steps of the ``epoch=E-step=S.ckpt`` files in ``folder`` now (``last.ckpt`` aside)."""
    return [int(path.stem.rsplit("step=", 1)[1]) for path in folder.glob("epoch=*-step=*.ckpt")]


def test_no_sandbox_at_start_fails_before_any_step(e2e_base, e2e_data, tmp_path):
    url = dead_url()
    args = cli_args("fit", "tiny_cpu_grpo", e2e_base, e2e_data, tmp_path, "--trainer.max_steps", "2",
                    "--model.tool.sandbox.workers", "null", "--model.tool.sandbox.urls", json.dumps([url]))
    with pytest.raises(SandboxUnavailable, match=rf"{url}.*python -m sandbox serve"):
        run_cli(args)
    assert not (tmp_path / "checkpoints").exists()


def test_killed_sandbox_stops_the_run_and_resume_continues(e2e_base, e2e_data, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    guard = ["--model.tool.sandbox.workers", "null", "--model.tool.sandbox.urls", json.dumps([url]),
             "--model.tool.sandbox.error_patience", "1", "--model.tool.sandbox.max_error_rate", "0.5", "--checkpoint.every_n_train_steps", "1"]
    args = cli_args("fit", "tiny_cpu_grpo", e2e_base, e2e_data, tmp_path, "--trainer.max_steps", "6", *guard)
    server = start_server(port)
    log = tmp_path / "fit.log"
    try:
        with log.open("w") as out:
            fit = run_subprocess(args, stdout=out, stderr=subprocess.STDOUT)
            # Wait until step 2 (or a later one) is checkpointed. Not for one file name: with save_top_k=1 the
            # checkpoint callback deletes `step=2` when it writes `step=3`. Once a step >= 2 was saved, some file of
            # a step >= 2 exists at every moment (the new one is written before the old one goes): this cannot race.
            deadline = time.monotonic() + 300
            while max(checkpointed_steps(tmp_path / "checkpoints"), default=0) < 2 and fit.poll() is None \
                    and time.monotonic() < deadline:
                time.sleep(0.1)
            kill(server)
            code = fit.wait(timeout=300)
    finally:
        kill(server)
    text = log.read_text()
    assert code != 0, text[-3000:]
    assert "SandboxFailureError" in text and url in text and "python -m sandbox serve" in text, text[-3000:]
    stopped_at = json.loads(text.split("RL step ")[-1].split(":")[0]) if "RL step " in text else None
    last = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    done = last["zerotir"]["rl_steps_done"]
    assert 2 <= done < 6 and stopped_at == done + 1  # the failing step was not saved, nor its data consumed
    assert last["PromptDataModule"]["consumed"] == done

    server = start_server(port)  # same URL again
    try:
        cli = run_cli(cli_args("fit", "tiny_cpu_grpo", e2e_base, e2e_data, tmp_path, "--trainer.max_steps", "6",
                               "--ckpt_path", "last", *guard))
    finally:
        kill(server)
    assert cli.model.rl_steps_done == 6 and cli.datamodule.consumed == 6
    errors = dict(read_scalars(tmp_path / "tensorboard")[mn.SANDBOX_ERROR_RATE])
    assert all(errors[step] == 0.0 for step in range(done + 1, 7))
    assert Path(tmp_path / "checkpoints" / "last.ckpt").is_file()
