"""Checks of a command line that Lightning would answer late, vaguely or not at all, each naming the setting and the
fix (used by ``zerotir.cli.app``):

* ``join_negative_values``: ``--model.optim.lr -1e-4`` is read as a value (argparse takes ``-1e-4`` for an option:
  its negative-number rule knows no exponent);
* ``urls_unset_the_embedded_server``: ``--model.tool.sandbox.urls`` on the command line also unsets the embedded
  server's settings a config file gave (``workers: 2`` of the toy configs), unless the command line sets them too;
* ``check_run_settings``: a GPU asked for on a machine without CUDA (Lightning says only "No supported gpu backend
  found!") and ``trainer.max_steps 0`` for ``fit`` (it would start the sandbox and write a run that trains nothing);
* ``use_cpu_deepspeed_without_cuda``: DeepSpeed's accelerator warning kept off stdout (``--print_config``,
  ``export``);
* ``check_not_finished``: ``--ckpt_path`` of a run that already reached ``trainer.max_steps`` (Lightning sets up
  everything, then exits having done nothing);
* ``check_last_exists``: ``--ckpt_path last`` where no ``last.ckpt`` is (Lightning warns and trains from step 0).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

# The CPU rehearsals of the GPU configs (docs/scale.md): the same strategies on 2 CPU processes.
REHEARSALS = "configs/rehearsal/ (ddp_ppo.yaml, zero2_ppo.yaml, zero3_reinforce.yaml)"
_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def join_negative_values(argv: list[str]) -> list[str]:
    """``argv`` with each negative number that follows a ``--key`` joined to it (``--key=-1e-4``)."""
    out: list[str] = []
    for arg in argv:
        if _NUMBER.match(arg) and out and out[-1].startswith("--") and "=" not in out[-1]:
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


_URLS = "--model.tool.sandbox.urls"
# The embedded server's settings, and what unsets each (``SandboxConfig``: an error beside urls).
_EMBEDDED = {"--model.tool.sandbox.workers": "null", "--model.tool.sandbox.server_options": "{}"}


def urls_unset_the_embedded_server(argv: list[str]) -> list[str]:
    """``argv`` with the embedded server's settings unset after it when it gives ``--model.tool.sandbox.urls`` (not
    null) and none of them: servers named on the command line override a config file's embedded server, whose
    settings cannot apply beside them. Settings given in one place with urls (both in a file, both typed) stay an
    error (``SandboxConfig``)."""
    keys = [a.split("=", 1)[0] for a in argv]
    if _URLS not in keys:
        return argv
    at = len(keys) - 1 - keys[::-1].index(_URLS)
    value = argv[at].split("=", 1)[1] if "=" in argv[at] else (argv[at + 1] if at + 1 < len(argv) else "null")
    if value.strip().lower() in ("null", "none") or any(k in keys for k in _EMBEDDED):
        return argv
    return argv + [word for key, unset in _EMBEDDED.items() for word in (key, unset)]


def check_run_settings(config: Any, subcommand: str | None) -> None:
    """Raise ``ValueError`` for a GPU accelerator without CUDA, or ``fit`` with ``trainer.max_steps 0``."""
    accelerator = config.trainer.accelerator
    if isinstance(accelerator, str) and accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ValueError(
            f"trainer.accelerator={accelerator!r} but this machine has no CUDA GPU. Run on a GPU machine, or set "
            f"--trainer.accelerator cpu; for a GPU config's CPU rehearsal see {REHEARSALS}")
    if subcommand in ("fit", None) and config.trainer.max_steps == 0:
        raise ValueError("trainer.max_steps=0 trains no RL step: give the number of RL steps "
                         "(--trainer.max_steps N, N >= 1)")


def _checkpoint_file(ckpt_path: str | None, dirpath: str | None) -> Path | None:
    """The file holding the step of the checkpoint ``ckpt_path`` names (``last``: ``<dirpath>/last.ckpt``), or None.

    A DeepSpeed checkpoint is a folder: Lightning saves its trainer state as DeepSpeed's client state, under the tag
    ``checkpoint``, in the model-states file of rank 0 (``mp_rank_00_model_states.pt``; under ZeRO-3
    ``zero_pp_rank_0_mp_rank_00_model_states.pt``, which holds no weights)."""
    if ckpt_path in (None, "best", "hpc", "registry"):
        return None
    path = Path(dirpath) / "last.ckpt" if ckpt_path == "last" and dirpath else Path(str(ckpt_path))
    if path.is_dir():
        states = [path / "checkpoint" / name for name in (
            "mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt")]
        return next((file for file in states if file.is_file()), None)
    return path if path.is_file() else None


def check_not_finished(ckpt_path: str | None, dirpath: str | None, max_steps: int) -> None:
    """Raise ``ValueError`` when the checkpoint to resume already holds ``max_steps`` RL steps.

    Reads only the checkpoint's step (memory-mapped, no tensor is copied), from a file or a DeepSpeed folder."""
    path = _checkpoint_file(ckpt_path, dirpath)
    if path is None or max_steps < 0:
        return
    step = torch.load(path, map_location="cpu", mmap=True, weights_only=False).get("global_step")
    if isinstance(step, int) and step >= max_steps:
        raise ValueError(
            f"--ckpt_path {ckpt_path} ({path}): the run is finished, its checkpoint is at RL step {step} and "
            f"trainer.max_steps={max_steps}. To train on, raise trainer.max_steps "
            f"(e.g. --trainer.max_steps {step + max(max_steps, 1)})")


def check_last_exists(ckpt_path: str | None, dirpath: str | None, dirpath_given: bool) -> None:
    """Raise ``ValueError`` for ``--ckpt_path last`` when the checkpoint folder ``dirpath`` holds no ``last*.ckpt``
    (a file, or a DeepSpeed checkpoint's folder): a resume that finds nothing must not train from step 0.

    ``dirpath_given``: the folder was set as ``checkpoint.dirpath`` (else it is ``<trainer.default_root_dir>/
    checkpoints``), which decides the setting the fix names."""
    if ckpt_path != "last" or dirpath is None:
        return
    folder = Path(dirpath)
    if folder.is_dir() and any(folder.glob("last*.ckpt")):
        return
    where = "--checkpoint.dirpath" if dirpath_given else "--trainer.default_root_dir (its checkpoints/ folder is read)"
    raise ValueError(
        f"--ckpt_path last: no last.ckpt in {folder}, so there is nothing to resume. To start a fresh run, drop "
        f"--ckpt_path last; to resume an earlier run, point {where} at that run's folder")


def use_cpu_deepspeed_without_cuda() -> None:
    """Without CUDA, let DeepSpeed use its CPU accelerator (``DS_ACCELERATOR=cpu``) unless the variable is set.

    Parsing a config with a DeepSpeed strategy imports DeepSpeed, whose accelerator detection otherwise prints a
    warning to stdout; that line would end up in ``--print_config > full.yaml``. Must run before DeepSpeed is
    imported (it reads the variable once).
    """
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
