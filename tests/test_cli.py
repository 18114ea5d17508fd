"""The command line: linked arguments and defaults, errors that name the field, and ``python -m zerotir`` dispatch."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import zerotir.__main__ as entry
from zerotir import models
from zerotir.cli import ZeroTIRCLI
from zerotir.toy.tiny_model import build_tiny_model
from zerotir.toy.tokenizer import build_byte_tokenizer

REPO = Path(__file__).resolve().parents[1]
CONFIG = str(REPO / "configs" / "tiny_cpu_ppo.yaml")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    build_tiny_model(build_byte_tokenizer(), save_dir=path, hidden_size=32, num_layers=2, num_heads=2)
    return path


def parse_error(args: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        ZeroTIRCLI(args=args)
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("field,value", [("model.algorithm", "dpo"), ("model.kl_coef", "abc"),
                                         ("model.rollout_backend", "sglang"), ("data.prompts_per_step", "many")])
def test_bad_value_names_the_field(field, value, capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    err = parse_error(["fit", "--config", CONFIG, f"--{field}", value, "--print_config"], capsys)
    assert field in err


def test_tokenizer_is_linked_not_set_twice(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    err = parse_error(["fit", "--config", CONFIG, "--data.tokenizer", "other", "--print_config"], capsys)
    assert "data.tokenizer" in err


def test_instantiation_links_and_defaults(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    cli = ZeroTIRCLI(args=["--config", CONFIG, "--model.model_path", str(tiny_dir),
                           "--model.build_toy_base_if_missing", "false", "--trainer.default_root_dir", str(tmp_path)],
                     run=False)
    assert cli.datamodule.tokenizer_path == str(tiny_dir)  # one argument, two users
    assert cli.trainer.checkpoint_callback.dirpath == str(tmp_path / "checkpoints")
    assert cli.trainer.checkpoint_callback.save_last is True
    assert Path(cli.trainer.logger.log_dir) == tmp_path / "tensorboard"  # fixed folder: a resume appends to it
    assert cli.model.hparams.algorithm == "ppo" and cli.trainer.max_steps == 20


def test_missing_model_folder_fails_fast(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(REPO)
    with pytest.raises(FileNotFoundError, match="model_path='./no_such_model'"):
        ZeroTIRCLI(args=["--config", CONFIG, "--model.model_path", "./no_such_model",
                         "--model.build_toy_base_if_missing", "false", "--trainer.default_root_dir", str(tmp_path)],
                   run=False)


def test_dispatch_of_extra_commands(monkeypatch, capsys):
    calls = {}
    import zerotir.scaling
    import zerotir.toy.pretrain

    monkeypatch.setattr(zerotir.toy.pretrain, "main", lambda argv: calls.setdefault("toy-base", argv))
    monkeypatch.setattr(zerotir.scaling, "main", lambda argv: calls.setdefault("scaling", argv) and 0)
    entry.main(["toy-base", "--out", "x"])
    with pytest.raises(SystemExit):
        entry.main(["scaling", "--logdir", "runs"])
    assert calls == {"toy-base": ["--out", "x"], "scaling": ["--logdir", "runs"]}
    entry.main(["--help"])
    assert "export" in capsys.readouterr().out


def test_export_command_writes_a_loadable_folder(tiny_dir, tmp_path, capsys):
    actor = models.load_causal_lm(tiny_dir)
    state = {f"actor.{k}": v * 2 for k, v in actor.state_dict().items()}
    ckpt = tmp_path / "last.ckpt"
    torch.save({"hyper_parameters": {"model_path": str(tiny_dir), "dtype": "float32"}, "state_dict": state}, ckpt)
    entry.main(["export", "--ckpt_path", str(ckpt), "--out_dir", str(tmp_path / "policy")])
    assert "exported policy" in capsys.readouterr().out
    exported = models.load_causal_lm(tmp_path / "policy")
    name = "model.embed_tokens.weight"
    assert torch.equal(exported.state_dict()[name], actor.state_dict()[name] * 2)
    assert json.loads((tmp_path / "policy" / "config.json").read_text())["use_cache"] is True


def test_toy_base_is_built_before_anything_loads_it(tmp_path, monkeypatch):
    import zerotir.cli
    import zerotir.module

    calls = []

    def fake_build(path, settings):  # stands in for the minutes-long toy pretraining
        calls.append((path, settings))
        if not (tmp_path / "toy" / "config.json").exists():
            build_tiny_model(build_byte_tokenizer(), save_dir=tmp_path / "toy", hidden_size=32, num_heads=2)

    monkeypatch.setattr(zerotir.cli, "ensure_toy_base", fake_build)
    monkeypatch.setattr(zerotir.module, "ensure_toy_base", fake_build)
    monkeypatch.chdir(REPO)
    cli = ZeroTIRCLI(args=["--config", CONFIG, "--model.model_path", str(tmp_path / "toy"),
                           "--trainer.default_root_dir", str(tmp_path)], run=False)
    assert calls[0] == (str(tmp_path / "toy"), None)  # None: the toy world's default settings
    assert cli.model.model_path == str((tmp_path / "toy").resolve())


def test_rl_settings_that_cannot_work_fail_before_the_toy_base_is_built(tmp_path, monkeypatch):
    import zerotir.cli

    def no_build(path, settings):
        raise AssertionError("the toy base must not be built for a config that cannot train")

    monkeypatch.setattr(zerotir.cli, "ensure_toy_base", no_build)
    monkeypatch.chdir(REPO)
    grpo = str(REPO / "configs" / "toy_cpu_grpo.yaml")
    with pytest.raises(ValueError, match="kl_coef=0.01 and use_kl_loss=false.*grpo_kl_in_reward: true"):
        ZeroTIRCLI(args=["--config", grpo, "--model.kl_coef", "0.01", "--model.use_kl_loss", "false",
                         "--model.model_path", str(tmp_path / "toy"), "--trainer.default_root_dir", str(tmp_path)],
                   run=False)
    with pytest.raises(ValueError, match="algorithm=rloo with n_samples=1"):
        ZeroTIRCLI(args=["--config", str(REPO / "configs" / "toy_cpu_rloo.yaml"), "--model.n_samples", "1",
                         "--model.model_path", str(tmp_path / "toy"), "--trainer.default_root_dir", str(tmp_path)],
                   run=False)


def test_help_describes_every_estimator_and_option(capsys):
    with pytest.raises(SystemExit):
        ZeroTIRCLI(args=["fit", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the lines
    for words in ('"reinforce_baseline" (the paper\'s', '"rloo" (reward minus the mean of the prompt\'s other',
                  "--model.dual_clip", "--model.loss_agg_mode", "Dr. GRPO", "--model.gae_injected",
                  '"restart": the paper\'s code', "--model.whiten_eps", "--model.grpo_std_eps",
                  "--model.grpo_kl_in_reward"):
        assert words in text, words


def test_deepspeed_uses_its_cpu_accelerator_without_cuda(monkeypatch):
    import zerotir.cli

    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    monkeypatch.setattr(zerotir.cli.torch.cuda, "is_available", lambda: True)
    zerotir.cli.use_cpu_deepspeed_without_cuda()
    assert "DS_ACCELERATOR" not in os.environ  # a GPU machine keeps DeepSpeed's own detection
    monkeypatch.setattr(zerotir.cli.torch.cuda, "is_available", lambda: False)
    zerotir.cli.use_cpu_deepspeed_without_cuda()
    assert os.environ["DS_ACCELERATOR"] == "cpu"
    monkeypatch.setenv("DS_ACCELERATOR", "xpu")  # an explicit choice wins
    zerotir.cli.use_cpu_deepspeed_without_cuda()
    assert os.environ["DS_ACCELERATOR"] == "xpu"
