"""A resumed run purges what the interrupted one logged after its checkpoint: one value per step for readers."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from lightning.pytorch.loggers import TensorBoardLogger

from callbacks import PurgeResumedSteps
from tests.callbacks.helpers import FakeModule
from tests.e2e.conftest import read_scalars
from zerotir.scaling.runs import load_run


def log_steps(logger, steps, value):
    for step in steps:
        logger.log_metrics({"reward": value + step, "other": -step}, step=step)
        logger.experiment.add_histogram("calls", np.array([0, 1, step]), global_step=step)
    logger.save()


def test_resume_purges_the_steps_after_the_checkpoint(tmp_path):
    # The first run logs steps 1..5 and dies; its last checkpoint is step 3.
    first = TensorBoardLogger(tmp_path, name="tb", version="")
    log_steps(first, [1, 2, 3, 4, 5], 0.0)
    first.experiment.close()

    # The resumed run: the hyperparameters are written first (as Lightning does), then training starts at step 4.
    second = TensorBoardLogger(tmp_path, name="tb", version="")
    second.log_hyperparams({"lr": 0.1})
    callback = PurgeResumedSteps()
    trainer = SimpleNamespace(ckpt_path="last.ckpt", is_global_zero=True, loggers=[second])
    callback.on_load_checkpoint(trainer, FakeModule(), {"zerotir": {"rl_steps_done": 3}})  # the restore
    callback.on_train_start(trainer, FakeModule())
    assert callback.purged_from == 4
    log_steps(second, [4, 5, 6], 100.0)
    second.experiment.close()

    scalars = read_scalars(tmp_path / "tb")
    assert scalars["reward"] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 104.0), (5, 105.0), (6, 106.0)]
    assert [s for s, _ in scalars["other"]] == [1, 2, 3, 4, 5, 6]
    report = load_run("run", tmp_path / "tb")  # what `zerotir scaling` reads
    assert report.scalars["reward"].to_dict() == {1: 1.0, 2: 2.0, 3: 3.0, 4: 104.0, 5: 105.0, 6: 106.0}


def test_a_fresh_run_purges_nothing(tmp_path):
    logger = TensorBoardLogger(tmp_path, name="tb", version="")
    callback = PurgeResumedSteps()
    callback.on_train_start(SimpleNamespace(ckpt_path=None, is_global_zero=True, loggers=[logger]), FakeModule())
    assert callback.purged_from is None
