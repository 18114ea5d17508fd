"""A mistyped key of ``fit`` / ``validate`` / ``test`` / ``predict`` answered before torch loads.

LightningCLI builds its parser from the signatures of ``ZeroTIRModule`` and ``Trainer``, so it cannot answer before
torch, Lightning and transformers are imported (seconds on a quiet machine, tens under load). ``check_keys`` answers
the commonest mistake, a mistyped key on the command line or inside a ``--config`` file, from an index of every valid
key (``keys.json`` beside this module) before anything heavy is imported; ``python -m zerotir`` calls it first.

The index is generated from the real parser (``python -m zerotir.cli.keys`` rewrites it; a test regenerates it and
compares, so a field added without regenerating fails CI). It holds, per subcommand, every ``--key`` the parser knows
(groups, ``.help`` keys, ``--config``, ``--ckpt_path``, ``trainer.*``, link targets) and the "open" keys whose inner
keys only the real parser can judge: a ``class_path`` setting (``model.rollout``, ``trainer.callbacks``), a dict
(``model.tool.sandbox.server_options``), a dataclass-or-None (``toy_base``); for a ``class_path`` setting of zerotir's own
(``model.rollout``) it also holds each subclass's ``init_args`` keys, checked in a file whose mapping names that class.
Any other key under an open one, and everything this check cannot judge (an unreadable or non-mapping YAML file, a
value after ``--``, another command), is left to the real parser: the check never rejects a command the parser
accepts, and never changes what it parses.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
import types
import typing
from datetime import timedelta
from pathlib import Path
from typing import Any

from zerotir.cli.values import check_values, value_spec

INDEX_FILE = Path(__file__).with_name("keys.json")
# The libraries whose signatures shape the parser: an index made with other versions of them is not used (a Trainer
# argument added by a newer Lightning would otherwise be refused), and the real parser judges every key.
LIBRARIES = ("lightning", "jsonargparse")
REGENERATE = "python -m zerotir.cli.keys"
PROG = "python -m zerotir"
# Leaf types of a setting whose value is one value, not a mapping of keys (any other type makes the key open).
_LEAF_TYPES = (str, int, float, bool, type(None), Path, timedelta)


def library_versions() -> dict[str, str]:
    """The installed versions of :data:`LIBRARIES` (package metadata: nothing is imported)."""
    from importlib.metadata import version

    return {name: version(name) for name in LIBRARIES}


def load_index() -> dict[str, dict[str, list[str]]] | None:
    """The committed index, ``{subcommand: {"keys": [...], "open": [...]}}``, or None when it was made with other
    versions of :data:`LIBRARIES` than the installed ones."""
    index = json.loads(INDEX_FILE.read_text())
    return index["subcommands"] if index.get("libraries") == library_versions() else None


def check_keys(argv: list[str], index: dict[str, dict[str, list[str]]] | None = None) -> None:
    """Exit with status 2 and a message naming the key (the file it is in, the closest valid key and the
    subcommand's ``--help``) when ``argv`` (``python -m zerotir``'s arguments) or one of its ``--config`` files holds
    a key its subcommand does not know; return otherwise, also for anything this check cannot judge."""
    index = load_index() if index is None else index
    if index is None or not argv or argv[0] not in index:
        return
    known = _Known(index[argv[0]])
    args = argv[1:argv.index("--")] if "--" in argv else argv[1:]
    for i, token in enumerate(args):
        if token.startswith("--") and not known.accepts(_token_key(token)):
            _fail(argv[0], _token_key(token), None, known)
        key = _token_key(token).removesuffix(".class_path") if token.startswith("--") else ""
        if key in known.classes and ("=" in token or i + 1 < len(args)):
            _check_class_name(key, token.split("=", 1)[1] if "=" in token else args[i + 1], known)
    for path in _config_files(args):
        for key in _unknown_file_keys(path, known):
            _fail(argv[0], key, path, known)
        _check_callback_settings(argv[0], path)
    check_values(argv[0], args, index[argv[0]].get("values", {}), PROG)  # a bad value as fast as a bad key


class _Known:
    """The keys of one subcommand: exact ones, and the open ones whose inner keys the real parser judges."""

    def __init__(self, entry: dict[str, list[str]]) -> None:
        self.keys = set(entry["keys"])
        self.open = set(entry["open"])
        self.classes: dict[str, dict[str, dict[str, list[str]]]] = entry.get("classes", {})
        self.groups = {key.rsplit(".", i)[0] for key in self.keys for i in range(1, key.count(".") + 1)}

    def is_open(self, key: str) -> bool:
        """``key`` is an open key or under one (``model.rollout.init_args.max_batch_size``)."""
        parts = key.split(".")
        return any(".".join(parts[:i]) in self.open for i in range(1, len(parts) + 1))

    def accepts(self, key: str) -> bool:
        """``key`` (from the command line, ``init_args`` / ``class_path`` spelled or not) may be valid."""
        parts = [p for p in key.split(".") if p != "init_args"]
        if parts and parts[-1] == "class_path":
            parts = parts[:-1]
        plain = ".".join(parts)
        return not plain or plain in self.keys or plain in self.groups or self.is_open(plain)

    def hint_keys(self) -> list[str]:
        """The keys a "did you mean" may offer: the settings, and those of the indexed classes' ``init_args``."""
        inner = {f"{key}.{k}" for key, names in self.classes.items() for entry in names.values() for k in entry["keys"]}
        return sorted(k for k in self.keys | inner if not k.endswith("help") and k not in ("config", "print_config"))


def _token_key(token: str) -> str:
    """``--model.rl.kl_coef=0.1`` -> ``model.rl.kl_coef``; ``--trainer.callbacks+=X`` -> ``trainer.callbacks``."""
    return token[2:].split("=", 1)[0].removesuffix("+")


def _config_files(args: list[str]) -> list[str]:
    """The ``--config`` / ``-c`` values of ``args`` (``--config=FILE`` too)."""
    files = [args[i + 1] for i, a in enumerate(args[:-1]) if a in ("--config", "-c")]
    return files + [a.split("=", 1)[1] for a in args if a.startswith("--config=")]


def _unknown_file_keys(path: str, known: _Known) -> list[str]:
    """The dotted keys of the YAML file ``path`` its subcommand does not know ([] when the file cannot be read as a
    mapping: the real parser says what is wrong with it)."""
    import yaml

    file = Path(path)
    try:
        data = yaml.safe_load(file.read_text()) if file.is_file() else None
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return []
    return _unknown_keys(data, "", known) if isinstance(data, dict) else []


def _unknown_keys(data: dict[Any, Any], prefix: str, known: _Known) -> list[str]:
    unknown: list[str] = []
    for name, value in data.items():
        if name == "class_path":
            continue
        key = prefix if name == "init_args" else f"{prefix}.{name}" if prefix else str(name)
        if key in known.classes and isinstance(value, dict):
            _check_class_name(key, value.get("class_path"), known)
        if key in known.classes and isinstance(value, dict) and str(value.get("class_path")) in known.classes[key]:
            inner = _Known(known.classes[key][str(value["class_path"])])
            unknown += [f"{key}.{k}" for k in _unknown_keys(value.get("init_args") or {}, "", inner)]
            continue
        if known.is_open(key):
            continue
        if not known.accepts(key) and isinstance(value, dict) and _moved_one_by_one(key):
            unknown += _unknown_keys(value, key, known)  # each key of a split group names its own new place
        elif not known.accepts(key):
            unknown.append(key)
        elif isinstance(value, dict) and key in known.groups:
            unknown += _unknown_keys(value, key, known)
    return unknown


def _moved_one_by_one(group: str) -> bool:
    """Whether the keys of ``group`` moved each on its own (``errors.MOVED`` names its keys, not the group)."""
    from zerotir.cli.errors import MOVED

    return group not in MOVED and any(old.startswith(group + ".") for old in MOVED)


def _check_class_name(key: str, class_path: Any, known: _Known) -> None:
    """Exit naming the closest of zerotir's classes for ``key`` (``model.reward``, ``model.rollout``) when
    ``class_path`` is a short name (no dot) close to one of them but none of them; a dotted path, or a short name
    close to none, is the parser's to judge (a class of the user's own)."""
    if not isinstance(class_path, str) or "." in class_path or class_path in known.classes[key]:
        return
    names = sorted(n for n in known.classes[key] if "." not in n)
    close = difflib.get_close_matches(class_path, names, n=1, cutoff=0.6)
    if close:
        sys.stderr.write(f"error: {key}.class_path={class_path!r}: no such class (did you mean {close[0]}?); "
                         f"zerotir's: {', '.join(names)}, or the dotted path of your own\n")
        sys.exit(2)


def _check_callback_settings(subcommand: str, path: str) -> None:
    """Exit naming the new place of a callback setting that moved into the module's groups
    (``errors.MOVED_INIT_ARGS``: ``PassRateFilter``'s bounds), given in the ``trainer.callbacks`` of ``path``."""
    import yaml

    from zerotir.cli.errors import moved_init_args

    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return
    callbacks = (data.get("trainer") or {}).get("callbacks") if isinstance(data, dict) else None
    entries = callbacks if isinstance(callbacks, list) else [callbacks]
    for entry in entries:
        if isinstance(entry, dict) and isinstance(entry.get("init_args"), dict):
            moved = moved_init_args(f"{entry.get('class_path')} {json.dumps(entry['init_args'])}")
            if moved:
                sys.stderr.write(f"error: a callback setting in the config file {path} moved\n" + "\n".join(moved)
                                 + f"\n(every option with its meaning: {PROG} {subcommand} --help)\n")
                sys.exit(2)


def _fail(subcommand: str, key: str, path: str | None, known: _Known) -> typing.NoReturn:
    from zerotir.cli.errors import key_hint

    where = f" in the config file {path}" if path else ""
    hint = key_hint(key, known.hint_keys())  # names the new place of a moved key first
    sys.stderr.write(f'error: unknown key "{key}"{where}\n' + (f"{hint}\n" if hint else "")
                     + f"(every option with its meaning: {PROG} {subcommand} --help)\n")
    sys.exit(2)


def generate_index() -> dict[str, Any]:
    """The index, read from the real parser of ``zerotir.cli.app`` (imports torch and Lightning)."""
    from zerotir.cli.app import ZeroTIRCLI

    class _Built(Exception):
        pass

    class _ParserOnly(ZeroTIRCLI):
        def parse_arguments(self, parser: argparse.ArgumentParser, args: Any) -> None:
            raise _Built(parser)

    try:
        _ParserOnly(args=["fit"])
        raise RuntimeError("the CLI parsed its arguments without calling parse_arguments")
    except _Built as built:
        parser = built.args[0]
    (subcommands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {"regenerate": REGENERATE, "libraries": library_versions(),
            "subcommands": {name: _parser_keys(sub) for name, sub in subcommands.choices.items()}}


def _parser_keys(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    keys, open_keys, hints, values = set(), set(), {}, {}
    for action in parser._actions:
        target = getattr(action, "target", None)
        if isinstance(target, tuple) and isinstance(target[0], str):  # a link's target (data.tokenizer)
            keys.add(target[0])
        names = [o[2:].removesuffix("+") for o in action.option_strings if o.startswith("--")]
        keys.update(names)
        hint = getattr(action, "_typehint", None)
        spec = value_spec(hint) if hint is not None and names else None
        if spec is not None:
            values[names[0]] = spec
        if hint is not None and not names[0].endswith(".help") and not _is_leaf(hint):
            open_keys.add(names[0])
            hints[names[0]] = hint
    classes = {key: _subclass_keys(hint) for key, hint in hints.items() if _own_base_class(hint)}
    return {"keys": sorted(keys), "open": sorted(open_keys), "classes": classes, "values": values}


def _own_base_class(hint: Any) -> bool:
    """``hint`` is a zerotir base class whose subclasses a ``class_path`` names (``model.rollout``)."""
    return isinstance(hint, type) and hint.__module__.startswith("zerotir.") and bool(hint.__subclasses__())


def _subclass_keys(base: type) -> dict[str, dict[str, list[str]]]:
    """The keys of each subclass of ``base`` (its ``init_args``), under every name a ``class_path`` may give it:
    the short name, the defining module's path and the path of a package that exports it. zerotir's own subclasses
    only: a user's class (or a test's) that happens to be imported must not change the index."""
    from jsonargparse import ArgumentParser

    found: dict[str, dict[str, list[str]]] = {}
    for cls in (c for c in base.__subclasses__() if c.__module__.startswith("zerotir.")):
        parser = ArgumentParser()
        parser.add_class_arguments(cls)
        entry = _parser_keys(parser)
        entry.pop("classes")
        entry.pop("values")
        module, names = cls.__module__, {cls.__name__, f"{cls.__module__}.{cls.__name__}"}
        while "." in module:
            module = module.rpartition(".")[0]
            if getattr(sys.modules[module], cls.__name__, None) is cls:
                names.add(f"{module}.{cls.__name__}")
        found.update({name: entry for name in sorted(names)})
    return found


def _is_leaf(hint: Any) -> bool:
    """``hint`` takes one value (scalars, Literals, lists / tuples / unions of them), not a mapping of keys."""
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return True
    if origin in (typing.Union, types.UnionType, list, tuple):
        return all(arg is Ellipsis or _is_leaf(arg) for arg in typing.get_args(hint))
    return hint in _LEAF_TYPES


def main() -> None:
    """Rewrite ``keys.json`` from the real parser."""
    INDEX_FILE.write_text(json.dumps(generate_index(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {INDEX_FILE}")


if __name__ == "__main__":
    main()
