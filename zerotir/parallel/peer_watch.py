"""``PeerWatch``: stop this rank, naming the peer, when another rank's process on the same machine is gone.

A rank killed outright (SIGKILL, the OOM killer) raises nothing anywhere: the others go on until their next
collective and then wait in it, for the process group's timeout (30 minutes by default) or for ever inside a
vLLM / sandbox call that never reaches a collective. Lightning's own launcher watches only the processes it started
(rank 0 watches its children; a rank 0 that dies leaves the others orphaned). ``PeerWatch`` closes that gap: when
the process group is up, every rank shares its ``(host, pid)`` (``all_gather_object``), and a daemon thread checks
once per ``interval`` seconds that every peer on the same host still runs. When one is gone it writes
``rank R: lost peer rank P (pid N on H) ...`` to stderr, runs ``on_lost`` (the module closes its sandbox and engine)
and ends this process with exit code 1: the main thread may be blocked inside a collective, where no exception can
reach it. Peers on other hosts are left to the multi-node launcher (torchrun / SLURM stop the job when a rank dies).

``CloseOnException``: the other exit no step sees, an exception out of fit, validate or test (Lightning then calls
no teardown): the module's parts released all the same.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

from lightning.pytorch.callbacks import Callback

LOST_PEER_EXIT_CODE = 1


def alive(pid: int) -> bool:
    """True while process ``pid`` exists and is not a zombie (a killed child not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


class PeerWatch:
    """Watch the other ranks' processes on this host (see the module docstring).

    Args:
        rank: this process's global rank.
        peers: ``(host, pid)`` of every rank, indexed by rank (``all_gather_object`` of ``identity()``).
        on_lost: called once before this process exits when a peer is gone (errors in it are ignored).
        interval: seconds between two checks.
        close_timeout: seconds ``on_lost`` may take before the process ends regardless.
        exit: how the process ends (``os._exit``; a test passes its own).
    """

    def __init__(self, rank: int, peers: list[tuple[str, int]], on_lost: Callable[[], None] | None = None,
                 interval: float = 1.0, close_timeout: float = 10.0, exit: Callable[[int], None] = os._exit) -> None:
        host = socket.gethostname()
        self.rank, self.on_lost, self.interval, self._exit = rank, on_lost, interval, exit
        self.close_timeout = close_timeout
        self.watched = {r: pid for r, (h, pid) in enumerate(peers) if r != rank and h == host}
        self.host = host
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def identity() -> tuple[str, int]:
        return socket.gethostname(), os.getpid()

    @classmethod
    def start_for_world(cls, on_lost: Callable[[], None] | None = None, interval: float = 1.0) -> PeerWatch | None:
        """Gather every rank's identity (a collective: call it on every rank) and start watching; None without
        a process group of more than one rank."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return None
        peers: list = [None] * dist.get_world_size()
        dist.all_gather_object(peers, cls.identity())
        watch = cls(dist.get_rank(), peers, on_lost, interval)
        watch.start()
        return watch

    def lost(self) -> list[int]:
        """The watched ranks whose process is gone."""
        return [r for r, pid in self.watched.items() if not alive(pid)]

    def start(self) -> None:
        if self.watched and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="zerotir-peer-watch", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop watching (the run ends normally: peers may now exit before this rank)."""
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            gone = self.lost()
            if gone and not self._stop.is_set():
                self._fail(gone)
                return

    def _fail(self, gone: list[int]) -> None:
        names = ", ".join(f"rank {r} (pid {self.watched[r]} on {self.host})" for r in gone)
        print(f"rank {self.rank}: lost peer {names}: its process is gone (killed?); stopping this rank instead of "
              "waiting in the next collective. Resume with --ckpt_path last.", file=sys.stderr, flush=True)
        if self.on_lost is not None:  # in a thread of its own: a close that hangs must not keep the process
            closer = threading.Thread(target=self._close, name="zerotir-peer-watch-close", daemon=True)
            closer.start()
            closer.join(self.close_timeout)
        self._exit(LOST_PEER_EXIT_CODE)

    def _close(self) -> None:
        try:
            self.on_lost()
        except Exception as exc:  # the process ends anyway; say what did not close
            print(f"rank {self.rank}: closing after the lost peer failed: {exc!r}", file=sys.stderr, flush=True)


class WatchPeers(Callback):
    """A ``PeerWatch`` for the length of ``fit`` on several ranks (added by ``ZeroTIRModule.configure_callbacks``):
    started when fitting starts, stopped when training ends, on an exception (each rank then stops on its own
    error, ``zerotir.parallel.distributed.fail_together``) and at teardown. A lost peer runs ``on_lost`` (the module's
    rollout source's ``close``: its sandbox and engine) before the process ends.

    Args:
        on_lost: what to stop before the process exits; None: nothing.
    """

    def __init__(self, on_lost: Callable[[], None] | None = None) -> None:
        self.on_lost = on_lost
        self.watch: PeerWatch | None = None

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self.watch = PeerWatch.start_for_world(on_lost=self.on_lost)

    def _stop(self) -> None:
        if self.watch is not None:
            self.watch.stop()
            self.watch = None

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._stop()  # the ranks now finish, and exit, at their own pace

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._stop()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._stop()


class CloseOnException(Callback):
    """Runs ``close`` (the module releasing the run's parts: sandbox, engine, reward, MCP connections) when fit,
    validate or test raises (a NaN loss, a dead sandbox...): Lightning calls no teardown then. The other way a run's
    parts must be stopped from outside the step, beside ``WatchPeers``."""

    def __init__(self, close: Callable[[], Any]) -> None:
        self.close = close

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.close()
