"""The command line of training, validation and test: a ``LightningCLI`` over ``ZeroTIRModule`` and
``PromptDataModule``.

    python -m zerotir fit --config configs/tiny_cpu_reinforce.yaml
    python -m zerotir fit --config configs/tiny_cpu_reinforce.yaml --ckpt_path last     # resume
    python -m zerotir test --config configs/eval_math500.yaml [--ckpt_path path.ckpt]
    python -m zerotir fit --config configs/tiny_cpu_ppo.yaml --print_config             # the full config

What the subclass adds to Lightning's CLI:
    * the module's settings are typed groups (``model.base``, ``model.rl``, ``model.optim``, ``model.tool``,
      ``model.sampling``, ``model.eval``, ``model.rollout``, ``model.tool.sandbox``...: ``zerotir.config``); ``--help``
      shows each field's docstring;
    * shared arguments are set once: ``model.base.path`` also names the data module's tokenizer; the data's prompt
      is written by ``model.tool.format`` (``data.tool_format``), with ``model.tool.tools`` when the format's calls
      name their tool (``prompt_tools``: hermes, chat) and ``model.tool.chat_template_kwargs``;
    * a ``checkpoint`` group (a ``ModelCheckpoint``; ``save_last`` on) whose folder defaults to
      ``<trainer.default_root_dir>/checkpoints``, so ``--ckpt_path last`` finds the previous run's ``last.ckpt``;
      it follows ``trainer.enable_checkpointing`` (false: no checkpoint callback at all);
    * a TensorBoard logger at ``<trainer.default_root_dir>/tensorboard`` (fixed, not versioned) unless the config
      names a logger, so a resumed run continues the same event folder (purged after its checkpoint's step:
      ``callbacks.PurgeResumedSteps``, one of the ``RUN_CALLBACKS`` added to every run);
    * a progress bar counting RL steps (Lightning's says "Epoch 0/-2" for a run bounded by ``max_steps``);
    * ``toy_base``: when set (``toy_base: {}`` for the toy world's defaults), the toy base model is built at
      ``model.base.path`` before anything loads it, unless one with the same settings is there; it builds only at
      the folder the config file names (``zerotir.toy.base_path``), so a mistyped path fails instead;
    * errors: a bad config prints its message, not the whole usage (``zerotir.cli.errors``); a mistyped key read
      from a ``--config`` file names the file;
    * the checks Lightning answers late or vaguely (``zerotir.cli.checks``): ``--key -1e-4`` is a value, a GPU
      without CUDA and ``trainer.max_steps 0`` fail before anything is built, a resume of a finished run says to
      raise ``trainer.max_steps``, ``--ckpt_path last`` with no ``last.ckpt`` names the folder it looked in; a run
      that fails before its first RL step removes the log folder it created;
    * the model table printed when training starts (``LateModelSummary``), after the sandbox and the engine started.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import shutil
import sys
import typing
import warnings
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any, NoReturn

import docstring_parser
import yaml
from jsonargparse import Namespace, set_parsing_settings
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint, ModelSummary, ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

import zerotir.toy.template  # noqa: F401  (registers the "toy" prompt template for the configs)
from zerotir.cli.checks import (check_last_exists, check_not_finished, check_run_settings, join_negative_values,
                                urls_unset_the_embedded_server, use_cpu_deepspeed_without_cuda)
from zerotir.cli.errors import debug_requested, parse_error_text, reported_errors
from zerotir.config import FilterConfig, RLConfig, SamplingConfig, ToolConfig
from zerotir.data.datamodule import PromptDataModule
from zerotir.eval.report import new_run_dir
from zerotir.module import ZeroTIRModule
from zerotir.tools.formats import format_class, format_label
from zerotir.tools.mcp_server import RUN_DIR_ENV
from zerotir.tools.registry import tool_names
from zerotir.toy.base_path import check_toy_base_path
from zerotir.toy.pretrain import PretrainSettings, ensure_toy_base

DEFAULT_ROOT = "runs/zerotir"
# The callbacks every run needs, added unless the config lists them: named by class_path, since nothing of zerotir/
# imports callbacks/ (docs/architecture.md). PurgeResumedSteps: one value per step on a resumed run's curves;
# SaveOnInterrupt: Ctrl-C saves last.ckpt at the last completed RL step and says where a resume starts.
RUN_CALLBACKS = ("callbacks.PurgeResumedSteps", "callbacks.SaveOnInterrupt")
log = logging.getLogger(__name__)

# Two Lightning notices that are expected here, not problems: the frozen reference model is in eval mode on purpose,
# and checkpoints are meant to hold the state after each RL step's update (manual optimization).
warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode")
warnings.filterwarnings("ignore", message=r"Using ModelCheckpoint with manual optimization")


# Field docstrings of the configuration dataclasses are their --help text.
set_parsing_settings(docstring_parse_attribute_docstrings=True)
# jsonargparse reads those docstrings with ``docstring_parser.parse_from_object``, which re-reads and re-parses the
# class's source on every call: once per class and per subcommand (fit, validate, test, predict), and again for every
# command line a process builds. Its result depends only on the object and the style, so it is kept per process; the
# parser, its --help and the parsed configs are the same as without the cache.
docstring_parser.parse_from_object = functools.lru_cache(maxsize=None)(docstring_parser.parse_from_object)


class ZeroTIRArgumentParser(LightningArgumentParser):
    """Lightning's parser whose errors are the message, a hint for a mistyped key, and a pointer to ``--help``
    instead of the whole usage (``zerotir.cli.errors``)."""

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error or debug_requested() or os.environ.get("JSONARGPARSE_DEBUG", "false") != "false":
            super().error(message, ex)  # raises: a nested parser's error is its caller's; debug shows the traceback
        self._logger.error(message)
        sys.stderr.write(parse_error_text(self, message, ZeroTIRArgumentParser.last_args))
        sys.exit(2)

    # The command line being parsed: a parse error names the --config file it comes from and the subcommand's --help.
    last_args: list[str] = []

    def parse_args(self, args: Any = None, *rest: Any, **kwargs: Any) -> Namespace:
        if not isinstance(args, Namespace) and self._subcommands_action is not None:  # the whole command line
            ZeroTIRArgumentParser.last_args = [str(a) for a in (sys.argv[1:] if args is None else args)]
        return super().parse_args(args, *rest, **kwargs)


class ZeroTIRCLI(LightningCLI):
    """``LightningCLI`` with zerotir's links and defaults (see the module docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        use_cpu_deepspeed_without_cuda()
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})  # a resumed run rewrites its config.yaml
        kwargs.setdefault("seed_everything_default", 0)
        kwargs.setdefault("auto_configure_optimizers", False)  # the module builds its one optimizer itself
        kwargs.setdefault("parser_class", ZeroTIRArgumentParser)  # short errors, "did you mean" for a mistyped key
        kwargs.setdefault("parser_kwargs", {"prog": "python -m zerotir"})
        if kwargs.get("args") is None:  # the command line: LightningCLI reads sys.argv
            sys.argv[1:] = urls_unset_the_embedded_server(sys.argv[1:])
        elif isinstance(kwargs["args"], list):
            kwargs["args"] = urls_unset_the_embedded_server([str(a) for a in kwargs["args"]])
        self._eval_dir: Path | None = None  # the folder of this validate / test run, once created
        try:
            super().__init__(ZeroTIRModule, PromptDataModule, *args, **kwargs)
        except BaseException:
            if self._eval_dir is not None and not any(p.is_file() for p in self._eval_dir.rglob("*")):
                shutil.rmtree(self._eval_dir)  # a run that failed having written nothing leaves no empty folder
            raise

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults({
            "checkpoint.save_last": True,
            "checkpoint.save_top_k": 1,
            "checkpoint.every_n_train_steps": 50,
            "trainer.num_sanity_val_steps": 0,  # a sanity check would run full tool rollouts before step 1
            "trainer.default_root_dir": DEFAULT_ROOT,
        })
        parser.link_arguments("model.base.path", "data.tokenizer")
        parser.link_arguments(("model.tool.format", "model.tool.tools"), "data.tools", compute_fn=prompt_tools)
        parser.link_arguments("model.tool.format", "data.tool_format")
        parser.link_arguments("model.tool.chat_template_kwargs", "data.chat_template_kwargs")
        parser.add_argument("--toy_base", type=PretrainSettings | None, default=None,
                            help="Build the toy base model at model.base.path first (unless one with these settings "
                                 "is there, its checksums verified); {} = the toy world's defaults, the base shipped "
                                 "in data/toy_base, which no run rewrites (docs/toy.md).")

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        root = Path(config.trainer.default_root_dir or DEFAULT_ROOT)
        self._dirpath_given = config.get("checkpoint") is not None and config.checkpoint.dirpath is not None
        if config.get("checkpoint") is not None and config.checkpoint.dirpath is None:
            config.checkpoint.dirpath = str(root / "checkpoints")
        if self.subcommand in ("validate", "test"):
            # A run of its own (reports, events, config.yaml, rollouts), never in the training run's folders or over
            # another evaluation's; --ckpt_path last still finds the training run's checkpoints (set above).
            root = self._eval_dir = new_run_dir(root / self.subcommand)
            config.trainer.default_root_dir = str(root)
            log.info("%s: this run's reports and logs go to %s", self.subcommand, root)
        os.environ[RUN_DIR_ENV] = str(root)  # where tools started in this process or its hosts put their logs
        if self.subcommand in ("fit", "validate", "test", None):  # None: the CLI built without a subcommand (a fit)
            log.info("zerotir %s: %s; run folder %s", self.subcommand or "fit", _tools_line(config.model.tool), root)
        if config.trainer.logger in (None, True):
            config.trainer.logger = Namespace(
                class_path="lightning.pytorch.loggers.TensorBoardLogger",
                # No hp_metric placeholder (a -1 at step 0, written again by every resumed run).
                init_args=Namespace(save_dir=str(root), name="tensorboard", version="", default_hp_metric=False),
            )
        if config.trainer.enable_model_summary is not False and not any(
                _is_callback(cb, ModelSummary) for cb in _as_list(config.trainer.callbacks)):
            config.trainer.callbacks = _as_list(config.trainer.callbacks) + [
                Namespace(class_path="zerotir.cli.app.LateModelSummary", init_args=Namespace())]
        if config.trainer.enable_progress_bar is not False and not any(
                _is_callback(cb, ProgressBar) for cb in _as_list(config.trainer.callbacks)):
            config.trainer.callbacks = _as_list(config.trainer.callbacks) + [
                Namespace(class_path="callbacks.RLStepProgressBar", init_args=Namespace(tools=_tools(config)))]
        named = {_class_name(cb) for cb in _as_list(config.trainer.callbacks)}
        config.trainer.callbacks = _as_list(config.trainer.callbacks) + [
            Namespace(class_path=path, init_args=Namespace()) for path in RUN_CALLBACKS
            if path.rpartition(".")[2] not in named]
        # Settings that cannot train fail before anything is built or loaded (a toy base takes minutes): each group
        # checks itself when it is built, the cross-group checks follow.
        check_run_settings(config, self.subcommand)
        rl, sampling = _group(config.model.rl, RLConfig), _group(config.model.sampling, SamplingConfig)
        rl.check_training_sampling(sampling)
        _group(config.model.filters, FilterConfig).check_run(rl, sampling, _group(config.model.tool, ToolConfig))
        if config.get("toy_base") is not None:
            # Before the data module (which loads the tokenizer from the same folder) is set up.
            settings = config.toy_base
            settings = asdict(settings) if isinstance(settings, PretrainSettings) else settings.as_dict()
            check_toy_base_path(config.model.base.path, self._model_path_of_config_files(config),
                                PretrainSettings(**settings),
                                "evaluate" if self.subcommand in ("validate", "test") else "train")
            ensure_toy_base(config.model.base.path, **settings)

    def _model_path_of_config_files(self, config: Namespace) -> str | None:
        """``model.base.path`` as the ``--config`` files give it, merged in order (the last file that sets it wins),
        before command-line overrides: the toy base's own folder (``zerotir.toy.base_path``).

        Read from the files' YAML, not by parsing each file as a config: an overlay (``configs/toy_cpu_ppo.yaml``) or
        a user's file that sets ``model:`` without ``base.path`` is not a whole config on its own."""
        found = None
        for path in config.get("config") or []:
            if path is not None:
                found = _file_model_path(Path(str(path))) or found
        return found

    def _run_subcommand(self, subcommand: str) -> None:
        """Lightning's, leaving nothing behind when the run fails before its first RL step: the log folder (an empty
        event file and config.yaml) is removed if this run created it, and so is the run folder
        (``trainer.default_root_dir``) when this run created it and it is left empty. Rank 0 alone removes them: the
        logger writes there only, and two ranks sharing one file system would race on the same folder."""
        logger = self.trainer.logger  # TensorBoard's and CSV's declare their folder; other loggers keep theirs
        log_dir = logger.log_dir if isinstance(logger, (TensorBoardLogger, CSVLogger)) else None
        created = log_dir is not None and not Path(log_dir).exists()
        root = Path(self.trainer.default_root_dir)
        root_created = not root.exists()
        try:
            super()._run_subcommand(subcommand)
        except BaseException:
            if self.trainer.is_global_zero and self.trainer.global_step == 0:
                if created and Path(log_dir).is_dir():
                    shutil.rmtree(log_dir)
                if root_created and root.is_dir() and not any(root.iterdir()):
                    root.rmdir()
            raise

    def before_fit(self) -> None:
        """A resume of a finished run is an error naming the fix, before the sandbox and the engine start."""
        config = self.config["fit"]
        check_last_exists(config.ckpt_path, config.get("checkpoint") and config.checkpoint.dirpath,
                          self._dirpath_given)
        check_not_finished(config.ckpt_path, config.get("checkpoint") and config.checkpoint.dirpath,
                           self.trainer.max_steps)

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """Lightning's, with the ``checkpoint`` group following ``trainer.enable_checkpointing``."""
        trainer_config = {**self._get(self.config_init, "trainer", default={}), **kwargs}
        callbacks = [self._get(self.config_init, key) for key in self._parser(self.subcommand).callback_keys]
        if trainer_config.get("enable_checkpointing") is False:
            callbacks = [cb for cb in callbacks if not isinstance(cb, ModelCheckpoint)]
        return self._instantiate_trainer(trainer_config, callbacks)


def prompt_tools(call_format: Any, tools: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """``data.tools``: the tools the data's prompt describes, ``model.tool.tools`` under a format whose calls name
    their tool (``CallFormat.calls_by_name``: hermes, chat), else None (the fences' prompt speaks of code blocks)."""
    return tools if format_class(call_format).calls_by_name else None


def _tools_line(tool: Any) -> str:
    """The run's tools and call format as its start line says them (``model.tool``, parsed)."""
    if tool.max_tool_calls == 0:
        return "no tools (model.tool.max_tool_calls 0)"
    names = ", ".join(str(entry["class_path"]) for entry in tool.tools)
    return f"tools {names} (call format {format_label(tool.format)}, up to {tool.max_tool_calls} calls per response)"


def _tools(config: Namespace) -> list[str]:
    """The names of the run's tools (none when ``model.tool.max_tool_calls`` is 0)."""
    tool = config.model.tool
    return tool_names(tool.tools) if tool.max_tool_calls > 0 else []


def _file_model_path(path: Path) -> str | None:
    """``model.base.path`` in one config file (``model: {base: {path: ...}}`` or under ``init_args``), or None."""
    model = (yaml.safe_load(path.read_text()) or {}).get("model")
    if not isinstance(model, dict):
        return None
    base = model.get("base") or (model.get("init_args") or {}).get("base")
    return base.get("path") if isinstance(base, dict) else None


def _group(value: Any, group: type[Any]) -> Any:
    """A configuration group as parsed (an instance, or a Namespace of its fields) as an instance of ``group``, its
    nested groups (``model.filters.refill``) built too."""
    if isinstance(value, group):
        return value
    fields = value.as_dict() if isinstance(value, Namespace) else dict(value)
    hints = typing.get_type_hints(group)
    for name, field_value in fields.items():
        if is_dataclass(hints.get(name)) and not is_dataclass(field_value):
            fields[name] = _group(field_value, hints[name])
    return group(**fields)


def _as_list(callbacks: Any) -> list[Any]:
    return [] if callbacks is None else list(callbacks) if isinstance(callbacks, list) else [callbacks]


def _class_name(callback: Any) -> str:
    """The class name of a configured callback (a class_path Namespace or an instance)."""
    return str(callback["class_path"]).rpartition(".")[2] if isinstance(callback, Namespace) else type(callback).__name__


def _is_callback(callback: Any, kind: type) -> bool:
    """A configured callback (a class_path Namespace or an instance) that is a ``kind``."""
    if isinstance(callback, kind):
        return True
    module, _, name = str(callback["class_path"]).rpartition(".")  # resolved to a full path by the parser
    return issubclass(getattr(importlib.import_module(module), name), kind)


class LateModelSummary(ModelSummary):
    """Lightning's model table, printed when training starts instead of at ``on_fit_start``: after the module's
    ``on_fit_start`` has started the sandbox and the engine, so an error there (no sandbox answering) is not printed
    under a table of the model."""

    def on_fit_start(self, trainer: Trainer, pl_module: Any) -> None:
        return None

    def on_train_start(self, trainer: Trainer, pl_module: Any) -> None:
        super().on_fit_start(trainer, pl_module)


def cli_main(args: list[str] | None = None) -> ZeroTIRCLI:
    """Run ``fit`` / ``validate`` / ``test`` / ``predict`` with ``args`` (default: ``sys.argv[1:]``); a bad config
    or a failed check ends in its message and exit status 1 (``zerotir.cli.errors``)."""
    with reported_errors():
        if args is None:
            sys.argv[1:] = join_negative_values(sys.argv[1:])
        return ZeroTIRCLI(args=None if args is None else join_negative_values(args))
