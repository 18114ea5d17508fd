"""Every YAML under configs/ starts with the command that runs it, and that command parses (``--print_config``);
the printed full config parses again; and every config starts: its command passes every check (``start``)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import get_args

import pytest
import yaml
from lightning.pytorch import Callback

from zerotir.cli import ZeroTIRCLI
from zerotir.config import Algorithm
from zerotir.toy.tiny_model import build_tiny_model
from zerotir.toy.tokenizer import build_byte_tokenizer

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted((REPO / "configs").rglob("*.yaml"))
SUBCOMMANDS = ("fit", "validate", "test", "predict")


def header_args(path: Path) -> list[str]:
    """The arguments after ``python -m zerotir`` in the config's first line.

    An overlay (``configs/toy_cpu_ppo.yaml``) holds only what differs from its base, so its command names the base
    first and itself last: ``--config configs/toy_cpu.yaml --config configs/toy_cpu_ppo.yaml``."""
    first = path.read_text().splitlines()[0]
    prefix = "# python -m zerotir "
    assert first.startswith(prefix), f"{path.name}: the first line must be '{prefix}<command> --config {path}...'"
    args = shlex.split(first[len(prefix):])
    assert args[0] in SUBCOMMANDS, f"{path.name}: unknown subcommand {args[0]!r}"
    files = config_files(args)
    assert files[-1] == str(path.relative_to(REPO)), f"{path.name}: the last --config names another file"
    for base in files[:-1]:
        assert (REPO / base).is_file() and len(config_files(header_args(REPO / base))) == 1, \
            f"{path.name}: its base {base} is not a whole config of configs/"
    return args


def config_files(args: list[str]) -> list[str]:
    """The files of every ``--config`` in ``args``, in order."""
    return [args[i + 1] for i, arg in enumerate(args) if arg == "--config"]


UNSET = object()


def file_setting(files: list[str], *keys: str):
    """``keys`` (a path into the YAML) as the last of ``files`` that sets it gives it, or ``UNSET``."""
    found = UNSET
    for name in files:
        value = yaml.safe_load((REPO / name).read_text())
        for key in keys:
            value = value.get(key, UNSET) if isinstance(value, dict) else UNSET
        found = found if value is UNSET else value
    return found


OVERLAYS = [p for p in CONFIGS if p.read_text().splitlines()[0].count(" --config ") > 1]  # header_args checks them


def test_the_toy_variants_are_overlays_on_the_toy_config():
    names = {p.name for p in OVERLAYS}
    assert names >= {"toy_cpu_ppo.yaml", "toy_cpu_grpo.yaml", "toy_cpu_rloo.yaml", "toy_cpu_reinforce_baseline.yaml",
                     "toy_cpu_vllm.yaml"}
    assert "toy_cpu.yaml" not in names


@pytest.mark.parametrize("path", OVERLAYS, ids=lambda p: str(p.relative_to(REPO)))
def test_an_overlay_holds_only_what_differs_from_its_base(path):
    """A key an overlay sets to its base's value says nothing, and goes stale when the base changes."""
    *bases, _ = config_files(header_args(path))

    def same(overlay: dict, keys: tuple[str, ...]) -> list[str]:
        found = []
        for key, value in overlay.items():
            if isinstance(value, dict) and value:
                found += same(value, (*keys, key))
            elif file_setting(bases, *keys, key) == value:
                found.append(".".join((*keys, key)))
        return found

    assert same(yaml.safe_load(path.read_text()), ()) == [], f"{path.name} repeats its base"


def print_config(args: list[str], capsys) -> dict:
    with pytest.raises(SystemExit) as exc:
        ZeroTIRCLI(args=args + ["--print_config"])
    out = capsys.readouterr()
    assert exc.value.code in (None, 0), out.err
    # Nothing but the config on stdout (``--print_config > full.yaml``): without CUDA the CLI sets DS_ACCELERATOR=cpu
    # so that importing DeepSpeed (strategy configs) prints no accelerator warning there.
    assert out.out.startswith("# lightning.pytorch=="), out.out[:2000]
    return yaml.safe_load(out.out)


def test_there_are_configs():
    names = {p.name for p in CONFIGS}
    assert {"tiny_cpu_ppo.yaml", "tiny_cpu_reinforce.yaml", "tiny_cpu_grpo.yaml", "eval_math500.yaml",
            "toy_cpu_rloo.yaml", "toy_cpu_reinforce_baseline.yaml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(REPO)))
def test_config_parses_with_its_header_command(path, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(REPO)  # the commands are written for the repository root
    args = header_args(path)
    full = print_config(args, capsys)
    assert full["model"]["base"]["path"]
    assert full["model"]["rl"]["algorithm"] in get_args(Algorithm)
    assert set(full["model"]) >= {"base", "rl", "optim", "tool", "sampling", "eval", "rollout", "reward"}
    # The printed config is complete and parses on its own.
    again = tmp_path / "full.yaml"
    again.write_text(yaml.safe_dump(full))
    assert print_config([args[0], "--config", str(again)], capsys) == full


class _Started(Exception):
    """Raised where the command's loop would begin: every check of the command has passed."""


class _StopAtStart(Callback):
    def on_fit_start(self, trainer, pl_module):
        raise _Started

    def on_test_start(self, trainer, pl_module):
        raise _Started

    on_validation_start = on_test_start


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    build_tiny_model(build_byte_tokenizer(), save_dir=path, hidden_size=32, num_layers=2, num_heads=2)
    return path


def shipped_toy_base(files: list[str]) -> bool:
    """The merged ``files`` build their model with ``toy_base`` at a folder that already holds a toy base (the one
    shipped in data/toy_base): such a config starts on its own model and its own path decision, as a user runs it
    (an overlay that broke that decision failed for every user while the tiny stand-in hid it)."""
    path = file_setting(files, "model", "base", "path")
    return file_setting(files, "toy_base") not in (UNSET, None) and path is not UNSET and \
        (REPO / path / "toy_base.json").is_file()


def start(args: list[str], tiny_dir: Path, root: Path) -> None:
    """Build the module, data module and trainer of ``args`` (a command and its options) on a tiny model and run
    the command up to where its loop begins.

    A config on the shipped toy base starts on it (``shipped_toy_base``); for any other the tiny model folder
    stands in for the config's model (``--toy_base null``: a toy base's path decision has its own tests in
    tests/test_cli.py). A config of one CPU process runs its command (``fit``: the data module's,
    the callbacks' and the module's setup, the models' loading and the optimizer) until ``on_fit_start`` /
    ``on_test_start``, where the rollout source would start the sandbox and the engine. A GPU config is built with
    ``trainer.accelerator cpu`` (its devices, nodes and DeepSpeed config kept) and, like any config of several
    processes, runs the setup hooks of its command (the data module's, the callbacks' and the module's: the
    DeepSpeed and rollout checks); what follows needs the GPUs, the processes and the model itself.
    """
    command, rest = args[0], args[1:]
    if "--ckpt_path" in rest:  # a run's checkpoint (eval_toy_heldout.yaml's header): not in the repository
        at = rest.index("--ckpt_path")
        rest = rest[:at] + rest[at + 2:]
    gpu = file_setting(config_files(rest), "trainer", "accelerator") == "gpu"
    model = [] if shipped_toy_base(config_files(rest)) else ["--model.base.path", str(tiny_dir), "--toy_base", "null"]
    cli = ZeroTIRCLI(args=rest + model + ["--trainer.default_root_dir", str(root), "--trainer.enable_progress_bar",
                                          "false"] + (["--trainer.accelerator", "cpu"] if gpu else []), run=False)
    trainer, module, data = cli.trainer, cli.model, cli.datamodule
    if gpu or trainer.world_size > 1:
        stage = "fit" if command == "fit" else command
        module.trainer = trainer
        data.trainer = trainer
        data.setup(stage)
        for callback in trainer.callbacks:
            callback.setup(trainer, module, stage)
        module.setup(stage)
        return
    trainer.callbacks.append(_StopAtStart())
    run = {"fit": trainer.fit, "validate": trainer.validate, "test": trainer.test}[command]
    with pytest.raises(_Started):
        run(module, datamodule=data)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_shipped_config_starts(path, tiny_dir, tmp_path, monkeypatch):
    """A config that any check of its command rejects (a new validation included) fails here, not for a user."""
    monkeypatch.chdir(REPO)
    start(header_args(path), tiny_dir, tmp_path)


@pytest.mark.parametrize("algo", ["reinforce_pp", "ppo", "grpo", "reinforce_baseline", "rloo", "reinforce_pp_vllm"])
def test_every_arm_of_the_emergence_benchmark_starts(algo, tiny_dir, tmp_path, monkeypatch):
    """``benchmarks/toy_emergence.py``'s fit command of each algorithm: its config, early stopping, its base."""
    from benchmarks import toy_emergence  # here: a benchmark that fails to import fails this test, not the file

    assert sorted(toy_emergence.CONFIGS) == sorted(["reinforce_pp", "ppo", "grpo", "reinforce_baseline", "rloo",
                                                     "reinforce_pp_vllm"])  # a new arm is added to the list above
    monkeypatch.chdir(REPO)
    start(["fit", *toy_emergence.config_args(algo), *toy_emergence.early_stop_args(0.8)], tiny_dir, tmp_path)
