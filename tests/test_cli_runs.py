"""Runs that never start or have nothing to do leave nothing behind and say why: ``trainer.max_steps 0``, a resume
of a finished run (a file or a DeepSpeed folder), a run that fails before its first RL step (bad data, an
unreachable sandbox), the model table printed only after the sandbox started."""

from __future__ import annotations

import pytest
import torch

from tests.ports import dead_url
from tests.test_cli import CONFIG, REPO, toy_cli
from zerotir.cli.app import ZeroTIRCLI
from zerotir.cli.checks import check_not_finished


def test_zero_max_steps_is_an_error_before_anything_starts(no_toy_build, tiny_dir, tmp_path):
    with pytest.raises(ValueError, match=r"trainer.max_steps=0.*--trainer.max_steps N"):
        toy_cli("--model.base.path", str(tiny_dir), "--toy_base", "null", "--trainer.max_steps", "0", root=tmp_path)
    assert not (tmp_path / "tensorboard").exists()


def test_resuming_a_finished_run_says_to_raise_max_steps(tiny_dir, tmp_path, monkeypatch):
    (tmp_path / "checkpoints").mkdir()
    torch.save({"global_step": 20, "state_dict": {}}, tmp_path / "checkpoints" / "last.ckpt")
    monkeypatch.chdir(REPO)
    finished = r"the run is finished.*RL step 20.*trainer.max_steps=20.*--trainer.max_steps 40"
    with pytest.raises(ValueError, match=finished):
        ZeroTIRCLI(args=["fit", "--config", CONFIG, "--model.base.path", str(tiny_dir), "--toy_base", "null",
                         "--trainer.default_root_dir", str(tmp_path), "--ckpt_path", "last"])


def test_a_run_that_fails_before_its_first_step_leaves_no_log_folder(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    with pytest.raises(FileNotFoundError):
        ZeroTIRCLI(args=["fit", "--config", CONFIG, "--model.base.path", str(tiny_dir), "--toy_base", "null",
                         "--data.train_files", f"[{tmp_path / 'missing.jsonl'}]",
                         "--trainer.default_root_dir", str(tmp_path / "run")])
    assert not (tmp_path / "run").exists()  # the run folder it created, left empty, is gone too


def test_only_rank_zero_removes_the_log_folder_of_a_failed_run(tiny_dir, tmp_path, monkeypatch):
    """Every rank of a multi-process run fails together; the folder is rank 0's to remove (two ranks on one file
    system removing it both raced: one rank's error became a FileNotFoundError from ``rmtree``)."""
    from lightning.pytorch import Trainer

    from zerotir.data.datamodule import PromptDataModule

    folder = tmp_path / "run" / "tensorboard"
    setup = PromptDataModule.setup

    def rank_0_wrote_its_folder(self, stage=None):  # rank 0's logger, on the file system the ranks share
        (folder / "version_0").mkdir(parents=True, exist_ok=True)
        (folder / "version_0" / "events").write_text("rank 0's")
        return setup(self, stage)

    monkeypatch.setattr(PromptDataModule, "setup", rank_0_wrote_its_folder)
    monkeypatch.setattr(Trainer, "is_global_zero", property(lambda self: False))
    monkeypatch.chdir(REPO)
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        ZeroTIRCLI(args=["fit", "--config", CONFIG, "--model.base.path", str(tiny_dir), "--toy_base", "null",
                         "--data.train_files", f"[{tmp_path / 'missing.jsonl'}]",
                         "--trainer.default_root_dir", str(tmp_path / "run")])
    assert (folder / "version_0" / "events").read_text() == "rank 0's"  # rank 1 left it to rank 0


def test_a_run_whose_sandbox_is_unreachable_leaves_no_log_folder(tiny_dir, tmp_path, monkeypatch):
    """The sandbox health check fails before step 1 (a closed loopback port): the error names it, no folder stays."""
    url = dead_url()
    monkeypatch.chdir(REPO)
    with pytest.raises(Exception, match="sandbox") as failed:
        ZeroTIRCLI(args=["fit", "--config", CONFIG, "--model.base.path", str(tiny_dir), "--toy_base", "null",
                         "--model.tool.sandbox.urls", f"[{url}]", "--model.tool.sandbox.retries", "0",
                         "--trainer.default_root_dir", str(tmp_path / "run")])
    assert url in str(failed.value)
    assert not (tmp_path / "run" / "tensorboard").exists()


def test_the_model_table_comes_after_the_sandbox_start(tiny_dir, tmp_path, monkeypatch):
    """No sandbox answering: its error is the first thing printed, not the line under a table of the model."""
    from zerotir.cli.app import LateModelSummary
    from zerotir.module import ZeroTIRModule

    def no_sandbox(self):
        raise ConnectionError("no sandbox")

    tables = []
    monkeypatch.setattr(LateModelSummary, "summarize", staticmethod(lambda *args, **kwargs: tables.append(args)))
    monkeypatch.setattr(ZeroTIRModule, "_start_source", no_sandbox)
    monkeypatch.chdir(REPO)
    cli = ZeroTIRCLI(args=["--config", CONFIG, "--model.base.path", str(tiny_dir), "--toy_base", "null",
                           "--trainer.default_root_dir", str(tmp_path)], run=False)
    assert sum(isinstance(cb, LateModelSummary) for cb in cli.trainer.callbacks) == 1
    with pytest.raises(ConnectionError):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert tables == []  # the table would have been printed before the sandbox start


@pytest.mark.parametrize("states", ["mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt"])
def test_resuming_a_finished_deepspeed_run_says_to_raise_max_steps(tmp_path, states):
    """A DeepSpeed checkpoint is a folder; Lightning's trainer state is rank 0's model-states file's client state
    (ZeRO-2 and ZeRO-3 name it differently)."""
    folder = tmp_path / "last.ckpt" / "checkpoint"
    folder.mkdir(parents=True)
    torch.save({"global_step": 6, "module": None}, folder / states)
    with pytest.raises(ValueError, match=r"the run is finished.*RL step 6.*--trainer.max_steps 12"):
        check_not_finished("last", str(tmp_path), 6)
    check_not_finished("last", str(tmp_path), 7)  # a run with steps left resumes


def test_resuming_last_where_no_checkpoint_is_names_the_folder_and_the_fix(tiny_dir, tmp_path, monkeypatch, capsys):
    """``fit --ckpt_path last`` with nothing to resume: Lightning warned and trained from step 0 with exit status 0."""
    import zerotir.__main__ as entry

    monkeypatch.chdir(REPO)
    monkeypatch.setenv("ZEROTIR_DEBUG", "0")
    with pytest.raises(SystemExit) as exited:
        entry.main(["fit", "--config", CONFIG, "--model.base.path", str(tiny_dir), "--toy_base", "null",
                    "--trainer.default_root_dir", str(tmp_path / "run"), "--trainer.max_steps", "1", "--ckpt_path",
                    "last"])  # a bounded run should the check fail to stop it
    err = capsys.readouterr().err
    assert exited.value.code == 1
    assert f"--ckpt_path last: no last.ckpt in {tmp_path / 'run' / 'checkpoints'}" in err
    assert "drop --ckpt_path last" in err and "--trainer.default_root_dir" in err
    assert not (tmp_path / "run").exists()  # nothing of the run that never started stays behind
