"""``python -m zerotir <command>`` (also the ``zerotir`` console script).

Commands:
    fit | validate | test | predict   the LightningCLI (``zerotir.cli``); ``--help`` and ``--print_config`` work.
    toy-base                          pretrain the toy base model (``zerotir.toy.pretrain``).
    scaling                           the scaling report from TensorBoard logs (``zerotir.scaling.report``).
    rollouts                          what the model wrote: a run's rollouts on disk (``zerotir.rollout_log.cli``).
    export                            write a checkpoint's policy as a HF folder (``zerotir.models.export_policy``).

A bad config or a failed check prints its message and exits non-zero without a traceback; ``--debug`` anywhere on
the command line (or ``ZEROTIR_DEBUG=1``) shows the traceback (``zerotir.cli_errors``). A mistyped key of
fit / validate / test / predict (typed, or in a ``--config`` file) is answered before torch loads
(``zerotir.cli_keys``).
"""

from __future__ import annotations

import sys

USAGE = __doc__


def export_main(args: list[str]) -> None:
    """``export --ckpt_path CKPT --out_dir DIR [--model_path BASE] [--merged_dir DIR]``: the policy of a checkpoint
    as a HF folder (a LoRA run's: its adapters as a peft folder, and with ``--merged_dir`` the merged model)."""
    from jsonargparse import CLI

    from zerotir.cli_checks import use_cpu_deepspeed_without_cuda
    from zerotir.models import export_policy

    use_cpu_deepspeed_without_cuda()  # before DeepSpeed loads: no "Setting accelerator to CPU" warning

    out = CLI(export_policy, args=args, as_positional=False)
    print(f"exported policy to {out}")


def main(argv: list[str] | None = None) -> None:
    from zerotir.cli_errors import reported_errors, take_debug_flag

    from_command_line = argv is None
    if from_command_line:
        sys.argv[1:] = take_debug_flag(sys.argv[1:])  # LightningCLI reads sys.argv itself
    argv = take_debug_flag(list(sys.argv[1:] if argv is None else argv))
    from zerotir.cli_keys import check_keys

    check_keys(argv)  # a mistyped key of fit/validate/test/predict answers here, before torch loads
    from zerotir.console import quiet_library_output

    quiet_library_output()  # library noise filtered unless --debug / ZEROTIR_DEBUG (zerotir.console)
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
        from zerotir.cli import cli_main

        cli_main(None if from_command_line else argv)  # None: LightningCLI reads sys.argv itself


if __name__ == "__main__":
    main()
