"""The rollout fleet end to end (``model.hosts``): the training run's rollouts on an engine process of its own (a
Ray actor), its weights broadcast after every update.

S = 0 through the fleet must give the in-line run's rewards and parameters exactly: the engine process loads the
same folder, gets the trainer's weights bit for bit before each batch, samples each trajectory with the seed of its
global row and runs the code on the same sandbox (the trainer's embedded one, reached by URL), so only the process
differs. Both runs use the "lockstep" schedule (see ``test_pipeline``) and one torch thread (the conftest's; the
engine process's is ``model.hosts.threads``' default, cpus_per_engine = 1)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch

from tests.e2e.conftest import REPO, cli_args, fit_killed_at, fit_lockstep, read_scalars, run_cli
from tests.ports import free_port
from zerotir import metric_names as mn
from zerotir.data.stream import PromptStream

pytest.importorskip("ray", reason='the fleet runs on Ray: pip install -e ".[fleet]"')
pytestmark = pytest.mark.slow

FLEET = ["--model.hosts.engines", "1", "--model.hosts.timeout_s", "300"]


def _fit(root, e2e_base, e2e_data, *extra):
    run = fit_lockstep(root, e2e_base, e2e_data, 3, *extra)
    return run.cli, run.scalars, run.rewards, run.params


def _assert_equal(in_line, rewards, params):
    """``in_line``: the session's in-line run of 3 steps (tests/e2e/conftest.py), which this run must equal."""
    assert rewards == in_line.rewards
    changed = [k for k in in_line.params if not torch.equal(in_line.params[k], params[k])]
    assert in_line.params.keys() == params.keys() and not changed, f"parameters differ after 3 steps: {changed[:5]}"


@pytest.mark.timeout(900)
def test_s0_through_the_fleet_equals_the_in_line_run_through_two_engine_deaths(in_line, e2e_base, e2e_data,
                                                                              tmp_path):
    """S = 0 through the fleet, its engine dying twice (one run for the plain path and both deaths: each start of a
    fleet costs seconds of the suite; the restart count, exact at every step, shows no restart but the two). First
    just before step 1's optimizer step: the push after the update finds its connection gone, every bucket is still
    gathered (``push_weights``), Ray restarts the engine, a new group forms and the push runs again, so step 2's
    batch samples with the right weights. Then at the end of step 2, while it rolls out step 3's batch: Ray
    restarts it, it rejoins a new weight group on the configured port (the dead group's store gave it up) with the
    trainer's weights, and the batch runs again with the same seeds. Every step's batch is complete and the run
    still equals the in-line one."""
    before_push = ["--trainer.callbacks+=tests.e2e.helpers.KillFleetEngineBeforePush", "--trainer.callbacks.step", "1",
                   "--trainer.callbacks.engine", "0"]
    mid_rollout = ["--trainer.callbacks+=tests.e2e.helpers.KillFleetEngine", "--trainer.callbacks.step", "2",
                   "--trainer.callbacks.engine", "0"]
    port = ["--model.hosts.weight_port", str(free_port())]  # each new group forms on the configured port again
    cli, scalars, rewards, params = _fit(tmp_path, e2e_base, e2e_data, "--model.hosts.max_staleness", "0", *FLEET,
                                         *port, *before_push, *mid_rollout)
    _assert_equal(in_line, rewards, params)
    assert [v for _, v in scalars[mn.FLEET_RESTARTS]] == [1.0, 1.0, 2.0]
    assert [v for _, v in scalars[mn.STALENESS_MAX]] == [0.0, 0.0, 0.0]
    assert [s for s, _ in scalars[mn.TIME_WEIGHT_SYNC]] == [1, 2, 3]
    push_mb = sum(p.numel() * 4 for p in params.values()) / 2**20  # every parameter, float32, each push
    assert [v for _, v in scalars[mn.PUSH_MB]] == pytest.approx([push_mb] * 3)
    assert all(0 < v <= 1 for _, v in scalars[mn.FLEET_BUSY]) and mn.FLEET_FILL not in scalars  # batch shares
    assert cli.model.source.hosts == []  # closed at the end of fit: the engine process and the cluster are gone


@pytest.mark.timeout(900)
def test_streaming_at_s1_on_two_engines_keeps_the_bound_through_an_engine_death(e2e_base, e2e_data, tmp_path):
    """Streaming (``model.hosts.max_in_flight``: each prompt group a call of its own, the next batch's groups
    admitted as room frees up, pushes between engine steps) at S = 1 on two engine processes, one of them killed at
    the end of step 1 with the next batch in its stream: Ray restarts it and its groups run again. Each step trains
    the first groups to end, whatever their batch: every prompt at most once, each token at most one update old,
    and the data record holds exactly the prompts trained. Validation every 2 steps goes through the stream too,
    its greedy groups decoding beside the training groups in flight."""
    steps = tmp_path / "steps.jsonl"
    kill = ["--trainer.callbacks+=tests.e2e.helpers.KillFleetEngine", "--trainer.callbacks.step", "1",
            "--trainer.callbacks.engine", "0"]
    record = ["--trainer.callbacks+=tests.e2e.helpers.RecordSteps", "--trainer.callbacks.path", str(steps)]
    cli = run_cli(cli_args("fit", "tiny_cpu_reinforce", e2e_base, e2e_data, tmp_path, "--trainer.max_steps", "4",
                           "--trainer.val_check_interval", "2", "--trainer.enable_checkpointing", "false",
                           *STREAMING, *kill, *record))
    assert cli.model.rl_steps_done == 4
    records = [r for r in _records(steps) if "start" not in r]
    assert [(r["rl_step"], r["batch_index"]) for r in records] == [(1, 0), (2, 1), (3, 2), (4, 3)]  # the loader's
    trained = [i for r in records for i in r["trained"]]
    assert all(len(r["trained"]) == len(r["ids"]) for r in records) and len(set(trained)) == len(trained)
    assert sorted(trained) == sorted(_consumed_ids(cli.datamodule))
    scalars = read_scalars(tmp_path / "tensorboard")
    assert [s for s, _ in scalars[mn.STALENESS_MAX]] == [1, 2, 3, 4]
    assert max(v for _, v in scalars[mn.STALENESS_MAX]) <= 1.0
    assert [v for _, v in scalars[mn.FLEET_RESTARTS]][-1] == 1.0
    assert all(0 < v <= 1 for _, v in scalars[mn.FLEET_BUSY] + scalars[mn.FLEET_FILL])
    assert all(v >= 1 for _, v in scalars[mn.FLEET_SPREAD]) and [s for s, _ in scalars[mn.FLEET_REGENERATED]] == [
        1, 2, 3, 4]
    assert [s for s, _ in scalars[f"heldout/{mn.EVAL_ACCURACY}"]] == [2, 4]


STREAMING = ["--model.hosts.max_staleness", "1", "--model.rl.off_policy_correction", "tis",
             "--model.hosts.engines", "2", "--model.hosts.max_in_flight", "8", "--model.hosts.timeout_s", "300"]


def _consumed_ids(datamodule) -> list[str]:
    """The ids of the stream rows the data module's record (its checkpoint state) counts as consumed."""
    return _ids_of(datamodule.state_dict(), PromptStream(datamodule.train_rows, datamodule.prompts_per_step,
                                                         datamodule.seed))


def _ids_of(state, stream) -> list[str]:
    """The ids of the rows a data state (``PromptDataModule.state_dict``) counts as consumed."""
    out = [r["id"] for b in range(state["consumed"]) for r in stream.batch(b)]
    for b, positions in state["rows"].items():
        out += [r["id"] for r in stream.batch(int(b)) if r["position"] in positions]
    return out


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _ray_processes() -> list[str]:
    """Command lines of the Ray processes (raylet, GCS, workers) running now from this checkout: a local cluster's
    processes work in the folder of the run that started it (this repository, or the tests' folder for a run in this
    process), so the clusters of other checkouts on a shared machine are not counted."""
    here = {str(REPO), os.getcwd()}
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                cwd = os.readlink(proc / "cwd")
            except OSError:
                continue
            if cwd not in here:
                continue
            if "raylet" in cmd or "gcs_server" in cmd or "ray::" in cmd or "default_worker.py" in cmd:
                out.append(f"{proc.name}: {cmd[:120]}")
    return out


@pytest.mark.timeout(900)
def test_s1_killed_with_batches_on_the_fleet_resumes_at_the_first_unconsumed_batch(e2e_base, e2e_data, tmp_path):
    """S = 1: a checkpoint at step 2, SIGKILL once step 3 is logged (the engine then holds batch 4, or generates
    it), resumed to step 5: steps 3-5 train batches 2-4, each once, staleness at most 1; no Ray process outlives
    the killed run's cluster or the resumed one."""
    marker, log, steps = tmp_path / "hung_at_step", tmp_path / "fit.log", tmp_path / "steps.jsonl"
    common = ["--checkpoint.every_n_train_steps", "2", "--trainer.limit_val_batches", "0",
              "--model.hosts.max_staleness", "1", "--model.rl.off_policy_correction", "tis", *FLEET,
              "--trainer.callbacks+=tests.e2e.helpers.RecordSteps", "--trainer.callbacks.path", str(steps)]
    hang = ["--trainer.callbacks+=tests.e2e.helpers.HangAfterStep", "--trainer.callbacks.step", "3",
            "--trainer.callbacks.marker", str(marker)]
    before = _ray_processes()
    fit_killed_at(cli_args("fit", "tiny_cpu_reinforce", e2e_base, e2e_data, tmp_path, "--trainer.max_steps", "6",
                           *common, *hang), marker, log)
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["zerotir"]["rl_steps_done"] == 2 and ckpt["PromptDataModule"]["consumed"] == 2

    cli = run_cli(cli_args("fit", "tiny_cpu_reinforce", e2e_base, e2e_data, tmp_path, "--trainer.max_steps", "5",
                           "--ckpt_path", "last", *common))
    assert cli.model.rl_steps_done == 5 and cli.datamodule.consumed == 5
    records = [r for r in _records(steps) if "start" not in r]
    killed, resumed = records[:3], records[3:]
    assert [(r["rl_step"], r["batch_index"]) for r in killed] == [(1, 0), (2, 1), (3, 2)]
    assert [(r["rl_step"], r["batch_index"]) for r in resumed] == [(3, 2), (4, 3), (5, 4)]
    assert resumed[0]["ids"] == killed[2]["ids"]
    scalars = read_scalars(tmp_path / "tensorboard")
    for tag in (mn.STALENESS_MAX, mn.TIME_WAIT_ROLLOUT, mn.TIME_WEIGHT_SYNC, mn.IS_RATIO_MEAN):
        assert [s for s, _ in scalars[tag]] == [1, 2, 3, 4, 5], tag
    staleness = dict(scalars[mn.STALENESS_MAX])
    assert staleness[1] == 0.0 and staleness[3] == 0.0 and max(staleness.values()) == 1.0
    deadline = time.monotonic() + 60  # Ray's processes end shortly after their driver (killed, or shut down)
    while set(_ray_processes()) - set(before) and time.monotonic() < deadline:
        time.sleep(1)
    assert not set(_ray_processes()) - set(before)


@pytest.mark.timeout(900)
def test_streaming_killed_at_s1_resumes_with_the_prompts_no_step_trained(e2e_base, e2e_data, tmp_path):
    """Streaming at S = 1 (steps take the groups that have ended, from several batches): a checkpoint at step 2,
    SIGKILL once step 3 is logged, resumed to step 5. The checkpoint's data record holds exactly the prompts of
    steps 1-2, single rows included; the resumed steps train none of them again, and every curve has one value
    per step."""
    marker, log, steps = tmp_path / "hung_at_step", tmp_path / "fit.log", tmp_path / "steps.jsonl"
    common = ["--checkpoint.every_n_train_steps", "2", "--trainer.limit_val_batches", "0", *STREAMING,
              "--trainer.callbacks+=tests.e2e.helpers.RecordSteps", "--trainer.callbacks.path", str(steps)]
    hang = ["--trainer.callbacks+=tests.e2e.helpers.HangAfterStep", "--trainer.callbacks.step", "3",
            "--trainer.callbacks.marker", str(marker)]
    fit_killed_at(cli_args("fit", "tiny_cpu_reinforce", e2e_base, e2e_data, tmp_path, "--trainer.max_steps", "6",
                           *common, *hang), marker, log)
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["zerotir"]["rl_steps_done"] == 2
    killed = [r for r in _records(steps) if "start" not in r]
    assert [r["rl_step"] for r in killed] == [1, 2, 3]

    cli = run_cli(cli_args("fit", "tiny_cpu_reinforce", e2e_base, e2e_data, tmp_path, "--trainer.max_steps", "5",
                           "--ckpt_path", "last", *common))
    assert cli.model.rl_steps_done == 5
    dm = cli.datamodule
    stream = PromptStream(dm.train_rows, dm.prompts_per_step, dm.seed)
    before = [i for r in killed[:2] for i in r["trained"]]
    assert sorted(_ids_of(ckpt["PromptDataModule"], stream)) == sorted(before)
    resumed = [r for r in _records(steps) if "start" not in r][3:]
    assert [r["rl_step"] for r in resumed] == [3, 4, 5]
    trained = before + [i for r in resumed for i in r["trained"]]
    assert len(set(trained)) == len(trained) and sorted(trained) == sorted(_consumed_ids(dm))
    scalars = read_scalars(tmp_path / "tensorboard")
    for tag in (mn.STALENESS_MAX, mn.FLEET_SPREAD, mn.FLEET_REGENERATED):
        assert [s for s, _ in scalars[tag]] == [1, 2, 3, 4, 5], tag
    assert max(v for _, v in scalars[mn.STALENESS_MAX]) <= 1.0


@pytest.mark.timeout(900)
def test_a_resume_whose_record_runs_batches_ahead_fills_its_steps_from_the_rows_left(e2e_base, e2e_data, tmp_path):
    """A checkpoint whose data record holds batches 1 and 2 whole and batch 0 but for its row 0 (a straggler of batch
    0 that kept the record's first whole batch back): the resumed fleet finds one untrained row in the batches the
    capacity rule lets start, so it submits the next ones until its step can fill, instead of waiting for groups
    that will never come. Steps 2-3 then train batch 0's row 0 and rows of batch 3 on, none of the record's."""
    steps = tmp_path / "steps.jsonl"
    common = ["--checkpoint.every_n_train_steps", "1", "--trainer.limit_val_batches", "0", *STREAMING,
              "--model.hosts.engines", "1", "--trainer.callbacks+=tests.e2e.helpers.RecordSteps",
              "--trainer.callbacks.path", str(steps)]
    run_cli(cli_args("fit", "tiny_cpu_reinforce", e2e_base, e2e_data, tmp_path, "--trainer.max_steps", "1", *common))
    last = tmp_path / "checkpoints" / "last.ckpt"
    ckpt = torch.load(last, weights_only=False)
    record = {"consumed": 0, "rows": {"0": [1, 2, 3], "1": [0, 1, 2, 3], "2": [0, 1, 2, 3]}}
    ckpt["PromptDataModule"].update(record)
    torch.save(ckpt, last)

    cli = run_cli(cli_args("fit", "tiny_cpu_reinforce", e2e_base, e2e_data, tmp_path, "--trainer.max_steps", "3",
                           "--ckpt_path", "last", *common))
    assert cli.model.rl_steps_done == 3
    dm = cli.datamodule
    stream = PromptStream(dm.train_rows, dm.prompts_per_step, dm.seed)
    recorded = _ids_of(record, stream)
    resumed = [r for r in _records(steps) if "start" not in r][1:]
    assert [r["rl_step"] for r in resumed] == [2, 3]
    trained = [i for r in resumed for i in r["trained"]]
    assert len(trained) == 8 and len(set(trained)) == 8 and not set(trained) & set(recorded)
    assert stream.batch(0)[0]["id"] in trained
    assert sorted(_consumed_ids(dm)) == sorted(recorded + trained)
