"""Where a toy config may build its base: reuse, build, or refuse the ``model.base.path`` it is given.

A toy config (``toy_base`` set) builds its base on first use at the folder its config file names (its own folder),
and rebuilds it there when the settings changed. Any other ``model.base.path`` (one given on the command line) must
already hold a model: a toy base with the same settings is reused; a path that names nothing is a typo, not a request
to pretrain for minutes at a new place; a real model folder (an exported policy), or a toy base built with other
settings, is used as it is (trained, or evaluated) only with ``--toy_base null``.
"""

from __future__ import annotations

from pathlib import Path

from zerotir.models import ModelNotFoundError
from zerotir.toy.pretrain import PretrainSettings, read_info, settings_differ


def _same(a: Path, b: Path) -> bool:
    return a.expanduser().resolve() == b.expanduser().resolve()


def check_toy_base_path(model_path: str, own_folder: str | None, settings: PretrainSettings,
                        action: str = "train") -> None:
    """Raise unless ``toy_base`` may build or reuse its base at ``model_path``.

    Args:
        model_path: ``model.base.path`` as parsed (config files, then command-line overrides).
        own_folder: ``model.base.path`` as the config files give it; None when none of them sets it.
        settings: the ``toy_base`` settings.
        action: what the command does with the model, as the fix says it ("train", "evaluate").

    Raises:
        ModelNotFoundError: ``model_path`` is not the config's own folder and names nothing.
        ValueError: ``model_path`` is a model folder that is not a toy base, or a toy base with other settings.
    """
    path = Path(model_path)
    info = read_info(path) if path.is_dir() else None
    if info is None and path.is_dir() and any(path.iterdir()):
        raise ValueError(
            f"model.base.path={model_path!r} is a model folder but not a toy base (no toy_base.json), and toy_base "
            f"is set. To {action} this model as it is, add --toy_base null (toy_base: null in a config)")
    if own_folder is not None and _same(path, Path(own_folder)):
        return
    own = f"its own folder {own_folder!r}" if own_folder else "the model_path a config file names"
    if not path.exists():
        raise ModelNotFoundError(
            f"model.base.path={model_path!r}: no such folder. A toy config (toy_base is set) builds its base only at "
            f"{own}, never at a path given on the command line. Fix the path; or build a toy base there first "
            f"(`python -m zerotir toy-base --out {model_path}`); or, for another model, give its folder and "
            f"--toy_base null")
    if info is None:  # an empty folder, or a file
        raise ModelNotFoundError(f"model.base.path={model_path!r}: an empty folder or a file; give a model folder, or "
                                 f"leave model.base.path at {own} to build the toy base there")
    differ = settings_differ(info, settings)
    if differ:
        shown = ", ".join(f"{k}: {old!r} there, {new!r} in toy_base" for k, (old, new) in sorted(differ.items()))
        raise ValueError(
            f"model.base.path={model_path!r} is a toy base built with other settings ({shown}); toy_base rebuilds "
            f"a base only at {own}. To {action} it as it is, add --toy_base null; or point model.base.path at the "
            f"config's own folder")
