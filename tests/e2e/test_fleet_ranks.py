"""The rollout fleet with several training ranks (``zerotir.fleet.ranks``): 2 CPU ranks under DeepSpeed ZeRO-3
(``CpuDeepSpeedStrategy``, gloo) and one engine process, at S = 0, against one rank rolling out in line on the same
global batches of 4 prompts.

Rank 0 drives the fleet: it submits the whole global batch, so the one engine rolls out exactly what the in-line
run's engine does on the same weights (the same folder, the trainer's weights bit for bit before each batch, the
seed of global row 0, the "lockstep" schedule, the same sandbox), and hands rank 1 its 2 prompts and their
trajectories. Every push is gathered bucket by bucket on both ranks (ZeRO-3's gathers are collectives) and sent by
rank 0 alone. What must hold:

- step 1 (both runs on the base's weights): the same rewards and trajectories; rank 0's rollouts on disk are the
  first 2 prompts' samples, rank 1's the last 2's, together the in-line run's, in order;
- the parameters after step 1 equal the one-rank run's within 1e-5 (the rehearsal's tolerance for ZeRO-3 against
  one rank: ``test_rehearsal_equivalence``). From step 2 on the runs sample with weights that differ in the last
  bits, and sampling at temperature 1 can turn such a difference into another token, so later rollouts may differ;
- every step: each rank trains on its own share of the step's global batch (its problem ids, group ids from 0);
- the engine is killed at the end of step 1, while it rolls out step 2's batch: Ray restarts it,
  rank 0 finds it dead inside step 2's ``training_step`` (inside ``DeepSpeedEngine.forward``, where ZeRO-3's
  prefetch leaves parameters in flight), both ranks release them and gather the recovery push, and step 2's batch
  runs again: the run counts one restart and trains on;
- after the last push the engine's weights (the restarted engine's) equal the trainer's gathered fp32 parameters
  bit for bit.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from tests.e2e.conftest import REPO, cli_args, read_scalars, run_cli, run_subprocess
from tests.e2e.test_rehearsal_equivalence import TOLERANCE, strategy_args
from zerotir import metric_names as mn
from zerotir.rollout_log.records import read_step

pytest.importorskip("ray", reason='the fleet runs on Ray: pip install -e ".[fleet]"')
pytestmark = pytest.mark.slow

STEPS = 2
# No KL (no reference model), no gradient clipping (plain torch clips per parameter group, DeepSpeed one global
# norm), 2 samples per prompt, micro-batches of 2 (the reference accumulates 4 per step, each rank 2).
COMMON = ["--model.rollout.init_args.schedule", "lockstep", "--model.rl.kl_coef", "0", "--model.rl.micro_batch_size",
          "2", "--model.optim.max_grad_norm", "0", "--model.optim.warmup_steps", "0", "--model.sampling.n", "2",
          "--data.prompts_per_step", "4", "--trainer.max_steps", str(STEPS), "--trainer.limit_val_batches", "0",
          "--trainer.enable_checkpointing", "false"]
FLEET = ["--model.hosts.max_staleness", "0", "--model.hosts.engines", "1", "--model.hosts.timeout_s", "300"]


class _Fit:
    """``STEPS`` RL steps of ``mode`` (single: in line on one rank; zero3: 2 ranks and the fleet): started in a
    process of its own (``params`` waits for it), or run in this one (``in_process``: no interpreter to start, while
    a run started before it goes on beside it). ``params`` gives rank 0's parameters (HF names) after step 1 and at
    the end."""

    def __init__(self, mode: str, root: Path, base: Path, data: dict[str, Path], *extra: str,
                 in_process: bool = False) -> None:
        root.mkdir(parents=True)
        self.first, self.final, self.log = root / "step1.pt", root / "final.pt", root / "fit.log"
        args = cli_args("fit", "tiny_cpu_reinforce", base, data, root, *strategy_args(mode, root), *COMMON, *extra,
                        "--trainer.callbacks+=tests.e2e.helpers.SaveParamsAtStep", "--trainer.callbacks.path",
                        str(self.first), "--trainer.callbacks.step", "1",
                        "--trainer.callbacks+=tests.e2e.helpers.SaveFinalParams", "--trainer.callbacks.path",
                        str(self.final))
        self.process: subprocess.Popen | None = None
        if in_process:
            run_cli(args)
            return
        with self.log.open("w") as out:
            self.process = run_subprocess(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def params(self) -> dict[str, dict[str, torch.Tensor]]:
        if self.process is not None:
            assert self.process.wait(timeout=800) == 0, self.log.read_text()[-4000:]
        return {key: {name.removeprefix("actor."): t for name, t in torch.load(path).items()}
                for key, path in (("step1", self.first), ("final", self.final))}

    def stop(self) -> None:
        """Kill the run's whole session if it still runs (this test failed before waiting for it)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=60)


def _rewards(root: Path) -> list[float]:
    return [v for _, v in read_scalars(root / "tensorboard")[mn.REWARD_MEAN]]


@pytest.mark.timeout(1500)
def test_two_zero3_ranks_on_one_fleet_engine_train_the_parameters_of_one_rank(e2e_base, e2e_data, tmp_path):
    initial, engine_file = tmp_path / "initial.pt", tmp_path / "engine.pt"
    fleet = _Fit("zero3", tmp_path / "fleet", e2e_base, e2e_data, *FLEET,
                 "--trainer.callbacks+=tests.e2e.helpers.SaveEngineWeights", "--trainer.callbacks.path",
                 str(engine_file), "--trainer.callbacks+=tests.e2e.helpers.KillFleetEngine",
                 "--trainer.callbacks.step", "1")
    try:  # the one-rank reference in this process while the fleet run starts
        reference = _Fit("single", tmp_path / "single", e2e_base, e2e_data, "--trainer.callbacks+=tests.e2e."
                         "helpers.SnapshotParams", "--trainer.callbacks.path", str(initial), in_process=True).params()
        two = fleet.params()
    finally:
        fleet.stop()

    assert _rewards(tmp_path / "fleet")[0] == _rewards(tmp_path / "single")[0]
    restarts = read_scalars(tmp_path / "fleet" / "tensorboard")[mn.FLEET_RESTARTS]
    assert [v for _, v in restarts] == [0.0, 1.0]  # the engine killed during step 2's batch, once
    for step in range(1, STEPS + 1):
        alone = read_step(tmp_path / "single" / "rollouts", step)
        ranks = read_step(tmp_path / "fleet" / "rollouts", step)
        by_rank = {r: [rec for rec in ranks if rec["rank"] == r] for r in (0, 1)}
        ids = [rec["problem_id"] for rec in alone]
        assert [rec["problem_id"] for rec in by_rank[0]] == ids[:4]  # 2 prompts x 2 samples each
        assert [rec["problem_id"] for rec in by_rank[1]] == ids[4:]
        assert [rec["group"] for rec in by_rank[1]] == [0, 0, 1, 1]  # group ids count from the rank's first row
        if step == 1:
            assert [rec["response"] for rec in by_rank[0] + by_rank[1]] == [rec["response"] for rec in alone]

    ref, first = reference["step1"], two["step1"]
    assert first.keys() == ref.keys()
    base = {n.removeprefix("actor."): t for n, (t, grad) in torch.load(initial).items() if grad}
    assert max(float((ref[n] - base[n]).abs().max()) for n in ref) > 10 * TOLERANCE  # step 1 updated
    errors = {n: float((first[n] - ref[n]).abs().max()) for n in ref}
    worst = max(errors, key=errors.get)
    assert errors[worst] <= TOLERANCE, f"{worst} differs by {errors[worst]:.3g} after step 1"

    engine, final = torch.load(engine_file), two["final"]
    assert set(final) <= set(engine)
    differ = [n for n in final if not torch.equal(engine[n], final[n])]
    assert not differ, f"the engine's weights differ from the trainer's after the last push: {differ[:5]}"


@pytest.mark.timeout(1200)
def test_the_zero3_fleet_rehearsal_validates_and_resumes_after_sigkill(e2e_base, e2e_data, tmp_path):
    """``configs/rehearsal/zero3_fleet.yaml`` (2 ZeRO-3 ranks, one engine process, S = 1) with validation every
    step (each rank's held-out rows in one fleet batch, each rank's part handed back) and a sharded checkpoint every
    step, killed with SIGKILL (both ranks, the engine and the cluster) once step 2 is logged (before its checkpoint:
    the checkpoint callback runs after the test's), then resumed from step 1's checkpoint to train step 2 again: one
    value per step in TensorBoard, each step's rollouts on disk once per rank, staleness at most 1, the held-out
    accuracy at steps 1 and 2 (before the kill and after the resume), and no Ray process left."""
    from tests.e2e.conftest import fit_killed_at
    from tests.e2e.test_fleet import _ray_processes

    root, marker = tmp_path / "run", tmp_path / "hang"
    config = ["--config", str(REPO / "configs" / "rehearsal" / "zero3_fleet.yaml"), "--trainer.default_root_dir",
              str(root)]  # after the overlay, which names its own
    common = cli_args("fit", "rehearsal/zero3_reinforce", e2e_base, e2e_data, root, *config,
                      "--model.hosts.timeout_s", "300", "--trainer.max_steps", "2",
                      "--checkpoint.every_n_train_steps", "1", "--trainer.val_check_interval", "1")
    hang = ["--trainer.callbacks+=tests.e2e.helpers.HangAfterStep", "--trainer.callbacks.step", "2",
            "--trainer.callbacks.marker", str(marker)]
    before = _ray_processes()
    fit_killed_at(common + hang, marker, tmp_path / "killed.log", timeout=600)
    assert (root / "checkpoints" / "last.ckpt" / "checkpoint").is_dir()  # the sharded ZeRO-3 checkpoint of step 1

    with (tmp_path / "resumed.log").open("w") as out:
        resumed = run_subprocess(common + ["--ckpt_path", "last"], stdout=out, stderr=subprocess.STDOUT)
        assert resumed.wait(timeout=600) == 0, (tmp_path / "resumed.log").read_text()[-4000:]
    scalars = read_scalars(root / "tensorboard")
    assert [s for s, _ in scalars[mn.REWARD_MEAN]] == [1, 2]
    assert [s for s, _ in scalars[f"heldout/{mn.EVAL_ACCURACY}"]] == [1, 2]
    assert max(v for _, v in scalars[mn.STALENESS_MAX]) <= 1.0
    dumps = sorted(p.name for p in (root / "rollouts").iterdir() if p.name.startswith("step_"))
    assert dumps == sorted(f"step_{k}.rank{r}.jsonl.gz" for k in range(1, 3) for r in (0, 1))
    assert not set(_ray_processes()) - set(before)
