"""How ``python -m zerotir`` reports a bad config or a failed check: its one message and a non-zero exit, no traceback.

* Parse errors (jsonargparse): the message and one line pointing at ``--help``, not the whole usage; a mistyped key
  also gets "did you mean" and the keys of its group (``parse_error_text``, used by the CLI's parser), exit status 2.
* Errors of the checks (``reported_errors``): a ``ValueError`` naming the field and the fix (the convention of
  ``zerotir.config`` and the module), a missing model folder or file, an occupied folder, Lightning's
  misconfiguration, a sandbox that does not answer or keeps failing, a non-finite loss: ``error: <message>`` and
  where it was raised, exit status 1. Any other exception is a bug and keeps its traceback.

``--debug`` (anywhere on the command line of ``python -m zerotir``) or ``ZEROTIR_DEBUG=1`` shows the traceback
instead, of jsonargparse's errors too (``JSONARGPARSE_DEBUG``).
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from zerotir.cli.console import DEBUG_ENV, debug_requested  # noqa: F401 (re-exported for the CLI)

DEBUG_FLAG = "--debug"
# The key a parse error is about: "unrecognized arguments: --model.rl.kl_coeff 0.1", "... does not accept option 'x'".
_KEY_PATTERNS = (re.compile(r"unrecognized arguments: --([\w.\-]+)"), re.compile(r"accept option '([\w.\-]+)'"))

# Keys that moved (the module's parameters grouped into config groups; the engine hosts' two groups made one,
# model.hosts), old -> new. An old key, typed or in a config file, is an error that names its new place: before torch
# loads (``zerotir.cli.keys``) and in the real parser's error.
MOVED = {
    "model.model_path": "model.base.path", "model.dtype": "model.base.dtype",
    "model.gradient_checkpointing": "model.base.gradient_checkpointing",
    "model.attn_implementation": "model.base.attn_implementation",
    "model.eval_sampling": "model.eval.sampling", "model.eval_report_dir": "model.eval.report_dir",
    "model.refill": "model.filters.refill", "model.sandbox": "model.tool.sandbox",
    "model.pipeline.max_staleness": "model.hosts.max_staleness",
    "model.pipeline.threads": "model.hosts.threads",
    "model.pipeline.producer_device": "model.hosts.device",
    "model.pipeline.producer_timeout": "model.hosts.timeout_s",
    "model.fleet.engines": "model.hosts.engines",
    "model.fleet.cpus_per_engine": "model.hosts.cpus_per_engine",
    "model.fleet.gpus_per_engine": "model.hosts.gpus_per_engine",
    "model.fleet.threads": "model.hosts.threads",
    "model.fleet.trainer_threads": "model.hosts.trainer_threads",
    "model.fleet.pin_cores": "model.hosts.pin_cores",
    "model.fleet.address": "model.hosts.address",
    "model.fleet.weight_host": "model.hosts.weight_host",
    "model.fleet.weight_port": "model.hosts.weight_port",
    "model.fleet.max_restarts": "model.hosts.max_restarts",
    "model.fleet.max_in_flight": "model.hosts.max_in_flight",
    "model.fleet.sandbox_per_node": "model.hosts.sandbox_per_node",
    "model.fleet.timeout_s": "model.hosts.timeout_s",
}
# Modules and classes that moved, old dotted prefix -> new: a ``class_path`` in a saved config that names the old one.
MOVED_CLASS_PATHS = {"zerotir.scale.": "zerotir.parallel.",
                     "zerotir.cli.LateModelSummary": "zerotir.cli.app.LateModelSummary"}
# Callback settings that moved into the module's groups: class name -> {init_args key: its new key}.
MOVED_INIT_ARGS = {"PassRateFilter": {"low": "model.filters.pass_rate_low", "high": "model.filters.pass_rate_high",
                                      "min_keep_groups": "model.filters.min_keep_groups",
                                      "enabled": "model.filters.pass_rate"}}


def take_debug_flag(argv: list[str]) -> list[str]:
    """``argv`` without ``--debug``; when it was there, turn on the tracebacks (ours and jsonargparse's)."""
    if DEBUG_FLAG not in argv:
        return argv
    os.environ[DEBUG_ENV] = "1"
    os.environ["JSONARGPARSE_DEBUG"] = "true"
    return [a for a in argv if a != DEBUG_FLAG]


def _option_keys(parser: argparse.ArgumentParser) -> list[str]:
    """Every ``--key`` of ``parser`` and of its subcommands, without the dashes."""
    keys: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                keys += _option_keys(sub)
        keys += [o[2:] for o in action.option_strings if o.startswith("--")]
    return list(dict.fromkeys(keys))


def moved_key(key: str) -> str | None:
    """The new place of ``key`` when it, or the group it is under, moved (``MOVED``); None otherwise.
    Example: ``model.eval_sampling.n`` -> ``model.eval.sampling.n``."""
    for old, new in MOVED.items():
        if key == old or key.startswith(old + "."):
            return new + key[len(old):]
    return None


def moved_init_args(text: str) -> list[str]:
    """A line for each moved callback setting (``MOVED_INIT_ARGS``) that ``text`` (a parse error, or a config's
    callbacks as text) gives: its class name with an ``init_args`` key that moved."""
    lines = []
    for name, moved in MOVED_INIT_ARGS.items():
        if name in text:
            lines += [f"{name} init_args.{key} moved: it is now {new} (the callback only counts and logs)"
                      for key, new in moved.items() if re.search(rf"['\"]?{key}['\"]?\s*:", text)]
    return lines


def moved_class_paths(text: str) -> list[str]:
    """A line for each ``class_path`` in ``text`` (a parse error) under a prefix that moved (``MOVED_CLASS_PATHS``)."""
    lines = []
    for old, new in MOVED_CLASS_PATHS.items():
        for found in sorted(set(re.findall(rf"{re.escape(old)}[\w.]*", text))):
            lines.append(f"{found} moved: it is now {new + found[len(old):]} (write that in the config's class_path)")
    return lines


def key_hint(key: str, known: list[str]) -> str:
    """"did you mean" for a mistyped ``key``, and the keys of the group it (or its best match) belongs to; for a key
    that moved (``MOVED``), its new place instead."""
    key = key.split("=", 1)[0]
    moved = moved_key(key)
    if moved is not None:
        return f"{key} moved: it is now {moved} (write it there)"
    matches = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
    lines = [f"did you mean: {', '.join('--' + m for m in matches)}"] if matches else []
    group = key.rpartition(".")[0]
    if not any(k.startswith(group + ".") for k in known) and matches:
        group = matches[0].rpartition(".")[0]
    members = sorted({k[len(group) + 1:].split(".")[0] for k in known if group and k.startswith(group + ".")})
    if members:
        lines.append(f"keys of {group}: {', '.join(members)}")
    return "\n".join(lines)


def parse_error_text(parser: argparse.ArgumentParser, message: str, args: list[str] | None = None) -> str:
    """What a parse error prints: the message, a hint when it is about a mistyped key, the ``--config`` file the
    key is in (``args``: the command line parsed), and where ``--help`` is (the subcommand's, when one is named)."""
    hint, key = "", None
    for pattern in _KEY_PATTERNS:
        found = pattern.search(message)
        if found:
            key = found.group(1)
            hint = key_hint(key, _option_keys(parser))
            break
    args = args or []
    prog = parser.prog.replace(" [options]", "")
    subcommands = _subcommand_names(parser)
    if args and args[0] in subcommands and not prog.endswith(f" {args[0]}"):
        prog = f"{prog} {args[0]}"
    where = _files_with_key(args, key.split("=", 1)[0].rpartition(".")[2]) if key else []
    if where:
        hint += ("\n" if hint else "") + f"in the config file {', '.join(where)}"
    if "init_args" in message:
        hint = "\n".join([hint, *moved_init_args(message)]).strip("\n")
    hint = "\n".join([hint, *moved_class_paths(message)]).strip("\n")
    return f"error: {message}\n" + (f"{hint}\n" if hint else "") + f"(every option with its meaning: {prog} --help)\n"


def _subcommand_names(parser: argparse.ArgumentParser) -> list[str]:
    return [name for action in parser._actions if isinstance(action, argparse._SubParsersAction)
            for name in action.choices]


def _files_with_key(args: list[str], name: str) -> list[str]:
    """The ``--config`` files of ``args`` that hold ``name:`` (a mistyped key read from a file, not typed)."""
    files = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--config"]
    files += [a.split("=", 1)[1] for a in args if a.startswith("--config=")]
    pattern = re.compile(rf"^\s*{re.escape(name)}\s*:", re.MULTILINE)
    return [f for f in files if Path(f).is_file() and pattern.search(Path(f).read_text())]


# The modules of the reported exception types beside the builtins, with the names of those types. An exception of a
# module that was never imported cannot have been raised, so only the imported ones are looked at: an exit (a
# command's ``sys.exit``, a ``ValueError`` of the config) never imports Lightning or torch just to compare types.
_REPORTED_ELSEWHERE = {
    "lightning.fabric.utilities.exceptions": ("MisconfigurationException",),
    "sandbox.client": ("SandboxUnavailable",),
    "zerotir.rl.guards": ("SandboxFailureError", "NonFiniteLossError", "EmptyStepsError"),
}


def _reported_types() -> tuple[type[BaseException], ...]:
    """The exception types reported as a message: the builtins, and those of ``_REPORTED_ELSEWHERE`` whose module is
    imported (``sys.modules``; nothing is imported here)."""
    found: list[type[BaseException]] = [ValueError, FileNotFoundError, FileExistsError]
    for module_name, names in _REPORTED_ELSEWHERE.items():
        module = sys.modules.get(module_name)
        if module is not None:
            found += [vars(module)[name] for name in names]
    return tuple(found)


def _where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    path = Path(last.filename)
    try:
        path = path.relative_to(Path.cwd())
    except ValueError:
        pass
    return f"({type(exc).__name__} raised in {path}:{last.lineno}, {last.name}; the traceback: {DEBUG_FLAG} or {DEBUG_ENV}=1)"


@contextmanager
def reported_errors() -> Iterator[None]:
    """Turn a bad config or a failed check raised inside into its message on stderr and exit status 1."""
    try:
        yield
    except _reported_types() as exc:
        if debug_requested():
            raise
        sys.stderr.write(f"error: {exc}\n{_where(exc)}\n")
        sys.exit(1)
