"""A value of the wrong type or outside its choices answered before torch loads, as fast as a mistyped key.

The real parser (LightningCLI over ``ZeroTIRModule`` and ``Trainer``) can only say ``--model.rl.kl_coef abc`` is not
a float once torch, Lightning and transformers are imported: seconds on a quiet machine, a minute under load.
``check_values`` answers the plain cases from the index of ``zerotir.cli.keys`` (``keys.json``, made from the
real parser): for each setting whose type is made only of ``int``, ``float``, ``bool``, ``None`` and ``Literal``
choices (``model.rl.algorithm``, ``model.optim.lr``, ``trainer.max_steps``), the value that wins (the last
``--config`` file or command-line value that sets it, in order) must be one of them. ``trainer.max_steps 0`` for
``fit`` is answered here too (``zerotir.cli.checks.check_run_settings`` says the same after the parse).

Like the key check it never rejects what the parser accepts: a setting of any other type (a string, a path, a list, a
class) and a value under ``init_args`` are left to the parser, and a number may be written as YAML or as Python
reads it (``1e-4``).
"""

from __future__ import annotations

import difflib
import sys
import types
import typing
from pathlib import Path
from typing import Any

# The type names an index spec lists (``keys._value_spec``).
_NULL_WORDS = ("null", "none", "~")
_BOOL_WORDS = ("true", "false", "yes", "no", "on", "off")


def check_values(subcommand: str, args: list[str], specs: dict[str, dict[str, Any]], prog: str) -> None:
    """Exit with status 2 and a message naming the setting, the value, where it was given and what it may be, when
    the value that wins for a setting of ``specs`` (``{key: {"types": [...], "choices": [...]}}``) is not of its
    type; return otherwise."""
    for key, (value, where) in _winning_values(args, specs).items():
        problem = value_problem(value, specs[key])
        if problem is None and key == "trainer.max_steps" and subcommand == "fit" and _number(value) == 0:
            problem = "trains no RL step: give the number of RL steps (--trainer.max_steps N, N >= 1)"
        if problem is not None:
            sys.stderr.write(f"error: {key}={value!r} ({where}): {problem}\n"
                             f"(every option with its meaning: {prog} {subcommand} --help)\n")
            sys.exit(2)


def value_problem(value: Any, spec: dict[str, Any]) -> str | None:
    """What is wrong with ``value`` (from YAML, or a command-line string) for ``spec``, or None when it may be
    right."""
    names, choices = spec.get("types", []), spec.get("choices", [])
    if any(_is_type(value, name) for name in names) or any(_is_choice(value, c) for c in choices):
        return None
    wanted = [{"int": "an int", "null": "null"}.get(name, f"a {name}") for name in names]
    if choices:
        wanted.append("one of " + ", ".join(str(c) for c in choices))
        close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1, cutoff=0.6)
        if close:
            return f"expected {' or '.join(wanted)} (did you mean {close[0]}?)"
    return f"expected {' or '.join(wanted)}"


def _is_type(value: Any, name: str) -> bool:
    if name == "null":
        return value is None or (isinstance(value, str) and value.strip().lower() in _NULL_WORDS)
    if name == "bool":
        return isinstance(value, bool) or (isinstance(value, str) and value.strip().lower() in _BOOL_WORDS)
    number = _number(value)
    if name == "int":
        return number is not None and float(number).is_integer() and not isinstance(value, float)
    return name == "float" and number is not None


def _number(value: Any) -> int | float | None:
    """``value`` as a number (an int or float from YAML, or a string Python reads as one), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        for kind in (int, float):
            try:
                return kind(value.strip())
            except ValueError:
                continue
    return None


def _is_choice(value: Any, choice: Any) -> bool:
    return value == choice or (isinstance(value, str) and value.strip() == str(choice))


def _winning_values(args: list[str], specs: dict[str, dict[str, Any]]) -> dict[str, tuple[Any, str]]:
    """``{key: (value, where)}`` for the keys of ``specs`` that ``args`` sets, in order: a ``--config`` file's values,
    then each later one's and the command line's over them."""
    found: dict[str, tuple[Any, str]] = {}
    args = args[:args.index("--")] if "--" in args else args
    i = 0
    while i < len(args):
        name, has_value, value = args[i].partition("=")
        takes_value = name in ("--config", "-c") or (name.startswith("--") and name[2:] in specs)
        if takes_value and not has_value:
            if i + 1 >= len(args):
                break  # the parser says the value is missing
            i += 1
            value = args[i]
        if name in ("--config", "-c"):
            found.update({k: (v, f"in the config file {value}") for k, v in _file_values(value, specs).items()})
        elif takes_value:
            found[name[2:]] = (value, "on the command line")
        i += 1
    return found


def _file_values(path: str, specs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The values of ``specs`` keys in the YAML file ``path`` ({} when it cannot be read: the parser says why)."""
    import yaml

    file = Path(path)
    try:
        data = yaml.safe_load(file.read_text()) if file.is_file() else None
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    return {k: v for k, v in _flatten(data, "").items() if k in specs} if isinstance(data, dict) else {}


def _flatten(data: dict[Any, Any], prefix: str) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for name, value in data.items():
        if name in ("class_path", "init_args"):
            continue  # a class's settings: its own parser judges them
        key = f"{prefix}.{name}" if prefix else str(name)
        flat.update(_flatten(value, key) if isinstance(value, dict) else {key: value})
    return flat


_TYPE_ORDER = ("bool", "int", "float", "null")


def value_spec(hint: Any) -> dict[str, list[Any]] | None:
    """The spec of a setting typed ``hint`` when it is made only of int, float, bool, None and Literal choices
    (``{"types": [...], "choices": [...]}``); None for any other type (left to the parser)."""
    names: list[str] = []
    choices: list[Any] = []
    members = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    for member in members:
        if typing.get_origin(member) is typing.Literal:
            literal = typing.get_args(member)
            if not all(isinstance(c, (str, int, float, bool)) for c in literal):
                return None
            choices += list(literal)
        elif member in (int, float, bool, type(None)):
            names.append({int: "int", float: "float", bool: "bool", type(None): "null"}[member])
        else:
            return None
    # One order whatever the hint's: typing caches a Union by its members' set, so the first spelling made in the
    # process (``int | float`` or ``float | int``) would otherwise decide both the index and the message.
    return {"types": sorted(names, key=_TYPE_ORDER.index), "choices": choices}
