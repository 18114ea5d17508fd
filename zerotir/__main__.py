"""``python -m zerotir <command>`` (also the ``zerotir`` console script).

Commands:
    fit | validate | test | predict   the LightningCLI (``zerotir.cli.app``); ``--help`` and ``--print_config`` work.
    toy-base                          pretrain the toy base model (``zerotir.toy.pretrain``).
    scaling                           the scaling report from TensorBoard logs (``zerotir.scaling.report``).
    rollouts                          what the model wrote: a run's rollouts on disk (``zerotir.rollout_log.cli``).
    export                            write a checkpoint's policy as a HF folder (``zerotir.models.export_policy``).

A bad config or a failed check prints its message and exits non-zero without a traceback; ``--debug`` anywhere on
the command line (or ``ZEROTIR_DEBUG=1``) shows the traceback (``zerotir.cli.errors``). A mistyped key of
fit / validate / test / predict (typed, or in a ``--config`` file), and a value of the wrong type or outside its
choices, are answered before torch loads (``zerotir.cli.keys``, ``zerotir.cli.values``); a run's first line (the
command and its config files) comes before torch loads too.
"""

from __future__ import annotations

import sys

USAGE = __doc__


def export_main(args: list[str]) -> None:
    """``export --ckpt_path CKPT --out_dir DIR [--model_path BASE] [--merged_dir DIR]``: the policy of a checkpoint
    as a HF folder in ``--out_dir`` (a LoRA run's: its adapters as a peft folder there, and with ``--merged_dir``
    also the merged model, a second folder); the last line names every folder written."""
    from jsonargparse import CLI

    from zerotir.cli.checks import use_cpu_deepspeed_without_cuda
    from zerotir.models import export_policy

    use_cpu_deepspeed_without_cuda()  # before DeepSpeed loads: no "Setting accelerator to CPU" warning

    out = CLI(export_policy, args=args, as_positional=False)
    merged = _option_value(args, "--merged_dir")
    print(f"exported policy to {out}" + (f" and the merged model (base + adapters) to {merged}" if merged else ""))


def _option_value(args: list[str], option: str) -> str | None:
    """The value of ``option`` in ``args`` (``--option VALUE`` or ``--option=VALUE``; the last one), or None."""
    found = None
    for i, arg in enumerate(args):
        if arg == option and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith(option + "="):
            found = arg.split("=", 1)[1]
    return None if found in (None, "null") else found


# The subcommands of the LightningCLI, and the options that print and exit (no run starts).
RUN_COMMANDS = ("fit", "validate", "test", "predict")
_PRINT_ONLY = ("-h", "--help", "--print_config")


def say_starting(argv: list[str]) -> None:
    """For a run of ``fit`` / ``validate`` / ``test`` / ``predict``, one line on stderr naming the command and its
    ``--config`` files, printed before the heavy imports: loading torch, Lightning and transformers takes seconds on
    a quiet machine and tens of seconds under load, and a command that prints nothing meanwhile looks hung. Nothing
    for ``--help`` or ``--print_config`` (their output is all they print)."""
    if not argv or argv[0] not in RUN_COMMANDS or any(a.split("=", 1)[0] in _PRINT_ONLY for a in argv):
        return
    files = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--config", "-c")]
    files += [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]
    config = f"config {', '.join(files)}" if files else "no config file"
    sys.stderr.write(f"zerotir {argv[0]}: {config}, starting (loading torch and Lightning)...\n")
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> None:
    from zerotir.cli.errors import reported_errors, take_debug_flag

    from_command_line = argv is None
    if from_command_line:
        sys.argv[1:] = take_debug_flag(sys.argv[1:])  # LightningCLI reads sys.argv itself
    argv = take_debug_flag(list(sys.argv[1:] if argv is None else argv))
    from zerotir.cli.keys import check_keys

    check_keys(argv)  # a mistyped key of fit/validate/test/predict answers here, before torch loads
    say_starting(argv)  # a first line within a second, before torch, Lightning and transformers load
    from zerotir.cli.console import quiet_library_output

    quiet_library_output()  # library noise filtered unless --debug / ZEROTIR_DEBUG (zerotir.cli.console)
    with reported_errors():
        _dispatch(argv, from_command_line)


def _dispatch(argv: list[str], from_command_line: bool) -> None:
    command = argv[0] if argv else ""
    if command == "toy-base":
        from zerotir.toy.pretrain import main as toy_main

        toy_main(argv[1:])
    elif command == "scaling":
        from zerotir.scaling.report import main as scaling_main

        sys.exit(scaling_main(argv[1:]))
    elif command == "rollouts":
        from zerotir.rollout_log.cli import main as rollouts_main

        sys.exit(rollouts_main(argv[1:]))
    elif command == "export":
        export_main(argv[1:])
    elif command in ("-h", "--help", ""):
        print(USAGE)
    else:
        from zerotir.cli.app import cli_main

        cli_main(None if from_command_line else argv)  # None: LightningCLI reads sys.argv itself


if __name__ == "__main__":
    main()
