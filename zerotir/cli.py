"""The command line of training, validation and test: a ``LightningCLI`` over ``ZeroTIRModule`` and
``PromptDataModule``.

    python -m zerotir fit --config configs/tiny_cpu_reinforce.yaml
    python -m zerotir fit --config configs/tiny_cpu_reinforce.yaml --ckpt_path last     # resume
    python -m zerotir test --config configs/eval_math500.yaml [--ckpt_path path.ckpt]
    python -m zerotir fit --config configs/tiny_cpu_ppo.yaml --print_config             # the full config

What the subclass adds to Lightning's CLI:
    * shared arguments are set once: ``model.model_path`` also names the data module's tokenizer;
    * a ``checkpoint`` group (a ``ModelCheckpoint``; ``save_last`` on) whose folder defaults to
      ``<trainer.default_root_dir>/checkpoints``, so ``--ckpt_path last`` finds the previous run's ``last.ckpt``;
    * a TensorBoard logger at ``<trainer.default_root_dir>/tensorboard`` (fixed, not versioned) unless the config
      names a logger, so a resumed run continues the same event folder (purged after its checkpoint's step:
      ``callbacks.PurgeResumedSteps``);
    * the toy base model is built before anything loads it when ``model.build_toy_base_if_missing`` is set.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import fields
from pathlib import Path

import torch
from jsonargparse import Namespace
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

import zerotir.toy.template  # noqa: F401  (registers the "toy" prompt template for the configs)
from zerotir.data import PromptDataModule
from zerotir.module import ZeroTIRModule, ensure_toy_base
from zerotir.rl_step import RLConfig

DEFAULT_ROOT = "runs/zerotir"

# Two Lightning notices that are expected here, not problems: the frozen reference model is in eval mode on purpose,
# and checkpoints are meant to hold the state after each RL step's update (manual optimization).
warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode")
warnings.filterwarnings("ignore", message=r"Using ModelCheckpoint with manual optimization")


def use_cpu_deepspeed_without_cuda() -> None:
    """Without CUDA, let DeepSpeed use its CPU accelerator (``DS_ACCELERATOR=cpu``) unless the variable is set.

    Parsing a config with a DeepSpeed strategy imports DeepSpeed, whose accelerator detection otherwise prints a
    warning to stdout; that line would end up in ``--print_config > full.yaml``. Must run before DeepSpeed is
    imported (it reads the variable once).
    """
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


class ZeroTIRCLI(LightningCLI):
    """``LightningCLI`` with zerotir's links and defaults (see the module docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        use_cpu_deepspeed_without_cuda()
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})  # a resumed run rewrites its config.yaml
        kwargs.setdefault("seed_everything_default", 0)
        kwargs.setdefault("auto_configure_optimizers", False)  # the module builds its one optimizer itself
        super().__init__(ZeroTIRModule, PromptDataModule, *args, **kwargs)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults({
            "checkpoint.save_last": True,
            "checkpoint.save_top_k": 1,
            "checkpoint.every_n_train_steps": 50,
            "trainer.num_sanity_val_steps": 0,  # a sanity check would run full tool rollouts before step 1
            "trainer.default_root_dir": DEFAULT_ROOT,
        })
        parser.link_arguments("model.model_path", "data.tokenizer")

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        root = Path(config.trainer.default_root_dir or DEFAULT_ROOT)
        if config.get("checkpoint") is not None and config.checkpoint.dirpath is None:
            config.checkpoint.dirpath = str(root / "checkpoints")
        if config.trainer.logger in (None, True):
            config.trainer.logger = Namespace(
                class_path="lightning.pytorch.loggers.TensorBoardLogger",
                # No hp_metric placeholder (a -1 at step 0, written again by every resumed run).
                init_args=Namespace(save_dir=str(root), name="tensorboard", version="", default_hp_metric=False),
            )
        # The RL settings are checked before anything is built or loaded (a toy base takes minutes).
        RLConfig(**{f.name: config.model[f.name] for f in fields(RLConfig)})
        if config.model.build_toy_base_if_missing:
            # Before the data module (which loads the tokenizer from the same folder) is set up.
            ensure_toy_base(config.model.model_path, config.model.toy_base_settings)


def cli_main(args: list[str] | None = None) -> ZeroTIRCLI:
    """Run ``fit`` / ``validate`` / ``test`` / ``predict`` with ``args`` (default: ``sys.argv[1:]``)."""
    return ZeroTIRCLI(args=args)
