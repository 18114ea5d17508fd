"""The command line: linked arguments and defaults, errors that name the field, and ``python -m zerotir`` dispatch."""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint

import zerotir.__main__ as entry
from callbacks.progress import RLStepProgressBar, rl_step_description
from tests.tiny_models import save_tiny_model
from zerotir import models
from zerotir.cli.app import ZeroTIRCLI
from zerotir.config import HFRollout
from zerotir.tools.mcp_server import RUN_DIR_ENV
from zerotir.toy.pretrain import PretrainSettings

REPO = Path(__file__).resolve().parents[1]
CONFIG = str(REPO / "configs" / "tiny_cpu_ppo.yaml")


def parse_error(args: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        ZeroTIRCLI(args=args)
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("field,value", [("model.rl.algorithm", "dpo"), ("model.rl.kl_coef", "abc"),
                                         ("model.rollout", "sglang"), ("data.prompts_per_step", "many")])
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
    monkeypatch.setenv(RUN_DIR_ENV, "elsewhere")  # restored after the test
    cli = ZeroTIRCLI(args=["--config", CONFIG, "--model.base.path", str(tiny_dir),
                           "--toy_base", "null", "--trainer.default_root_dir", str(tmp_path)],
                     run=False)
    assert cli.datamodule.tokenizer_path == str(tiny_dir)  # one argument, two users
    assert (cli.datamodule.tool_format, cli.datamodule.tools) == ("fences", None)  # the prompt speaks of fences
    assert cli.trainer.checkpoint_callback.dirpath == str(tmp_path / "checkpoints")
    assert cli.trainer.checkpoint_callback.save_last is True
    assert Path(cli.trainer.logger.log_dir) == tmp_path / "tensorboard"  # fixed folder: a resume appends to it
    assert os.environ[RUN_DIR_ENV] == str(tmp_path)  # where an MCP server's stderr goes (tools/mcp_server.py)
    assert cli.model.rl.algorithm == "ppo" and cli.trainer.max_steps == 20
    assert cli.model.hparams.rl["algorithm"] == "ppo"  # plain data in checkpoints
    assert isinstance(cli.trainer.progress_bar_callback, RLStepProgressBar)
    # the callbacks the module needs and cannot add itself (zerotir/ imports nothing of callbacks/), once each
    assert [type(cb).__name__ for cb in cli.trainer.callbacks].count("PurgeResumedSteps") == 1


def test_checkpoint_group_follows_enable_checkpointing(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    cli = ZeroTIRCLI(args=["--config", CONFIG, "--model.base.path", str(tiny_dir), "--toy_base", "null",
                           "--trainer.default_root_dir", str(tmp_path), "--trainer.enable_checkpointing", "false"],
                     run=False)
    assert cli.trainer.checkpoint_callback is None
    assert not any(isinstance(cb, ModelCheckpoint) for cb in cli.trainer.callbacks)


def test_a_setting_of_another_engine_is_an_error(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    vllm = ["--model.rollout", "zerotir.config.VLLMRollout"]
    err = parse_error(["fit", "--config", CONFIG, *vllm, "--model.rollout.max_batch_size", "8", "--print_config"],
                      capsys)
    assert "model.rollout" in err and "max_batch_size" in err
    err = parse_error(["fit", "--config", CONFIG, "--model.rollout.gpu_memory_utilization", "0.5", "--print_config"],
                      capsys)  # a vLLM setting with the transformers engine
    assert "HFRollout" in err and "gpu_memory_utilization" in err and "not accepted" in err
    with pytest.raises(ValueError, match="tokens_per_call=8 applies to schedule 'rounds' only"):
        HFRollout(tokens_per_call=8)


def test_help_lists_every_group_with_its_meaning(fit_help):
    for group, field, meaning in (("rl", "clip_low", "Lower clip epsilon"), ("optim", "warmup_steps", "Linear warmup"),
                                  ("tool", "max_tool_calls", "ZeroRL baseline"), ("sampling", "n", "Samples per"),
                                  ("eval.sampling", "temperature", "greedy"), ("tool.sandbox", "urls", "embedded"),
                                  ("rollout", "", "HFRollout"), ("filters.refill", "max_rounds", "max_num_gen_batches"),
                                  ("base", "path", "hub id of the base model")):
        assert f"--model.{group}" + (f".{field}" if field else "") in fit_help, group
        assert meaning in fit_help, meaning


def test_progress_bar_names_rl_steps():
    assert rl_step_description(40) == "RL steps (of 40)" and rl_step_description(-1) == "RL steps"


def test_missing_model_folder_fails_fast(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(REPO)
    with pytest.raises(FileNotFoundError, match="model.base.path='./no_such_model'"):
        ZeroTIRCLI(args=["--config", CONFIG, "--model.base.path", "./no_such_model",
                         "--toy_base", "null", "--trainer.default_root_dir", str(tmp_path)],
                   run=False)


def test_dispatch_of_extra_commands(monkeypatch, capsys):
    calls = {}
    import zerotir.scaling.report
    import zerotir.toy.pretrain

    monkeypatch.setattr(zerotir.toy.pretrain, "main", lambda argv: calls.setdefault("toy-base", argv))
    monkeypatch.setattr(zerotir.scaling.report, "main", lambda argv: calls.setdefault("scaling", argv) and 0)
    entry.main(["toy-base", "--out", "x"])
    with pytest.raises(SystemExit):
        entry.main(["scaling", "--logdir", "runs"])
    assert calls == {"toy-base": ["--out", "x"], "scaling": ["--logdir", "runs"]}
    entry.main(["--help"])
    assert "export" in capsys.readouterr().out


def test_export_command_writes_a_loadable_folder(tiny_dir, tmp_path, capsys, monkeypatch):
    actor = models.load_causal_lm(tiny_dir)
    state = {f"actor.{k}": v * 2 for k, v in actor.state_dict().items()}
    ckpt = tmp_path / "last.ckpt"
    torch.save({"hyper_parameters": {"base": {"path": str(tiny_dir), "dtype": "float32"}}, "state_dict": state}, ckpt)
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    entry.main(["export", "--ckpt_path", str(ckpt), "--out_dir", str(tmp_path / "policy")])
    assert os.environ["DS_ACCELERATOR"] == "cpu"  # DeepSpeed's accelerator warning stays off the output
    assert "exported policy" in capsys.readouterr().out
    exported = models.load_causal_lm(tmp_path / "policy")
    name = "model.embed_tokens.weight"
    assert torch.equal(exported.state_dict()[name], actor.state_dict()[name] * 2)
    assert json.loads((tmp_path / "policy" / "config.json").read_text())["use_cache"] is True


def test_toy_base_is_built_before_anything_loads_it(tmp_path, monkeypatch):
    import zerotir.cli.app

    calls = []

    def fake_build(path, **settings):  # stands in for the minutes-long toy pretraining
        calls.append((path, settings))
        if not (tmp_path / "toy" / "config.json").exists():
            save_tiny_model(tmp_path / "toy")

    monkeypatch.setattr(zerotir.cli.app, "ensure_toy_base", fake_build)
    monkeypatch.chdir(REPO)
    own = tmp_path / "own.yaml"  # a config file naming the folder: the toy base's own folder
    own.write_text(f"model:\n  base:\n    path: {tmp_path / 'toy'}\n")
    cli = ZeroTIRCLI(args=["--config", CONFIG, "--config", str(own), "--trainer.default_root_dir", str(tmp_path)],
                     run=False)
    assert calls == [(str(tmp_path / "toy"), asdict(PretrainSettings()))]  # toy_base: {} = the toy world's defaults
    assert cli.model.base.path == str((tmp_path / "toy").resolve())


def test_the_toy_base_folder_is_read_from_the_merged_config_files(tmp_path, monkeypatch):
    """Any number and order of --config files: the last that sets model.base.path names the toy base's own folder;
    an overlay (a shipped one, or a user's ``model:`` without ``base.path``) is not parsed as a whole config."""
    import zerotir.cli.app

    calls = []

    def fake_build(path, **settings):  # stands in for the toy pretraining
        calls.append(path)
        save_tiny_model(path)

    monkeypatch.setattr(zerotir.cli.app, "ensure_toy_base", fake_build)
    monkeypatch.chdir(REPO)
    own = tmp_path / "own.yaml"
    own.write_text(f"model:\n  base:\n    path: {tmp_path / 'toy'}\n")
    mine = tmp_path / "mine.yaml"  # a user's overlay: sets model: without base.path
    mine.write_text("model:\n  optim:\n    lr: 3.0e-05\n")
    cli = ZeroTIRCLI(args=["--config", str(REPO / "configs" / "toy_cpu.yaml"), "--config", str(own), "--config",
                           str(REPO / "configs" / "toy_cpu_ppo.yaml"), "--config", str(mine),
                           "--trainer.default_root_dir", str(tmp_path)], run=False)
    assert calls == [str(tmp_path / "toy")]  # built at the folder the merged files name
    assert cli.model.rl.algorithm == "ppo" and cli.model.optim.lr == 3.0e-05  # every file's settings merged


def test_rl_settings_that_cannot_work_fail_before_the_toy_base_is_built(no_toy_build, tmp_path):
    toy = str(REPO / "configs" / "toy_cpu.yaml")  # the base of the two overlays below
    grpo = str(REPO / "configs" / "toy_cpu_grpo.yaml")
    with pytest.raises(ValueError, match="kl_coef=0.01 and use_kl_loss=false.*grpo_kl_in_reward: true"):
        ZeroTIRCLI(args=["--config", toy, "--config", grpo, "--model.rl.kl_coef", "0.01",
                         "--model.rl.use_kl_loss", "false",
                         "--model.base.path", str(tmp_path / "toy"), "--trainer.default_root_dir", str(tmp_path)],
                   run=False)
    with pytest.raises(ValueError, match="algorithm=rloo with model.sampling.n=1"):
        ZeroTIRCLI(args=["--config", toy, "--config", str(REPO / "configs" / "toy_cpu_rloo.yaml"),
                         "--model.sampling.n", "1",
                         "--model.base.path", str(tmp_path / "toy"), "--trainer.default_root_dir", str(tmp_path)],
                   run=False)


def test_help_describes_every_estimator_and_option(fit_help):
    for words in ('"reinforce_baseline" (REINFORCE++-baseline', '"rloo" (leave-one-out group baseline',
                  "--model.rl.dual_clip", "--model.rl.loss_agg_mode", "Dr. GRPO", "--model.rl.gae_injected",
                  '"restart" (the paper\'s code', "--model.rl.whiten_eps", "--model.rl.grpo_std_eps",
                  "--model.rl.grpo_kl_in_reward", "--model.rl.kl_clamp", "--model.rl.is_band_low",
                  "--model.rl.is_band_high", '"token_mask" (IcePop'):
        assert words in fit_help, words


def test_deepspeed_uses_its_cpu_accelerator_without_cuda(monkeypatch):
    import zerotir.cli.checks

    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    monkeypatch.setattr(zerotir.cli.checks.torch.cuda, "is_available", lambda: True)
    zerotir.cli.checks.use_cpu_deepspeed_without_cuda()
    assert "DS_ACCELERATOR" not in os.environ  # a GPU machine keeps DeepSpeed's own detection
    monkeypatch.setattr(zerotir.cli.checks.torch.cuda, "is_available", lambda: False)
    zerotir.cli.checks.use_cpu_deepspeed_without_cuda()
    assert os.environ["DS_ACCELERATOR"] == "cpu"
    monkeypatch.setenv("DS_ACCELERATOR", "xpu")  # an explicit choice wins
    zerotir.cli.checks.use_cpu_deepspeed_without_cuda()
    assert os.environ["DS_ACCELERATOR"] == "xpu"


def toy_cli(*args: str, root: Path) -> ZeroTIRCLI:
    return ZeroTIRCLI(args=["--config", CONFIG, *args, "--trainer.default_root_dir", str(root)], run=False)


def test_a_mistyped_model_path_of_a_toy_config_fails_instead_of_pretraining_there(no_toy_build, tmp_path):
    own = yaml.safe_load(Path(CONFIG).read_text())["model"]["base"]["path"]
    with pytest.raises(models.ModelNotFoundError, match=r"model.base.path='runs/toy_bsae': no such folder.*only at "
                                                        rf"its own folder '{re.escape(own)}'"):
        toy_cli("--model.base.path", "runs/toy_bsae", root=tmp_path)


def test_a_real_model_folder_with_a_toy_config_names_toy_base_null(no_toy_build, tiny_dir, tmp_path):
    with pytest.raises(ValueError, match=r"not a toy base.*--toy_base null") as exc:
        toy_cli("--model.base.path", str(tiny_dir), root=tmp_path)
    assert "--out" not in str(exc.value)


def test_a_toy_base_elsewhere_is_reused_only_with_the_same_settings(tmp_path, monkeypatch):
    import zerotir.cli.app

    base = tmp_path / "other_base"
    save_tiny_model(base)
    (base / "toy_base.json").write_text(json.dumps({"settings": PretrainSettings(head_dim=32).identity()}))
    calls = []
    monkeypatch.setattr(zerotir.cli.app, "ensure_toy_base", lambda path, **settings: calls.append(path))
    monkeypatch.chdir(REPO)
    with pytest.raises(ValueError, match=r"other settings \(head_dim: 32 there, 0 in toy_base\).*--toy_base null"):
        toy_cli("--model.base.path", str(base), root=tmp_path)  # it would be rebuilt with head_dim 0
    assert calls == []
    toy_cli("--model.base.path", str(base), "--toy_base.head_dim", "32", root=tmp_path)
    assert calls == [str(base)]  # the same settings: ensure_toy_base reuses it


def test_an_overlay_without_a_model_path_keeps_the_base_configs_folder(tmp_path, monkeypatch):
    """An overlay that does not name model.base.path (configs/toy_cpu_fleet.yaml, configs/rehearsal/zero3_fleet.yaml)
    on a toy config: the base is built at the folder the first file names. Looking for that folder once parsed each
    file alone, and the overlay alone failed the whole command line (its links need model.base.path)."""
    import zerotir.cli.app

    calls = []
    monkeypatch.setattr(zerotir.cli.app, "ensure_toy_base", lambda path, **settings: calls.append(path))
    monkeypatch.chdir(REPO)
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("model:\n  seed: 3\n")
    toy_cli("--config", str(overlay), root=tmp_path)
    assert calls == [yaml.safe_load(Path(CONFIG).read_text())["model"]["base"]["path"]]


def test_the_usage_docs_sandbox_urls_example_works_on_the_toy_configs(tiny_dir, tmp_path, monkeypatch):
    """docs/usage.md's override of model.tool.sandbox.urls, on a config that sizes its embedded sandbox (workers: 2):
    the servers named on the command line unset the file's embedded settings; both in one file stay an error."""
    line = next(t for t in (REPO / "docs" / "usage.md").read_text().split("`") if t.startswith("--model.tool.sandbox.urls"))
    example = shlex.split(line)
    monkeypatch.chdir(REPO)
    common = ["--model.base.path", str(tiny_dir), "--toy_base", "null"]
    cli = toy_cli(*common, *example, root=tmp_path)
    assert cli.model.sandbox_config.urls == ["http://127.0.0.1:8080"] and cli.model.sandbox_config.workers is None
    both = tmp_path / "both.yaml"
    both.write_text("model:\n  tool:\n    sandbox:\n      urls: [http://127.0.0.1:8080]\n      workers: 2\n")
    with pytest.raises(ValueError, match=r"model.tool.sandbox.workers=2.*--model.tool.sandbox.workers null"):
        toy_cli(*common, "--config", str(both), root=tmp_path)


def test_a_mistyped_key_says_did_you_mean_and_the_groups_keys_not_the_usage(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("JSONARGPARSE_DEBUG", "false")
    err = parse_error(["fit", "--config", CONFIG, "--model.rl.kl_coeff", "0.1", "--print_config"], capsys)
    assert "unrecognized arguments: --model.rl.kl_coeff" in err
    assert "did you mean: --model.rl.kl_coef" in err and "keys of model.rl: algorithm, clip_high" in err
    assert "usage:" not in err and len(err.splitlines()) <= 5
    assert "python -m zerotir fit --help" in err


def test_a_failed_check_prints_its_message_and_exits_without_a_traceback(tiny_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("ZEROTIR_DEBUG", "0")  # --debug below sets both; restored after the test
    monkeypatch.setenv("JSONARGPARSE_DEBUG", "false")
    args = ["fit", "--config", str(REPO / "configs" / "toy_cpu.yaml"), "--config",
            str(REPO / "configs" / "toy_cpu_grpo.yaml"), "--model.rl.use_kl_loss", "true",
            "--model.base.path", str(tiny_dir), "--toy_base", "null", "--trainer.default_root_dir", str(tmp_path)]
    with pytest.raises(SystemExit) as exc:
        entry.main(args)
    err = capsys.readouterr().err
    assert exc.value.code == 1
    assert "\nerror: model.rl.use_kl_loss=true with kl_coef=0" in "\n" + err and "Traceback" not in err
    assert "--debug" in err
    with pytest.raises(ValueError, match="use_kl_loss=true"):  # --debug: the exception and its traceback
        entry.main([*args, "--debug"])


def test_validate_and_test_write_runs_of_their_own(tiny_dir, tmp_path, monkeypatch):
    """Reports, events and config.yaml of ``validate`` / ``test`` go to ``<root>/<command>/<stamp>``: never into the
    training run's folders (``<root>/eval``, ``<root>/tensorboard``), and two test runs never share one."""
    monkeypatch.chdir(REPO)
    small = ["--config", CONFIG, "--model.base.path", str(tiny_dir), "--toy_base", "null",
             "--trainer.default_root_dir", str(tmp_path), "--trainer.enable_progress_bar", "false",
             "--data.limit_val_rows", "2", "--data.limit_test_rows", "2", "--model.eval.sampling.max_response_tokens",
             "4", "--model.tool.max_tool_calls", "0", "--model.tool.sandbox.workers", "null"]
    for command in ("validate", "test", "test"):
        ZeroTIRCLI(args=[command, *small])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["test", "validate"]  # nothing in the training folders
    tests = sorted((tmp_path / "test").iterdir())
    assert len(tests) == 2 and tests[0] != tests[1]
    for run, split in ((*(tmp_path / "validate").iterdir(), "val"), (tests[0], "test"), (tests[1], "test")):
        names = {p.name for p in (run / "eval").iterdir()}
        assert any(n.startswith(split) and n.endswith("_summary.json") for n in names), names
        assert (run / "tensorboard" / "config.yaml").is_file()


def test_a_negative_number_on_the_command_line_is_a_value(capsys, monkeypatch):
    from zerotir.cli.app import cli_main
    from zerotir.cli.checks import join_negative_values

    assert join_negative_values(["--a", "-1e-4", "--b", "-3", "--c=-2", "-h", "--d", "-.5"]) == \
        ["--a=-1e-4", "--b=-3", "--c=-2", "-h", "--d=-.5"]
    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit) as exc:
        cli_main(["fit", "--config", CONFIG, "--model.optim.lr", "-1e-4", "--print_config"])
    out = capsys.readouterr()
    assert exc.value.code in (None, 0), out.err
    assert yaml.safe_load(out.out)["model"]["optim"]["lr"] == -1e-4


def test_a_gpu_config_without_cuda_names_the_accelerator_and_the_rehearsals(tmp_path, monkeypatch):
    import zerotir.cli.checks

    monkeypatch.setattr(zerotir.cli.checks.torch.cuda, "is_available", lambda: False)
    monkeypatch.chdir(REPO)
    with pytest.raises(ValueError, match=r"trainer.accelerator='gpu'.*--trainer.accelerator cpu.*configs/rehearsal/"):
        ZeroTIRCLI(args=["--config", "configs/qwen2.5-7b_reinforce.yaml", "--trainer.default_root_dir",
                         str(tmp_path)], run=False)


def test_a_mistyped_key_in_a_yaml_file_names_the_file_and_the_subcommands_help(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(REPO)
    typo = tmp_path / "mine.yaml"
    typo.write_text("model:\n  rl:\n    kl_coeff: 0.1\n")
    err = parse_error(["fit", "--config", CONFIG, "--config", str(typo), "--print_config"], capsys)
    assert f"in the config file {typo}" in err and "did you mean: --model.rl.kl_coef" in err
    assert "(every option with its meaning: python -m zerotir fit --help)" in err


# ``python -m zerotir`` in a fresh interpreter, ended at its first line of output: the line, and whether Lightning
# and torch were imported when it was written.
FIRST_LINE = """import os, sys
from zerotir.__main__ import main
class Probe:
    def __init__(self, stream):
        self.stream = stream
    def write(self, text):
        if text.strip():
            print([text.strip(), 'lightning' in sys.modules, 'torch' in sys.modules], file=sys.__stdout__, flush=True)
            os._exit(0)
        return self.stream.write(text)
    def __getattr__(self, name):
        return getattr(self.stream, name)
sys.stdout, sys.stderr = Probe(sys.stdout), Probe(sys.stderr)
sys.argv = ['zerotir'] + sys.argv[1:]
main()
"""


def test_a_run_says_its_first_line_before_torch_and_lightning_load():
    """Importing torch, Lightning and transformers takes tens of seconds under load: the command's first line comes
    before them. (Should no line come first, the run would fail its GPU check after the parse.)"""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", FIRST_LINE, "fit", "--config", "configs/toy_cpu.yaml",
                           "--trainer.accelerator", "gpu"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == ("['zerotir fit: config configs/toy_cpu.yaml, starting (loading torch and "
                                   "Lightning)...', False, False]"), done.stdout + done.stderr[-2000:]


def test_the_progress_bar_is_given_the_runs_tools(tiny_dir, tmp_path, no_toy_build):
    tools = json.dumps([{"class_path": "python"}, {"class_path": "calculator"}])
    cli = toy_cli("--model.base.path", str(tiny_dir), "--toy_base", "null", "--model.tool.format", "hermes",
                  "--model.tool.tools", tools, root=tmp_path)
    (bar,) = [cb for cb in cli.trainer.callbacks if isinstance(cb, RLStepProgressBar)]
    assert bar.tools == ["python", "calculator"]
    cli = toy_cli("--model.base.path", str(tiny_dir), "--toy_base", "null", "--model.tool.max_tool_calls", "0",
                  "--model.tool.sandbox.workers", "null", root=tmp_path)
    assert [cb.tools for cb in cli.trainer.callbacks if isinstance(cb, RLStepProgressBar)] == [[]]


def test_the_start_line_names_the_tools_and_the_call_format(tiny_dir, tmp_path, no_toy_build, caplog):
    tools = json.dumps([{"class_path": "python"}, {"class_path": "calculator"}])
    with caplog.at_level("INFO", logger="zerotir.cli.app"):
        toy_cli("--model.base.path", str(tiny_dir), "--toy_base", "null", "--model.tool.format", "hermes",
                "--model.tool.tools", tools, "--model.tool.max_tool_calls", "3", root=tmp_path)
    assert (f"zerotir fit: tools python, calculator (call format hermes, up to 3 calls per response); run folder "
            f"{tmp_path}") in caplog.messages


def test_export_names_both_folders_of_a_lora_export(tmp_path, capsys, monkeypatch):
    written = []

    def export_policy(ckpt_path: str, out_dir: str, model_path: str | None = None,
                      merged_dir: str | None = None) -> Path:  # the real one's signature, which the parser reads
        written.append((out_dir, merged_dir))
        return Path(out_dir)

    monkeypatch.setattr(models, "export_policy", export_policy)
    entry.main(["export", "--ckpt_path", "x.ckpt", "--out_dir", str(tmp_path / "adapters"),
                f"--merged_dir={tmp_path / 'merged'}"])
    assert written == [(str(tmp_path / "adapters"), str(tmp_path / "merged"))]
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"exported policy to {tmp_path / 'adapters'} and the merged model (base + adapters) to {tmp_path / 'merged'}")
    entry.main(["export", "--ckpt_path", "x.ckpt", "--out_dir", str(tmp_path / "policy")])
    assert capsys.readouterr().out.splitlines()[-1] == f"exported policy to {tmp_path / 'policy'}"


def test_testing_an_exported_model_with_a_toy_config_says_evaluate_not_train(no_toy_build, tiny_dir, tmp_path):
    with pytest.raises(ValueError, match=r"not a toy base.*To evaluate this model as it is, add --toy_base null"):
        ZeroTIRCLI(args=["test", "--config", CONFIG, "--model.base.path", str(tiny_dir),
                         "--trainer.default_root_dir", str(tmp_path)])
    assert list((tmp_path / "test").iterdir()) == []  # the test run's own folder, empty, is gone
    with pytest.raises(ValueError, match=r"To train this model as it is, add --toy_base null"):
        toy_cli("--model.base.path", str(tiny_dir), root=tmp_path)
