"""Multi-process test plumbing: N gloo ranks (new processes) whose results are read back, a rank's side of that
(its group, its saved result), and one DeepSpeed rank."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from tests.ports import free_port


# The workers fork from multiprocessing's fork server, one fresh single-threaded interpreter that imported torch and
# transformers once for the whole session, instead of each spawned process importing them again (most of a spawn's
# seconds: the workers' modules import transformers through zerotir).
mp.set_forkserver_preload(["torch", "torch.distributed", "transformers", "transformers.modeling_utils"])


def _as_the_caller(rank: int, env: dict[str, str], cwd: str, worker: Callable[..., None], *args: Any) -> None:
    """``worker(rank, *args)`` with the caller's environment and working directory (the fork server has the ones of
    the moment it started)."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    worker(rank, *args)


@contextlib.contextmanager
def spawned(worker: Callable[..., None], args: tuple, world: int, timeout_s: float) -> Iterator[None]:
    """``worker(rank, *args)`` on ``world`` new processes (forked from the fork server) while the block runs (this
    process's part of their work); after it, wait at most ``timeout_s`` for them (a rank's exception is raised with
    its traceback). Any process still alive at the end, or when the block raises, is stopped."""
    ctx = mp.start_processes(_as_the_caller, args=(dict(os.environ), os.getcwd(), worker, *args), nprocs=world,
                             join=False, start_method="forkserver")
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
    rank's ``out/rank<r>.pt`` (``save_rank``)."""
    with spawned(worker, args, world, timeout_s):
        pass
    return [torch.load(Path(out) / f"rank{r}.pt", weights_only=False) for r in range(world)]


@contextlib.contextmanager
def gloo_group(rank: int, world: int, port: int, timeout_s: float = 60.0) -> Iterator[None]:
    """In a spawned worker: this process as ``rank`` of a ``world``-rank gloo group on ``127.0.0.1:port`` while the
    block runs (a collective waits at most ``timeout_s``); the group is destroyed after it, also when it raises."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    try:
        yield
    finally:
        dist.destroy_process_group()


def save_rank(result: Any, out_dir: str | Path, rank: int) -> None:
    """In a spawned worker: ``result`` as ``out_dir/rank<rank>.pt``, where ``run_ranks`` reads it back."""
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")


@contextlib.contextmanager
def one_deepspeed_rank(model: torch.nn.Module, optimizer: torch.optim.Optimizer, config: dict) -> Iterator[Any]:
    """A DeepSpeed engine of ``model`` on this process as rank 0 of 1 (gloo, loopback), yielded while the block
    runs: DeepSpeed reads ``LOCAL_RANK`` again on every ZeRO-3 gather, so the rank's variables stay set until the
    block ends. The process group outlives the block (DeepSpeed initializes it once per process)."""
    import importlib

    import deepspeed
    import pytest

    ds_torch_comm = importlib.import_module("deepspeed.comm.torch")  # `from deepspeed.comm import torch` is torch
    with pytest.MonkeyPatch.context() as mp:
        for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0",
                           "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
            mp.setenv(key, value)
        # DeepSpeed JIT-compiles a shared-memory allreduce op at init on CPU (minutes on a small machine, once
        # per cache); one rank never uses it, so the build is skipped. See docs/vllm.md.
        mp.setattr(ds_torch_comm, "build_shm_op", lambda: None)
        deepspeed.init_distributed(dist_backend="gloo")
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
        yield engine
