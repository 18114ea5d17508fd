"""TrackioLogger: scalars, the run's config and the dumper's sampled trajectories land in a local Trackio project.

Trackio reads ``TRACKIO_DIR`` when it is imported, so the logging runs in a child process with that variable set to
the test's folder; this process then reads the project's database back with Trackio's own storage class.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("trackio", reason="trackio is not installed (pip install 'zerotir[traces]')")

REPO = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent("""
    from types import SimpleNamespace
    from lightning.pytorch.trainer.states import TrainerFn
    from callbacks import RolloutDumper
    from tests.callbacks.helpers import FakeModule
    from tests.callbacks.test_rollout_dumper import outputs
    from zerotir.rollout_log.trackio_logger import TrackioLogger

    logger = TrackioLogger(project="traces", name="run-1")
    logger.log_hyperparams({"model": {"rl": {"algorithm": "grpo", "clip": 0.2}}, "seed": 3})
    logger.log_metrics({"train/reward": 0.25}, step=1)
    logger.log_metrics({"train/reward": 0.75}, step=2)
    trainer = SimpleNamespace(default_root_dir=ROOT, global_rank=0, world_size=1, is_global_zero=True,
                              loggers=[logger], sanity_checking=False, state=SimpleNamespace(fn=TrainerFn.FITTING))
    dumper = RolloutDumper(tensorboard_samples=False)
    module = FakeModule()
    dumper.setup(trainer, module, "fit")
    dumper.on_train_batch_end(trainer, module, outputs(2), None, 0)
    dumper.on_fit_end(trainer, module)
    logger.finalize("success")
""")


@pytest.mark.e2e
def test_scalars_config_and_sampled_trajectories_reach_the_trackio_project(tmp_path):
    env = dict(os.environ, TRACKIO_DIR=str(tmp_path / "trackio"), PYTHONPATH=str(REPO))
    code = f"ROOT = {str(tmp_path)!r}\n" + CHILD
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    read = textwrap.dedent("""
        import json
        from trackio.sqlite_storage import SQLiteStorage
        logs = SQLiteStorage.get_logs("traces", "run-1")
        print(json.dumps({"logs": logs, "config": SQLiteStorage.get_run_config("traces", "run-1")}, default=str))
    """)
    shown = subprocess.run([sys.executable, "-c", read], env=env, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr[-3000:]
    import json

    result = json.loads(shown.stdout.strip().splitlines()[-1])
    rewards = [(row["step"], row["train/reward"]) for row in result["logs"] if "train/reward" in row]
    assert rewards == [(1, 0.25), (2, 0.75)]
    samples = [row for row in result["logs"] if "samples/best" in row]
    assert len(samples) == 1 and samples[0]["step"] == 2
    best = json.dumps(samples[0]["samples/best"])
    assert "best, step 2" in best and "reward 1" in best  # the dumper's best trajectory, as Markdown
    assert result["config"]["model.rl.algorithm"] == "grpo" and result["config"]["seed"] == 3


def test_a_project_must_be_named():
    from zerotir.rollout_log.trackio_logger import TrackioLogger

    with pytest.raises(ValueError, match="project must be a non-empty name"):
        TrackioLogger(project="")
