"""Every YAML under configs/ starts with the command that runs it, and that command parses (``--print_config``);
the printed full config parses again."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import get_args

import pytest
import yaml

from zerotir.cli import ZeroTIRCLI
from zerotir.config import Algorithm

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted((REPO / "configs").rglob("*.yaml"))
SUBCOMMANDS = ("fit", "validate", "test", "predict")


def header_args(path: Path) -> list[str]:
    """The arguments after ``python -m zerotir`` in the config's first line."""
    first = path.read_text().splitlines()[0]
    prefix = "# python -m zerotir "
    assert first.startswith(prefix), f"{path.name}: the first line must be '{prefix}<command> --config {path}...'"
    args = shlex.split(first[len(prefix):])
    assert args[0] in SUBCOMMANDS, f"{path.name}: unknown subcommand {args[0]!r}"
    assert args[args.index("--config") + 1] == str(path.relative_to(REPO)), f"{path.name}: --config names another file"
    return args


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
    assert full["model"]["model_path"]
    assert full["model"]["rl"]["algorithm"] in get_args(Algorithm)
    assert set(full["model"]) >= {"rl", "optim", "tool", "sampling", "eval_sampling", "rollout", "sandbox"}
    # The printed config is complete and parses on its own.
    again = tmp_path / "full.yaml"
    again.write_text(yaml.safe_dump(full))
    assert print_config([args[0], "--config", str(again)], capsys) == full
