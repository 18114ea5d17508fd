"""A process group of the trainer's sending process (rank 0) and K engine processes (ranks 1..K), of their own.

After each RL update the trainer broadcasts the actor's weights to the rollout fleet's engine processes
(``zerotir.fleet.weight_push``) over this group. It must live beside the trainer's default group (Lightning's on a
multi-rank run) without touching it, and its engine processes are no part of the trainer's world.

Why it is built this way (torch 2.13): ``init_process_group`` makes *the* default group (one per process);
``new_group``, ``new_subgroups`` and ``split_group`` only carve groups out of the default world;
``distributed_c10d._new_process_group_helper`` is private and registers the group in torch's global world;
``torch.distributed._dist2.new_group`` is experimental and private, and rendezvous from environment variables only;
wrapping a backend in a ``ProcessGroup`` so that ``dist.broadcast(group=...)`` takes it needs the private
``_register_backend``. What is left, and used here, is the least private: the backend classes
``torch.distributed.ProcessGroupGloo`` and ``ProcessGroupNCCL`` themselves, built from a store, a rank, a size and a
timeout (the same four-argument constructor for both), and their own ``broadcast(tensor, root, timeout)``, whose
``Work.wait(timeout)`` blocks until the collective is done or raises. Nothing is registered in torch's global state,
so no ``dist.*`` call ever sees this group and the default group stays as it was; the price is that
``broadcast_object_list`` does not take it, so a message travels as JSON bytes in a uint8 tensor (``share``). The
store is a ``TCPStore`` that the sender hosts. Gloo runs where the tensors are on the CPU, NCCL where they are on
CUDA, through the same code: only the backend class differs.

Every wait is bounded: joining (``timeout_s`` for all ranks to check in at the store, then an error naming the ranks
that did not) and each collective (``timeout_s``, then an error naming the address, this rank and the side that did
not answer). Closing is ordered: each receiver marks itself gone in the store and shuts its backend down; the sender,
which hosts the store, waits for them and goes last.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

DEFAULT_TIMEOUT_S = 300.0
SENDER = 0


class WeightGroupError(RuntimeError):
    """A weight group did not form, a collective on it failed or timed out, or a push arrived broken; the message
    names the group's address, this rank and who did not answer."""


@dataclass(frozen=True)
class GroupAddress:
    """Where the sender (rank 0) hosts the group's ``TCPStore``; every process of the group is given the same."""

    host: str
    port: int

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"GroupAddress port={self.port}: must be a TCP port, 1..65535")

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


class WeightGroup:
    """This process's member of a weight group (rank 0: the trainer's sender; 1..K: the engine processes).

    Built by ``form_weight_group``. Its collectives run on its own backend object, never on ``torch.distributed``'s
    default group; each waits at most ``timeout_s``.
    """

    def __init__(self, store: dist.Store, backend: Any, address: GroupAddress, rank: int, world_size: int,
                 device: torch.device, timeout_s: float):
        self._store, self._backend = store, backend
        self.address, self.rank, self.world_size = address, rank, world_size
        self.device, self.timeout_s = device, timeout_s
        self.closed = False
        self.interrupted = False  # ``interrupt`` ran: every collective from then on raises

    def __str__(self) -> str:
        return f"weight group at {self.address}, rank {self.rank} of {self.world_size}"

    def _silent_side(self) -> str:
        if self.rank == SENDER:
            return f"a receiver of ranks 1..{self.world_size - 1} did not take part or is gone"
        return f"rank {SENDER} (the trainer's sender) did not send or is gone"

    def broadcast(self, tensor: torch.Tensor, what: str) -> None:
        """Rank 0's ``tensor`` into every rank's ``tensor`` (same size and dtype, on ``device``), in place.

        Raises:
            WeightGroupError: the group is closed, or the broadcast did not complete within ``timeout_s``.
        """
        if self.closed:
            raise WeightGroupError(f"{self}: the group is closed (stop / close ended it); form a new one")
        if self.interrupted:
            raise WeightGroupError(f"{self}: interrupted (a member's process died); form a new group")
        timeout = timedelta(seconds=self.timeout_s)
        try:
            self._backend.broadcast(tensor, SENDER, timeout).wait(timeout)
        except RuntimeError as exc:
            raise WeightGroupError(f"{self}: the broadcast of {what} did not complete within {self.timeout_s:g} s: "
                                   f"{self._silent_side()} ({exc})") from exc

    def share(self, message: dict[str, Any] | None) -> dict[str, Any]:
        """Rank 0's JSON-able ``message`` on every rank: rank 0 passes it, the others pass None."""
        if self.rank == SENDER:
            data = bytearray(json.dumps(message).encode())
            payload = torch.frombuffer(data, dtype=torch.uint8).to(self.device)
            size = torch.tensor([len(data)], dtype=torch.int64, device=self.device)
        else:
            size = torch.zeros(1, dtype=torch.int64, device=self.device)
        self.broadcast(size, "a message's length")
        if self.rank != SENDER:
            payload = torch.empty(int(size.item()), dtype=torch.uint8, device=self.device)
        self.broadcast(payload, "a message")
        return message if self.rank == SENDER else json.loads(payload.cpu().numpy().tobytes())

    def close(self) -> None:
        """Leave the group and shut this process's backend down; idempotent. A receiver marks itself gone; the
        sender first waits (at most ``timeout_s``) until every receiver has, since its store serves them until then.

        Raises:
            WeightGroupError: (the sender) a receiver did not leave in time; the backend is shut down all the same.
        """
        if self.closed:
            return
        self.closed = True
        try:
            if self.rank == SENDER:
                _wait_for_ranks(self._store, "left", range(1, self.world_size), self.timeout_s, f"{self}", "leave")
            else:
                self._store.set(f"left/{self.rank}", "1")
        except WeightGroupError:
            raise
        except RuntimeError as exc:
            raise WeightGroupError(f"{self}: could not tell the sender's store that this rank left ({exc})") from exc
        finally:
            self._backend.shutdown()

    def interrupt(self) -> bool:
        """From another thread, while this process may wait in a collective whose peer died: make that wait raise
        now instead of after ``timeout_s``, and every later collective at once; whether the wait could be cut. An
        NCCL communicator is aborted (``abort``: its pending work raises). Gloo cannot be cut from Python (in torch
        2.13 ``ProcessGroupGloo.abort`` leaves a waiting collective waiting), but a gloo collective raises by
        itself once a peer's process is gone (its TCP connection closes): only a peer that hangs alive waits out
        ``timeout_s`` there. ``abandon`` still drops the group afterwards."""
        if self.closed or self.interrupted:
            return False
        self.interrupted = True
        abort = getattr(self._backend, "abort", None) if self.device.type == "cuda" else None
        if abort is not None:
            abort()
        return abort is not None

    def abandon(self) -> None:
        """Drop this process's backend without the ordered leave of ``close``: the other ranks are gone (their
        processes were killed), so none would ever mark itself gone; idempotent. An NCCL communicator whose peer is
        dead is aborted (``abort``: ``shutdown`` would wait for that peer), a gloo one shut down."""
        if not self.closed:
            self.closed = True
            abort = getattr(self._backend, "abort", None) if self.device.type == "cuda" else None
            if not (abort and self.interrupted):  # an interrupted NCCL communicator is aborted already
                (abort or self._backend.shutdown)()
            self._backend = self._store = None  # the sender's store stops listening: a new group may take its port


def form_weight_group(address: GroupAddress, rank: int, world_size: int, device: str | torch.device = "cpu",
                      timeout_s: float = DEFAULT_TIMEOUT_S, gloo: bool = False) -> WeightGroup:
    """Form the weight group: every process calls this with the same address and world size, each with its rank.

    Rank 0 hosts the ``TCPStore`` at ``address``; each rank checks in there, and once all ``world_size`` ranks have
    (within ``timeout_s`` of the call), the backend connects and a first broadcast checks the group end to end.

    Args:
        address: the sender's host and a free port on it.
        rank: 0 in the trainer's sending process, 1..K in the engine processes.
        world_size: K + 1.
        device: where this process's tensors live: "cpu" forms a gloo group, "cuda" / "cuda:i" an NCCL one.
        timeout_s: the bound on joining and on each collective of the group afterwards.
        gloo: gloo whatever the device: CUDA tensors over gloo (host-staged), as the GPU check runs the fleet's push
            on one GPU, where NCCL refuses two ranks (``scripts/gpu_check_fleet.py``).

    Raises:
        ValueError: a bad rank, world size, timeout or device.
        WeightGroupError: the store could not be hosted or reached, a rank did not join in time (named), the world
            sizes disagree, or two processes took one rank.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank}, world_size={world_size}: need world_size >= 1 (the sender and one rank per "
                         f"engine process) and 0 <= rank < world_size (0 is the sender)")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s={timeout_s}: must be > 0 seconds")
    device, backend_class = _device_and_backend(device)
    backend_class = dist.ProcessGroupGloo if gloo else backend_class
    label = f"weight group at {address}, rank {rank} of {world_size}"
    deadline = time.monotonic() + timeout_s
    store = _open_store(address, rank, timeout_s, label)
    _join(store, rank, world_size, deadline, label)
    try:
        with _errors_raise(device):
            backend = backend_class(dist.PrefixStore("backend", store), rank, world_size, timedelta(seconds=timeout_s))
    except RuntimeError as exc:
        raise WeightGroupError(f"{label}: the {backend_class.__name__} backend did not connect ({exc})") from exc
    group = WeightGroup(store, backend, address, rank, world_size, device, timeout_s)
    group.share({"kind": "hello"} if rank == SENDER else None)  # the group works end to end (NCCL connects here)
    return group


ASYNC_ERRORS = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
CLEAN_UP_ONLY = "2"  # torch's ErrorHandlingMode::CleanUpOnly: abort the communicator, raise in wait(), keep the process


@contextlib.contextmanager
def env_unless_set(name: str, value: str) -> Iterator[None]:
    """The environment variable ``name`` set to ``value`` for the block (a library that reads it while it starts),
    unless the user set it: their value is kept."""
    if name in os.environ:
        yield
        return
    os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name, None)


def _errors_raise(device: torch.device) -> contextlib.AbstractContextManager[None]:
    """While an NCCL backend is built (it reads the setting then): a failed or timed-out collective aborts the
    communicator and raises in ``Work.wait`` instead of torch's default, the watchdog tearing the whole process
    down, so the fleet's restart logic runs. The trainer's own groups keep the default; a value the
    user set is kept. Nothing for gloo."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    return env_unless_set(ASYNC_ERRORS, CLEAN_UP_ONLY)


def _device_and_backend(device: str | torch.device) -> tuple[torch.device, Any]:
    """The device and its backend class: gloo for "cpu", NCCL for "cuda" (this process's current GPU if no index)."""
    device = torch.device(device)
    if device.type == "cpu":
        return device, dist.ProcessGroupGloo
    if device.type == "cuda":
        if not dist.is_nccl_available():
            raise ValueError(f"device={device}: this torch build has no NCCL; use device='cpu' (gloo)")
        index = torch.cuda.current_device() if device.index is None else device.index
        return torch.device("cuda", index), dist.ProcessGroupNCCL
    raise ValueError(f"device={device}: a weight group runs on 'cpu' (gloo) or 'cuda' (NCCL)")


def _open_store(address: GroupAddress, rank: int, timeout_s: float, label: str) -> dist.TCPStore:
    """Rank 0 hosts the store at ``address``; the others connect to it, retrying for at most ``timeout_s``."""
    try:
        return dist.TCPStore(address.host, address.port, world_size=None, is_master=rank == SENDER,
                             timeout=timedelta(seconds=timeout_s), wait_for_workers=False)
    except RuntimeError as exc:
        if rank == SENDER:
            raise WeightGroupError(f"{label}: could not host the group's store on port {address.port}; pick a free "
                                   f"port ({exc})") from exc
        raise WeightGroupError(f"{label}: rank {SENDER} (the trainer's sender) did not answer at {address} within "
                               f"{timeout_s:g} s; start it with this address ({exc})") from exc


def _join(store: dist.TCPStore, rank: int, world_size: int, deadline: float, label: str) -> None:
    """Check in as ``rank`` and wait until every rank has, by ``deadline``; the world sizes must agree."""
    try:
        if rank == SENDER:
            store.set("world_size", str(world_size))
        else:
            store.set_timeout(timedelta(seconds=max(deadline - time.monotonic(), 0.001)))
            hosted = int(store.get("world_size"))
            if hosted != world_size:
                raise WeightGroupError(f"{label}: rank {SENDER} formed the group with world_size={hosted}; every "
                                       f"process needs the same world_size (1 sender + the engine processes)")
        if store.add(f"joined/{rank}", 1) > 1:
            raise WeightGroupError(f"{label}: another process already joined as rank {rank}; give each engine "
                                   f"process its own rank, 1..{world_size - 1}")
    except WeightGroupError:
        raise
    except RuntimeError as exc:
        raise WeightGroupError(f"{label}: the group's store stopped answering while joining ({exc})") from exc
    _wait_for_ranks(store, "joined", range(world_size), deadline - time.monotonic(), label, "join")


def _wait_for_ranks(store: dist.Store, key: str, ranks: range, seconds: float, label: str, doing: str) -> None:
    """Wait at most ``seconds`` until every rank of ``ranks`` has set ``key/<rank>``; raise naming those that did
    not."""
    keys = [f"{key}/{r}" for r in ranks]
    if not keys:
        return
    try:
        store.wait(keys, timedelta(seconds=max(seconds, 0.001)))
    except RuntimeError as exc:
        missing = [r for r in ranks if not store.check([f"{key}/{r}"])]
        raise WeightGroupError(f"{label}: rank(s) {missing} did not {doing} within {seconds:g} s; start each engine "
                               f"process with this address and its rank ({exc})") from exc


def free_port(host: str) -> int:
    """A TCP port free on ``host`` now (a weight group's store binds it right after)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
