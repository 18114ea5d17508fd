"""The key check of ``python -m zerotir`` (``zerotir.cli.keys``): a mistyped key answered before torch loads, naming
the key, its file and the closest valid key; every valid command (the shipped configs, the documented commands, a
printed full config, the command-line spellings of values) passes it; the committed index is the parser's."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.test_configs import CONFIGS, header_args
from tests.test_doc_commands import COMMANDS
from zerotir.cli.errors import key_hint, parse_error_text
from zerotir.cli.keys import INDEX_FILE, REGENERATE, check_keys, generate_index

REPO = Path(__file__).resolve().parents[1]
BASE = "configs/toy_cpu.yaml"
# ``python -m zerotir`` in a fresh interpreter: its exit status, then whether torch was imported.
ENTRY = ("import sys\nfrom zerotir.__main__ import main\nsys.argv = ['zerotir'] + sys.argv[1:]\n"
         "try:\n    main()\nexcept SystemExit as exc:\n    print(exc.code, 'torch' in sys.modules)\n")


def key_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        check_keys(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("typo", [["--model.rl.kl_coeff", "0.1"], ["--model.rl.kl_coeff=0.1"]])
def test_a_mistyped_key_errors_before_torch_is_imported(typo):
    done = subprocess.run([sys.executable, "-c", ENTRY, "fit", "--config", BASE, *typo],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.stdout.split() == ["2", "False"], done.stdout + done.stderr
    assert 'error: unknown key "model.rl.kl_coeff"\n' in done.stderr
    assert "did you mean: --model.rl.kl_coef" in done.stderr
    assert "(every option with its meaning: python -m zerotir fit --help)" in done.stderr


def test_a_mistyped_key_in_a_yaml_file_names_the_file(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(REPO)
    typo = tmp_path / "mine.yaml"
    typo.write_text("model:\n  optim:\n    lr: 1.0e-5\n  rl:\n    kl_coeff: 0.1\n")
    err = key_error(["validate", "-c", BASE, "--config", str(typo)], capsys)
    assert f'error: unknown key "model.rl.kl_coeff" in the config file {typo}\n' in err
    assert "did you mean: --model.rl.kl_coef" in err and "python -m zerotir validate --help" in err
    typo.write_text("trainer:\n  max_step: 3\n")
    err = key_error(["fit", f"--config={typo}"], capsys)
    assert f'unknown key "trainer.max_step" in the config file {typo}' in err
    assert "did you mean: --trainer.max_steps" in err


def test_a_mistyped_init_arg_of_a_rollout_class_named_in_a_file_is_named(capsys, tmp_path):
    typo = tmp_path / "mine.yaml"
    typo.write_text("model:\n  rollout:\n    class_path: zerotir.config.VLLMRollout\n"
                    "    init_args:\n      gpu_memory_utilisation: 0.5\n      llm_kwargs: {anything: 1}\n")
    err = key_error(["fit", "--config", str(typo)], capsys)
    assert f'unknown key "model.rollout.gpu_memory_utilisation" in the config file {typo}' in err
    assert "did you mean: --model.rollout.gpu_memory_utilization" in err
    typo.write_text(typo.read_text().replace("gpu_memory_utilisation", "gpu_memory_utilization"))
    check_keys(["fit", "--config", str(typo)])
    typo.write_text(typo.read_text().replace("zerotir.config.VLLMRollout", "my.own.Rollout"))
    check_keys(["fit", "--config", str(typo)])  # a class of the user's own: its parser judges its init_args


def test_a_mistyped_group_or_top_level_key_is_named(capsys):
    assert 'unknown key "modle.rl.kl_coef"' in key_error(["fit", "--modle.rl.kl_coef", "0.1"], capsys)
    assert 'unknown key "ckpt"' in key_error(["test", "--ckpt", "last"], capsys)


@pytest.mark.parametrize(("old", "new"), [("model.model_path", "model.base.path"),
                                           ("model.eval_sampling.n", "model.eval.sampling.n"),
                                           ("model.refill.max_rounds", "model.filters.refill.max_rounds"),
                                           ("model.sandbox.workers", "model.tool.sandbox.workers")])
def test_a_key_that_moved_names_its_new_place(old, new, capsys, tmp_path):
    """Typed, in a config file, and in the real parser's error (a key the index does not judge reaches it)."""
    moved = f"{old} moved: it is now {new} (write it there)"
    assert moved in key_error(["fit", f"--{old}", "1"], capsys)
    mine = tmp_path / "old.yaml"
    group, _, leaf = old.partition(".")
    mine.write_text(yaml.safe_dump({group: _nested(leaf.split("."), 1)}))
    err = key_error(["fit", "--config", str(mine)], capsys)
    assert f'unknown key "{".".join(old.split(".")[:2])}" in the config file {mine}' in err  # the moved group
    assert " moved: it is now " in err
    parser = argparse.ArgumentParser(prog="python -m zerotir")
    assert moved in parse_error_text(parser, f"unrecognized arguments: --{old} 1")
    assert "moved" not in key_hint("model.rl.kl_coeff", ["model.rl.kl_coef"])



# Every key the two former groups of the engine hosts had, and where it is now.
OLD_HOST_KEYS = {**{f"model.pipeline.{k}": f"model.hosts.{k}" for k in ("max_staleness", "threads")},
                 "model.pipeline.producer_device": "model.hosts.device",
                 "model.pipeline.producer_timeout": "model.hosts.timeout_s",
                 **{f"model.fleet.{k}": f"model.hosts.{k}" for k in (
                     "engines", "cpus_per_engine", "gpus_per_engine", "threads", "trainer_threads", "pin_cores",
                     "address", "weight_host", "weight_port", "max_restarts", "max_in_flight", "sandbox_per_node",
                     "timeout_s")}}


@pytest.mark.parametrize(("old", "new"), OLD_HOST_KEYS.items())
def test_each_key_of_the_two_engine_host_groups_names_its_key_in_model_hosts(old, new, capsys, tmp_path):
    """``model.pipeline`` and ``model.fleet`` became ``model.hosts`` key by key: typed, and in a config file (where
    the old group is not reported as a whole: each of its keys names its own new place)."""
    moved = f"{old} moved: it is now {new} (write it there)"
    assert moved in key_error(["fit", f"--{old}", "1"], capsys)
    mine = tmp_path / "old.yaml"
    mine.write_text(yaml.safe_dump({"model": {old.split(".")[1]: {old.split(".")[2]: 1}}}))
    err = key_error(["fit", "--config", str(mine)], capsys)
    assert f'unknown key "{old}" in the config file {mine}\n{moved}\n' in err

def test_a_callback_setting_that_moved_names_its_new_place(capsys, tmp_path):
    """PassRateFilter's bounds are model.filters settings now: said before torch loads and in the parser's error."""
    old = tmp_path / "old.yaml"
    old.write_text("trainer:\n  callbacks:\n    - class_path: callbacks.PassRateFilter\n      init_args: {low: 0.2}\n")
    err = key_error(["fit", "--config", str(old)], capsys)
    assert f"a callback setting in the config file {old} moved" in err
    assert "PassRateFilter init_args.low moved: it is now model.filters.pass_rate_low" in err
    old.write_text("trainer:\n  callbacks:\n    - class_path: callbacks.PassRateFilter\n")
    check_keys(["fit", "--config", str(old)])  # the counting callback itself stays
    message = "Given value: [{'class_path': 'callbacks.PassRateFilter', 'init_args': {'high': 0.8}}]"
    assert "init_args.high moved: it is now model.filters.pass_rate_high" in parse_error_text(
        argparse.ArgumentParser(prog="python -m zerotir"), message)


@pytest.mark.parametrize("old, new", [
    ("zerotir.scale.cpu_deepspeed.CpuDeepSpeedStrategy", "zerotir.parallel.cpu_deepspeed.CpuDeepSpeedStrategy"),
    ("zerotir.cli.LateModelSummary", "zerotir.cli.app.LateModelSummary")])
def test_a_class_path_that_moved_names_its_new_place(old, new):
    """A saved config naming a class where it used to live (``zerotir.scale``: now ``zerotir.parallel``) gets the
    new path in the parser's error, not only "No module named"."""
    message = f"Problem with given class_path '{old}': No module named 'x'\n  Given value: {{'class_path': '{old}'}}"
    text = parse_error_text(argparse.ArgumentParser(prog="python -m zerotir"), message)
    assert f"{old} moved: it is now {new} (write that in the config's class_path)\n" in text
    assert "moved" not in parse_error_text(argparse.ArgumentParser(prog="python -m zerotir"),
                                           "Problem with given class_path 'zerotir.parallel.x.Y'")


def _nested(keys: list[str], value: object) -> object:
    return value if not keys else {keys[0]: _nested(keys[1:], value)}


@pytest.mark.parametrize("args", [
    ["--model.optim.lr", "-1e-4"], ["--model.optim.lr=-1e-4"], ["--help"], ["-h"], ["--print_config"],
    ["--print_config=skip_null"], ["--ckpt_path", "last"], ["--model.rollout.help", "VLLMRollout"],
    ["--model.rollout.init_args.max_batch_size", "4"], ["--model.rollout", "HFRollout"],
    ["--trainer.callbacks+=lightning.pytorch.callbacks.LearningRateMonitor"],
    ["--trainer.callbacks.init_args.logging_interval", "step"], ["--model.tool.sandbox.server_options", '{"a": 1}'],
    ["--model.rl", '{"kl_coef": 0.1}'], ["--data.tokenizer", "x"], ["--toy_base", "null"],
    ["--toy_base.steps", "3"], ["--", "--anything"]], ids=lambda a: " ".join(a))
def test_keys_the_parser_accepts_or_judges_itself_pass(args):
    check_keys(["fit", "--config", str(REPO / BASE), *args])


def test_other_commands_and_unreadable_files_are_left_to_their_parsers(tmp_path):
    for command in ("toy-base", "scaling", "rollouts", "export", "--help", "fitt"):
        check_keys([command, "--no.such.key", "1"])
    broken = tmp_path / "broken.yaml"
    broken.write_text("model: [unclosed\n")
    check_keys(["fit", "--config", str(broken), "--config", str(tmp_path / "missing.yaml")])
    check_keys([])


def test_a_file_with_class_paths_and_open_settings_passes(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump({
        "model": {"class_path": "zerotir.module.ZeroTIRModule", "init_args": {"rl": {"kl_coef": 0.1}},
                  "rollout": {"class_path": "zerotir.config.VLLMRollout", "init_args": {"gpu_memory_utilization": 0.5}},
                  "tool": {"sandbox": {"server_options": {"anything": {"nested": 1}}}}},
        "trainer": {"callbacks": [{"class_path": "LearningRateMonitor", "init_args": {"logging_interval": "step"}}],
                    "logger": {"class_path": "TensorBoardLogger", "init_args": {"save_dir": "x"}}},
        "toy_base": {"steps": 3}}))
    check_keys(["fit", "--config", str(mine)])


def test_every_shipped_config_and_documented_command_passes(monkeypatch):
    monkeypatch.chdir(REPO)
    for path in CONFIGS:
        check_keys(header_args(path))
    commands = [shlex.split(c) for c in COMMANDS]
    commands = [w[3:] for w in commands if w[:3] == ["python", "-m", "zerotir"]]
    assert any(len(w) > 3 and w[0] == "fit" for w in commands)  # the overlay commands are among them
    for words in commands:
        check_keys(words)


@pytest.mark.parametrize("config", ["configs/toy_cpu_vllm.yaml", "configs/qwen2.5-7b_reinforce_fleet.yaml"])
def test_a_printed_full_config_passes(config, tmp_path, capsys, monkeypatch):
    from tests.test_configs import print_config

    monkeypatch.chdir(REPO)
    args = header_args(REPO / config)
    full = tmp_path / "full.yaml"
    full.write_text(yaml.safe_dump(print_config(args, capsys)))
    check_keys([args[0], "--config", str(full)])


def test_the_committed_index_is_the_parsers():
    committed = json.loads(INDEX_FILE.read_text())
    assert generate_index() == committed, f"zerotir/cli/keys.json is stale: regenerate it with `{REGENERATE}`"


def test_an_index_made_with_other_library_versions_leaves_every_key_to_the_parser(monkeypatch):
    import zerotir.cli.keys as cli_keys

    assert cli_keys.load_index() is not None  # the committed index was made with the installed versions
    monkeypatch.setattr(cli_keys, "library_versions", lambda: {"lightning": "0.0.1", "jsonargparse": "0.0.1"})
    assert cli_keys.load_index() is None
    check_keys(["fit", "--config", BASE, "--trainer.an_argument_of_a_newer_lightning", "1"])  # no exit


def test_the_index_holds_zerotirs_own_classes_whatever_else_is_imported():
    """A reward class of a user's (here, the test's) imported in the same process is not indexed: the committed index
    and the test's comparison would depend on which modules ran before."""
    from zerotir.rewards import MathReward
    from zerotir.rewards.protocol import Reward

    class UsersReward(Reward):  # a direct subclass of model.reward's type, as jsonargparse finds them
        score = MathReward.score

    classes = generate_index()["subcommands"]["fit"]["classes"]["model.reward"]
    assert UsersReward.__name__ not in classes and "MathReward" in classes


@pytest.mark.parametrize("args,message", [
    (["--model.rl.kl_coef", "abc"], "error: model.rl.kl_coef='abc' (on the command line): expected a float\n"),
    (["--trainer.max_steps=0"], "error: trainer.max_steps='0' (on the command line): trains no RL step"),
    (["--model.rl.algorithm", "gpro"], "one of reinforce_pp, ppo, reinforce_baseline, rloo, grpo (did you mean grpo?)"),
])
def test_a_bad_value_errors_before_torch_is_imported(args, message):
    done = subprocess.run([sys.executable, "-c", ENTRY, "fit", "--config", BASE, *args],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.stdout.split() == ["2", "False"], done.stdout + done.stderr
    assert message in done.stderr and "(every option with its meaning: python -m zerotir fit --help)" in done.stderr


def test_the_value_that_wins_is_checked_where_it_was_given(capsys, tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text("model:\n  rl:\n    algorithm: dpo\n  sampling:\n    n: 2.5\n")
    err = key_error(["fit", "--config", BASE, "--config", str(mine), "--model.rl.algorithm", "grpo"], capsys)
    assert f"error: model.sampling.n=2.5 (in the config file {mine}): expected an int" in err  # the file's wins
    # the command line's value wins over the file's bad one; the base file's over nothing
    check_keys(["fit", "--config", str(mine), "--model.rl.algorithm", "rloo", "--model.sampling.n", "4"])


@pytest.mark.parametrize("args", [
    ["--model.optim.lr", "-1e-4"], ["--model.optim.lr=1e-4"], ["--model.rl.dual_clip", "null"],
    ["--model.rl.kl_coef", "0"], ["--trainer.max_steps", "-1"], ["--model.filters.pass_rate", "True"],
    ["--trainer.precision", "bf16-mixed"], ["--trainer.precision", "32"]])
def test_the_spellings_the_parser_accepts_pass_the_value_check(args):
    check_keys(["fit", "--config", BASE, *args])  # no exit


def test_a_mistyped_class_name_of_zerotir_says_did_you_mean(capsys, tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text("model:\n  reward:\n    class_path: MathRewrd\n")
    err = key_error(["fit", "--config", BASE, "--config", str(mine)], capsys)
    assert "error: model.reward.class_path='MathRewrd': no such class (did you mean MathReward?)" in err
    assert "JudgeReward" in err
    err = key_error(["fit", "--config", BASE, "--model.rollout", "VLLMRolout"], capsys)
    assert "model.rollout.class_path='VLLMRolout': no such class (did you mean VLLMRollout?)" in err
    check_keys(["fit", "--config", BASE, "--model.reward", "my_rewards.Mine", "--model.rollout", "HFRollout"])


def test_a_settings_types_come_in_one_order_whatever_the_hints_spelling():
    """The index (and the message naming what a value should be) must not depend on which spelling of a union the
    process met first: typing caches a union, so the committed index went stale whenever another test imported first."""
    import typing

    from zerotir.cli.values import value_spec

    for hint in (typing.Union[float, int, None], typing.Optional[typing.Union[int, float]], None | float | int):
        assert value_spec(hint)["types"] == ["int", "float", "null"]
    assert value_spec(typing.Union[float, bool])["types"] == ["bool", "float"]
