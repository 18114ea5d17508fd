"""Every command that README.md, docs/*.md and the config files' first lines print runs as written, so a documented
command that breaks fails here and not for a reader.

The commands are collected from the files (``documented_commands``): the lines of code blocks and the code spans
that start with ``python -m zerotir``, ``bash ``, ``python -m benchmarks`` or ``tensorboard``, a ``\\`` continuation
joined, a ``#`` comment cut. A config's first line is parsed and run by tests/test_configs.py, not again here.
Each other command is classified with a reason the test checks (``plan``):

* ``fit`` / ``test`` of one CPU process on a model that is there: run in-process as written, from a folder of its
  own that holds the repository's ``configs/`` and ``data/`` (``tests.test_configs.in_a_clone``: what it writes lands
  there), for one RL step (``--trainer.max_steps 1``) or one batch of rows (``tests.test_configs.run_one_step``);
* one that reads a file a line before it on its page writes (docs/data.md's ``my_problems.jsonl``): that page's
  test runs the two lines (tests/data/test_data_doc.py);
* one that needs a GPU (``trainer.accelerator: gpu``), several processes (``trainer.devices`` > 1), a toy base not
  built yet (minutes of pretraining), a previous run's checkpoint or exported model: ``--print_config`` as written;
* ``--help``, ``--print_config``: as written; the other subcommands (``toy-base``, ``scaling``, ``rollouts``,
  ``export``): their arguments parsed as written, values included (a stale choice fails), stopped before they run
  (``parse_only``); a bare ``fit``: its ``--help``;
* ``python -m benchmarks.<name> ...``: the module run as written up to its argument parser, which reads every
  argument and value, then stopped (``parse_only``);
* ``bash scripts/...`` and ``tensorboard``: the script or program is there;
* a placeholder (``...``, ``X``, ``a | b``, ``[OPTIONAL]``): not a command; the placeholder is checked to be there.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import runpy
import shlex
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import jsonargparse

import pytest

import zerotir.__main__ as entry
from tests.test_configs import UNSET, config_files, file_setting, in_a_clone, run_one_step

REPO = Path(__file__).resolve().parents[1]
SOURCES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "configs").rglob("*.yaml"))]
PREFIXES = ("python -m zerotir ", "bash ", "python -m benchmarks", "tensorboard ")
FENCE = re.compile(r"^[ \t]*```[^\n]*\n(.*?)^[ \t]*```", re.DOTALL | re.MULTILINE)  # a list item's block is indented
SPAN = re.compile(r"`([^`]+)`")
PLACEHOLDER = re.compile(r"(\.\.\.|\s\|\s|\[[A-Z_]+\]|\[--|<\w+>|\s[A-Z]\b)")
CLI_COMMANDS = ("fit", "validate", "test")
VENV_BIN = ".venv/bin/"  # the quickstart's ``.venv/bin/python`` / ``.venv/bin/tensorboard``


def _cut_comment(line: str) -> str:
    """The command without its comment, ``.venv/bin/<tool>`` (the quickstart's) read as ``<tool>``."""
    line = " ".join(re.split(r"\s+#\s", line, maxsplit=1)[0].split())
    line = re.sub(r"^([A-Z_]+=\S+ )+", "", line)  # CUDA_VISIBLE_DEVICES=0,1 python ...: the command after it
    return line[len(VENV_BIN):] if line.startswith(VENV_BIN) else line


def commands_of(text: str, yaml_file: bool = False) -> list[str]:
    """The commands ``text`` prints: a config's first line, or a page's code-block lines and code spans."""
    if yaml_file:
        first = text.splitlines()[0].lstrip("# ") if text else ""
        return [first] if first.startswith(PREFIXES) else []
    found = []
    for block in FENCE.findall(text):
        lines = iter(line.strip() for line in block.splitlines())
        for line in lines:
            while line.rstrip().endswith("\\"):
                line = line.rstrip()[:-1] + " " + next(lines, "").strip()
            line = _cut_comment(line)
            if line.startswith(PREFIXES):
                found.append(line)
    for span in SPAN.findall(FENCE.sub("", text)):
        span = _cut_comment(span)  # a span wrapped over two lines is one command
        if span.startswith(PREFIXES):
            found.append(span)
    return found


def documented_commands() -> dict[str, list[str]]:
    """Every documented command (whitespace normalized) and the files that print it."""
    found: dict[str, list[str]] = {}
    for path in SOURCES:
        for command in commands_of(path.read_text(), yaml_file=path.suffix == ".yaml"):
            found.setdefault(" ".join(command.split()), []).append(str(path.relative_to(REPO)))
    return found


COMMANDS = documented_commands()
HEADERS = {command for command, files in COMMANDS.items() if any(f.startswith("configs/") for f in files)}


def plan(command: str) -> tuple[str, str]:
    """How ``command`` is checked here, and why (each reason is a fact about the command the test asserts)."""
    if command in HEADERS:
        return "header", "a config's first line: tests/test_configs.py parses it and runs it"
    if PLACEHOLDER.search(command):
        return "placeholder", f"{PLACEHOLDER.search(command).group(0).strip()!r} stands for the reader's value"
    if command.startswith("python -m benchmarks"):
        return "parses", "a benchmark: its parser reads the arguments as written"
    if not command.startswith("python -m zerotir "):
        return "exists", "not a zerotir run: what it names must be there"
    args = shlex.split(command)[3:]
    if args == ["fit"]:
        return "options", "a bare fit: its --help answers"
    if args[0] not in CLI_COMMANDS:
        return "parses", "a subcommand: its parser reads the arguments as written"
    if "--help" in args or "--print_config" in args:
        return "in_process", "parses its arguments and answers"
    files = config_files(args)
    if file_setting(files, "trainer", "accelerator") == "gpu":
        return "print_config", "trainer.accelerator is gpu"
    devices = file_setting(files, "trainer", "devices")
    if isinstance(devices, int) and devices > 1:
        return "print_config", f"trainer.devices is {devices}: one process per device"
    model = file_setting(files, "model", "base", "path")
    if file_setting(files, "toy_base") not in (UNSET, None) and not (REPO / str(model) / "toy_base.json").is_file():
        return "print_config", f"the toy base at {model} is not built yet: minutes of pretraining"
    if "--ckpt_path" in args:
        return "print_config", "resumes a previous run's checkpoint"
    if "--model.base.path" in args and not (REPO / args[args.index("--model.base.path") + 1]).exists():
        return "print_config", "names the model a previous command writes (export)"
    written = [f for f in data_files(args) if not (REPO / f).exists()]
    if written:
        return "written_first", f"reads {written[0]}, which a line before it on its page writes"
    return "one_step", "one CPU process on a model that is there"


def data_files(args: list[str]) -> list[str]:
    """The files of the ``--data.<split>_files '[a, b]'`` options in ``args``."""
    found = []
    for flag, value in zip(args, args[1:]):
        if flag.startswith("--data.") and flag.endswith("_files"):
            found += [f.strip() for f in value.strip("[]").split(",") if f.strip()]
    return found


def run_main(args: list[str]) -> int:
    """``python -m zerotir <args>`` in this process: its exit status (0 when it returns)."""
    try:
        entry.main(args)
    except SystemExit as exc:
        return 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
    return 0


class _Parsed(BaseException):
    """Raised by a parser once it has read a command's arguments: the command stops there, before it runs (a
    BaseException, so no ``except Exception`` of the command takes it for a failure)."""


@contextmanager
def parse_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """argparse's and jsonargparse's ``parse_args`` read the arguments (an unknown option, a value of the wrong type
    or outside its choices exits as for a reader), then raise ``_Parsed``."""
    for parser in (argparse.ArgumentParser, jsonargparse.ArgumentParser):
        def stop(self, *args, _parse=parser.parse_args, **kwargs):
            _parse(self, *args, **kwargs)
            raise _Parsed

        monkeypatch.setattr(parser, "parse_args", stop)
    yield


def parsed(run: Callable[[], object], monkeypatch: pytest.MonkeyPatch) -> str | None:
    """None when ``run`` got as far as its parser having read its arguments, else what happened instead."""
    with parse_only(monkeypatch):
        try:
            run()
        except _Parsed:
            return None
        except SystemExit as exc:
            return f"exits with {exc.code} before its arguments were read"
    return "returned without reading its arguments"


def run_module(module: str, args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """``python -m <module> <args>`` in this process."""
    monkeypatch.setattr(sys, "argv", [module, *args])
    runpy.run_module(module, run_name="__main__", alter_sys=True)


@pytest.mark.e2e
@pytest.mark.parametrize("command", sorted(COMMANDS), ids=lambda c: c[:90])
def test_the_documented_command_runs(command, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)  # the commands are written for the repository root
    kind, reason = plan(command)
    where = ", ".join(COMMANDS[command])
    words = shlex.split(command)
    if kind == "header":
        assert any(f.startswith("configs/") for f in COMMANDS[command]), reason
    elif kind == "placeholder":
        assert PLACEHOLDER.search(command), reason
    elif kind == "exists":
        if words[0] == "bash":
            assert (REPO / words[1]).is_file(), f"{where}: {words[1]} is not there"
        else:  # tensorboard: the logs it names are a run's; the program comes with the install
            assert importlib.util.find_spec("tensorboard") is not None, f"{where}: tensorboard is not installed"
    elif kind == "parses":
        if words[2].startswith("benchmarks"):
            module = words[2]
            assert importlib.util.find_spec(module) is not None, f"{where}: no module {module}"
            failed = parsed(lambda: run_module(module, words[3:], monkeypatch), monkeypatch)
        else:
            failed = parsed(lambda: entry.main(words[3:]), monkeypatch)
        assert failed is None, f"{where}: `{command}` {failed}:\n{capsys.readouterr().err[-2000:]}"
    elif kind == "options":  # a bare `fit`
        assert run_main([words[3], "--help"]) == 0, f"{where}: {words[3]} --help fails"
    elif kind in ("in_process", "print_config"):
        args = words[3:] + ([] if kind == "in_process" or "--print_config" in words else ["--print_config"])
        status = run_main(args)
        out = capsys.readouterr()
        assert status == 0, f"{where}: `{command}` ({reason}) fails:\n{out.err[-2000:]}"
    elif kind == "written_first":
        name = next(f for f in data_files(words[4:]) if not (REPO / f).exists())
        pages = [(REPO / f).read_text() for f in COMMANDS[command]]
        assert all(re.search(rf"> {re.escape(name)}\b", page) for page in pages), f"{where}: nothing writes {name}"
    else:
        monkeypatch.chdir(in_a_clone(tmp_path / "clone"))  # its runs/ folders land there
        run_one_step(words[3], words[4:])


def test_the_commands_are_collected_from_code_blocks_spans_and_headers():
    page = ("Run `python -m zerotir fit --config a.yaml\n--config b.yaml` or:\n\n```bash\n"
            "python -m zerotir fit --config c.yaml \\\n  --trainer.max_steps 2   # short\nls\nbash scripts/x.sh\n```\n")
    assert commands_of(page) == ["python -m zerotir fit --config c.yaml --trainer.max_steps 2", "bash scripts/x.sh",
                                 "python -m zerotir fit --config a.yaml --config b.yaml"]
    assert commands_of("# python -m zerotir fit --config configs/x.yaml\nmodel: {}\n", yaml_file=True) == \
        ["python -m zerotir fit --config configs/x.yaml"]
    assert plan("python -m zerotir toy-base --out X")[0] == "placeholder"
    assert plan("python -m zerotir fit --config configs/qwen2.5-7b_reinforce.yaml --model.rl.kl_coef 0") == \
        ("print_config", "trainer.accelerator is gpu")
    assert plan("python -m zerotir fit --config configs/toy_cpu.yaml --model.rl.kl_coef 0")[0] == "one_step"
    assert plan("python -m zerotir fit --config configs/toy_cpu.yaml --data.train_files '[mine.jsonl]'") == \
        ("written_first", "reads mine.jsonl, which a line before it on its page writes")
    assert plan("python -m zerotir fit --config configs/toy_cpu.yaml")[0] == "header"
    every_config = {str(p.relative_to(REPO)) for p in REPO.joinpath("configs").rglob("*.yaml")}
    headers = {f for c, files in COMMANDS.items() for f in files if f.endswith(".yaml")}
    assert headers == every_config  # every config's first line is collected


def test_a_stale_value_fails_where_its_option_name_alone_would_pass(monkeypatch, capsys):
    """The check reads values too: a ``--filter`` choice or a benchmark arm that no longer exists fails, while the
    option names are the commands' own."""
    monkeypatch.chdir(REPO)
    rollouts = ["rollouts", "runs/toy_cpu", "--filter"]
    assert parsed(lambda: entry.main([*rollouts, "tool"]), monkeypatch) is None
    assert parsed(lambda: entry.main([*rollouts, "code"]), monkeypatch) == \
        "exits with 2 before its arguments were read"
    assert "invalid choice: 'code'" in capsys.readouterr().err
    assert parsed(lambda: run_module("benchmarks.fleet", ["--arms", "stream_s1"], monkeypatch), monkeypatch) is None
    assert parsed(lambda: run_module("benchmarks.fleet", ["--arms", "stream_s2"], monkeypatch), monkeypatch) is not None
    assert parsed(lambda: run_module("benchmarks.stream_fill", ["--prompts", "many"], monkeypatch), monkeypatch) \
        is not None
