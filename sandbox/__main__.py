"""``python -m sandbox serve``: run the sandbox service (see ``python -m sandbox serve --help``).

Examples::

    python -m sandbox serve --host 127.0.0.1 --port 8080 --workers 2
    python -m sandbox serve --port 8080 --limits.run_timeout 10 --limits.allow_imports '["*"]'
    python -m sandbox serve --port 8080 --extra-ro /data/tables --extra-ro /data/constants.json
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from typing import Any

from jsonargparse import ArgumentParser, Namespace

from sandbox.config import ExecConfig


def default_workers() -> int:
    """One worker per core this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def build_parser() -> ArgumentParser:
    """The command line: ``serve`` with server options and ``--limits.*`` execution options (ExecConfig)."""
    serve = ArgumentParser(description="Run the sandbox service: SandboxFusion's /run_code plus /run_batch, "
                                       "/health and /metrics.")
    serve.add_argument("--host", type=str, default="127.0.0.1",
                       help="Interface to bind. Loopback by default: the sandbox has no authentication.")
    serve.add_argument("--port", type=int, default=8080, help="TCP port (0 picks a free one).")
    serve.add_argument("--workers", type=int | None, default=None,
                       help="Worker processes, each running one snippet at a time (default: one per core).")
    serve.add_argument("--queue_size", type=int, default=1024,
                       help="Most snippets admitted at once, running or waiting; beyond it the answer is 429.")
    serve.add_argument("--startup_timeout", type=float, default=120.0,
                       help="Seconds a worker may take to import its modules and report ready.")
    serve.add_argument("--listen_fd", type=int | None, default=None,
                       help="Serve on this already-bound listening socket (used by sandbox.local_sandbox).")
    serve.add_argument("--exit_with_parent", type=int | None, default=None,
                       help="Shut down when this process (our parent) exits, even if it is killed "
                            "(used by sandbox.local_sandbox).")
    serve.add_argument("--head_timeout", type=float, default=10.0,
                       help="Seconds a connection may take to send a whole request head (from its opening or its "
                            "last response); a connection that sends nothing is closed after it.")
    serve.add_argument("--log_level", type=str, default="info", help="Logging level of the service.")
    serve.add_argument("--extra-ro", type=str, action="append", default=[], metavar="PATH",
                       help="Expose this host folder (or file) read-only to the snippets, at the same path; repeat "
                            "for several (added to --limits.extra_ro). It must exist.")
    serve.add_class_arguments(ExecConfig, nested_key="limits")
    parser = ArgumentParser(prog="python -m sandbox", description="The zerotir code sandbox.")
    subcommands = parser.add_subcommands(required=True)
    subcommands.add_subcommand("serve", serve)
    return parser


def exec_config(cfg: Namespace) -> ExecConfig:
    """The parsed ``serve`` options' ExecConfig, with every ``--extra-ro PATH`` added to ``--limits.extra_ro``."""
    options = dict(cfg.limits)
    return ExecConfig(**{**options, "extra_ro": [*options["extra_ro"], *cfg.extra_ro]})


def serve(cfg: Namespace) -> None:
    """Start the service described by the parsed ``serve`` options and block until it is stopped."""
    import uvicorn  # the client side of the package never needs the web stack

    from sandbox.bounds import uvicorn_limits
    from sandbox.server import create_app

    logging.basicConfig(level=cfg.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s",
                        stream=sys.stderr)
    limits = exec_config(cfg)
    workers = cfg.workers if cfg.workers is not None else default_workers()
    app = create_app(limits, workers=workers, queue_size=cfg.queue_size, startup_timeout=cfg.startup_timeout)
    config = uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level=cfg.log_level, access_log=False,
                            timeout_graceful_shutdown=5, lifespan="on",
                            **uvicorn_limits(cfg.queue_size, cfg.head_timeout))
    server = uvicorn.Server(config)
    if cfg.exit_with_parent is not None:
        threading.Thread(target=_exit_with_parent, args=(cfg.exit_with_parent, server), daemon=True).start()
    sockets = None
    if cfg.listen_fd is not None:
        sockets = [socket.socket(fileno=cfg.listen_fd)]
    server.run(sockets=sockets)
    if not server.started:
        sys.exit(3)  # start-up failed (the reason is in the log above)


def _exit_with_parent(parent_pid: int, server: Any) -> None:
    """Ask uvicorn for a graceful shutdown once our parent is gone (we get re-parented)."""
    while not server.should_exit:
        if os.getppid() != parent_pid:
            logging.getLogger("sandbox").warning("sandbox: parent %d exited; shutting down", parent_pid)
            server.should_exit = True
            return
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m sandbox``."""
    parser = build_parser()
    cfg = parser.parse_args(argv)
    if cfg.subcommand == "serve":
        serve(cfg.serve)


if __name__ == "__main__":
    main()
