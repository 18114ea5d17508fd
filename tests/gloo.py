"""Multi-process test plumbing: a free loopback port, and N spawned gloo ranks whose results are read back."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def spawned(worker: Callable[..., None], args: tuple, world: int, timeout_s: float) -> Iterator[None]:
    """``worker(rank, *args)`` on ``world`` spawned processes while the block runs (this process's part of their
    work); after it, wait at most ``timeout_s`` for them (a rank's exception is raised with its traceback). Any
    process still alive at the end, or when the block raises, is stopped."""
    ctx = mp.start_processes(worker, args=args, nprocs=world, join=False, start_method="spawn")
    try:
        yield
        deadline = time.monotonic() + timeout_s
        while not ctx.join(timeout=1.0):  # raises ProcessRaisedException with the rank's traceback on a failure
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {world} spawned workers did not finish within {timeout_s} s")
    finally:
        for proc in ctx.processes:
            if proc.is_alive():
                proc.terminate()


def run_ranks(worker: Callable[..., None], args: tuple, world: int, out: Path, timeout_s: float) -> list[Any]:
    """Spawn ``worker(rank, *args)`` on ``world`` processes, wait at most ``timeout_s`` (``spawned``), and load each
    rank's ``out/rank<r>.pt``."""
    with spawned(worker, args, world, timeout_s):
        pass
    return [torch.load(Path(out) / f"rank{r}.pt", weights_only=False) for r in range(world)]
