"""``callbacks.SaveOnInterrupt`` decides from the run's state: a checkpoint only of a whole step, and a line naming
where ``--ckpt_path last`` resumes. (A real Ctrl-C of a real run: tests/e2e/test_interrupt.py.)"""

from __future__ import annotations

from types import SimpleNamespace

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn

from callbacks.interrupt import SaveOnInterrupt


def _interrupt(tmp_path, capsys, *, done: int, global_step: int, changing: bool, saved: int | None):
    saves: list[str] = []
    trainer = SimpleNamespace(state=SimpleNamespace(fn=TrainerFn.FITTING), is_global_zero=True,
                              global_step=global_step, checkpoint_callback=ModelCheckpoint(dirpath=tmp_path),
                              save_checkpoint=lambda path: saves.append(str(path)))
    module = SimpleNamespace(rl_steps_done=done, step_changing_state=changing)
    callback = SaveOnInterrupt()
    callback.saved_step = saved
    callback.on_exception(trainer, module, KeyboardInterrupt())
    return saves, capsys.readouterr().err


def test_a_step_half_applied_is_not_saved_and_the_last_checkpoint_is_named(tmp_path, capsys):
    saves, err = _interrupt(tmp_path, capsys, done=7, global_step=7, changing=True, saved=5)
    assert saves == []
    assert err == (f"zerotir: interrupted during RL step 8: the step was changing the model's state, which is not "
                   f"saved half-done; --ckpt_path last resumes at RL step 6 from the last checkpoint in {tmp_path}\n")
    saves, _ = _interrupt(tmp_path, capsys, done=7, global_step=8, changing=False, saved=5)  # optimizer stepped
    assert saves == []


def test_between_steps_the_last_completed_step_is_saved_once(tmp_path, capsys):
    saves, err = _interrupt(tmp_path, capsys, done=7, global_step=7, changing=False, saved=5)
    assert saves == [str(tmp_path / "last.ckpt")] and "saved RL step 7" in err and "resumes at RL step 8" in err
    saves, err = _interrupt(tmp_path, capsys, done=5, global_step=5, changing=False, saved=5)  # just saved
    assert saves == [] and "saved RL step 5" in err
    saves, err = _interrupt(tmp_path, capsys, done=0, global_step=0, changing=False, saved=None)
    assert saves == [] and "no RL step completed" in err
