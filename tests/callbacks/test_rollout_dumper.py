"""RolloutDumper driven hook by hook: files per step and per evaluation, every-N / keep-last, TensorBoard text
samples, and write failures that stop the run instead of vanishing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.trainer.states import TrainerFn
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

from callbacks import RolloutDumper
from tests.callbacks.helpers import FakeModule
from tests.rollout_log.test_records import batch
from zerotir.rl.step import BatchInfo, StepResult
from zerotir.rollout_log import records as R
from zerotir.rollout_log.writer import RolloutWriteError


def trainer(root, loggers=()):
    return SimpleNamespace(default_root_dir=str(root), global_rank=0, world_size=1, is_global_zero=True,
                           loggers=list(loggers), sanity_checking=False, state=SimpleNamespace(fn=TrainerFn.FITTING))


def outputs(step, version=0):
    rollout = batch()
    info = BatchInfo(["Q: 3 + 4 = ?", "Q: 1 + 1 = ?"], ["a", "b"], ["toy", "toy"], version)
    return {"step": StepResult(step, rollout, torch.ones(len(rollout), dtype=torch.bool), None, {}, {}, info)}


def fit(dumper, tr, steps, module=None):
    module = module or FakeModule()
    dumper.setup(tr, module, "fit")
    for step in steps:
        dumper.on_train_batch_end(tr, module, outputs(step, step - 1), None, 0)
    return module


def text_samples(folder):
    acc = EventAccumulator(str(folder), size_guidance={"tensors": 0})
    acc.Reload()
    return {tag: {e.step: tensor_util.make_ndarray(e.tensor_proto).item().decode() for e in acc.Tensors(tag)}
            for tag in acc.Tags()["tensors"]}


def test_each_step_is_written_with_its_samples_in_tensorboard(tmp_path):
    logger = TensorBoardLogger(tmp_path, name="tb", version="")
    tr = trainer(tmp_path, [logger])
    dumper = RolloutDumper(every_n_steps=2, keep_last=2)
    module = fit(dumper, tr, [1, 2, 3, 4, 5, 6])
    # Validation after step 6: its two batches go into one file.
    dumper.on_validation_epoch_start(tr, module)
    for _ in range(2):
        dumper.on_validation_batch_end(tr, module, outputs(6, 6), None, 0)
    dumper.on_validation_epoch_end(tr, module)
    dumper.on_fit_end(tr, module)
    folder = tmp_path / "rollouts"
    assert list(R.step_files(folder)) == [4, 6]  # steps 2, 4, 6 written; the oldest pruned
    rows = R.read_step(folder, 6)
    assert [r["index"] for r in rows] == [0, 1, 2] and {r["weight_version"] for r in rows} == {5}
    assert rows[2]["tool_calls"] == [{"tool": "python", "code": "1/0\n", "status": "error",
                                      "output": "ZeroDivisionError"}]
    val = R.read_step(folder, 6, "val")
    assert len(val) == 6 and [r["index"] for r in val] == list(range(6)) and val[0]["split"] == "val"
    logger.experiment.flush()
    texts = text_samples(tmp_path / "tb")
    assert set(texts) == {f"{p}/{k}/text_summary" for p in ("samples", "val_samples")
                          for k in ("best", "worst", "exec_error")}
    assert sorted(texts["samples/best/text_summary"]) == [2, 4, 6]
    error = texts["samples/exec_error/text_summary"][6]
    assert error.startswith("**exec_error, step 6**") and "```python\n1/0\n```" in error


def test_samples_without_tensorboard_are_announced(tmp_path):
    with pytest.warns(UserWarning, match=r"tensorboard_samples needs a TensorBoardLogger, and the loggers are \[\]"):
        RolloutDumper().setup(trainer(tmp_path), FakeModule(), "fit")


def test_disabled_writes_nothing(tmp_path):
    dumper = RolloutDumper(enabled=False)
    fit(dumper, trainer(tmp_path), [1])
    dumper.on_fit_end(trainer(tmp_path), None)
    assert not (tmp_path / "rollouts").exists()


def test_a_failed_write_stops_the_run_with_its_cause(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the folder should be")
    tr = trainer(tmp_path)
    dumper = RolloutDumper(dirpath=str(blocker / "rollouts"))
    fit(dumper, tr, [1])
    with pytest.raises(RolloutWriteError, match="writing rollouts failed") as info:
        dumper.on_fit_end(tr, None)
    assert isinstance(info.value.__cause__, OSError)
    # On the exception path the failure is logged and the run's own exception is left to propagate.
    dumper = RolloutDumper(dirpath=str(blocker / "rollouts"))
    fit(dumper, tr, [1])
    dumper.on_exception(tr, None, KeyboardInterrupt())


def test_outputs_that_break_the_protocol_are_named():
    dumper = RolloutDumper()
    with pytest.raises(TypeError, match=r"`training_step` must return \{'step': StepResult\}"):
        dumper.on_train_batch_end(trainer("."), FakeModule(), None, None, 0)
    with pytest.raises(ValueError, match="every_n_steps must be an int >= 1"):
        RolloutDumper(every_n_steps=0)
    with pytest.raises(ValueError, match="keep_last must be None"):
        RolloutDumper(keep_last=0)


def test_every_trajectory_of_a_step_is_written_kept_by_the_filter_or_not(tmp_path):
    """The pass-rate rule drops a group (its only answer is wrong); the real ``rl_step`` trains on the rest; the
    dumped file still holds every trajectory of the step, the dropped one with its reward, in rollout order."""
    from tests.rl.test_step import SAMPLING, Recording, tiny_actor
    from zerotir.config import FilterConfig, RLConfig
    from zerotir.filters.pass_rate import pass_rate
    from zerotir.rl.step import Models, rl_step

    rollout = batch()  # groups [0, 0, 1], rewards [1, 0, 0]: group 1 never solved
    decision = pass_rate(FilterConfig(pass_rate=True), rollout)
    assert decision.keep.tolist() == [True, True, False]
    actor = tiny_actor()
    result = rl_step(RLConfig(micro_batch_size=4), rollout, decision, Models(actor), Recording(actor).callables,
                     step=1, seed=0, **SAMPLING)
    result.batch = BatchInfo(["Q: 3 + 4 = ?", "Q: 1 + 1 = ?"], ["a", "b"], ["toy", "toy"], 0)
    tr = trainer(tmp_path)
    dumper = RolloutDumper(tensorboard_samples=False)
    dumper.setup(tr, FakeModule(), "fit")
    dumper.on_train_batch_end(tr, FakeModule(), {"step": result}, None, 0)
    dumper.on_fit_end(tr, FakeModule())
    rows = R.read_step(tmp_path / "rollouts", 1)
    assert [(r["index"], r["problem_id"], r["reward"]) for r in rows] == [(0, "a", 1.0), (1, "a", 0.0), (2, "b", 0.0)]
    assert rows[2]["tool_calls"] == [{"tool": "python", "code": "1/0\n", "status": "error",
                                      "output": "ZeroDivisionError"}]
    assert [r["filtered_by"] for r in rows] == [[], [], []]  # a plain pass-rate decision records no rule


def test_a_dumped_trajectory_names_the_filters_that_removed_it(tmp_path):
    """The step's decision of ``model.filters`` (``zerotir.filters.decide``): group 1 is dropped by the pass rate,
    and rows 1 and 2 end with a void turn; the file keeps every row, each with its rules."""
    from zerotir.config import FilterConfig, ToolConfig
    from zerotir.filters.decide import decide
    from zerotir.filters.trajectory import FilterContext

    rollout = batch()
    rollout.response_texts[1] = "I give up."  # one turn, neither a code block nor an answer
    decision = decide(FilterConfig(pass_rate=True, void_turn=True), rollout, FilterContext.of(ToolConfig(), 16),
                      step=1, seed=0)
    info = BatchInfo(["Q: 3 + 4 = ?", "Q: 1 + 1 = ?"], ["a", "b"], ["toy", "toy"], 0)
    tr = trainer(tmp_path)
    dumper = RolloutDumper(tensorboard_samples=False)
    dumper.setup(tr, FakeModule(), "fit")
    dumper.on_train_batch_end(tr, FakeModule(), {"step": StepResult(1, rollout, decision.keep, decision, {}, {}, info)},
                              None, 0)
    dumper.on_fit_end(tr, FakeModule())
    rows = R.read_step(tmp_path / "rollouts", 1)
    # Row 2 stops right after its output block (an empty last turn): a void turn, in a group the pass rate dropped.
    assert [r["filtered_by"] for r in rows] == [[], ["void_turn"], ["pass_rate", "void_turn"]]
