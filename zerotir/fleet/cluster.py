"""The fleet's Ray cluster: start a local one (or join a running one) and spawn the engine hosts as Ray actors.

    start_cluster(num_cpus=4)                     # a local cluster on this machine: no dashboard, quiet logs
    start_cluster(address="10.0.0.1:6379")        # or join one started with `ray start --head`
    hosts = spawn_hosts(2, settings, num_cpus=1, num_gpus=1)   # Ray actor handles of EngineHost
    ray.get([h.join_weights.remote(address, r + 1, 3, 60.0) for r, h in enumerate(hosts)], timeout=...)
    stop_cluster()

Each actor is one process running one ``EngineHost`` (``zerotir.fleet.engine_host``), built from the same picklable
``HostSettings``; Ray gives it the CPUs and GPUs asked for (a GPU actor sees its GPU as ``cuda``). Its rollout and
weight calls run one at a time, in the order they were called; its questions (``describe``, ``occupancy``) are
answered at once, in a concurrency group of their own, so the trainer never waits for one queued behind a rollout.
Ray is an optional extra (``pip install -e ".[fleet]"``) and is imported only inside these functions.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from zerotir.config import HostsConfig, SandboxConfig, ToolConfig
from zerotir.fleet.engine_host import EngineHost, HostSettings, JobsLost, combine_occupancy
from zerotir.fleet.sandboxes import NodeSandboxes
from zerotir.fleet.weight_group import WeightGroup, env_unless_set

log = logging.getLogger(__name__)

NICENESS = "RAY_worker_niceness"  # Ray's setting of its workers' niceness, read by the raylet at its start
# The SIGTERM handler before ray.init replaced it with its own (sys.exit), put back by stop_cluster.
_SIGTERM_BEFORE: list[Any] = []


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError('the rollout fleet runs on Ray, which is not installed: pip install -e ".[fleet]"') from exc
    return ray


def start_cluster(num_cpus: int | None = None, num_gpus: int | None = None, address: str | None = None,
                  object_store_memory: int | None = None) -> None:
    """Start a local Ray cluster with ``num_cpus`` / ``num_gpus`` (None: what the machine has), or join the running
    one at ``address`` (its resources are its own: then give neither). No dashboard; Ray's logs at warnings only.

    Without ``address`` the cluster is always a new one of this run: ``ray.init()`` alone would join whatever cluster
    ``RAY_ADDRESS`` or the last ``ray start`` on this machine names (another user's, another run's), with its
    resources and its failures; joining one is what ``model.hosts.address`` says.

    A local cluster's workers run at the trainer's priority: Ray starts its workers at niceness 15 by default
    (``RAY_worker_niceness``), where every busy process of normal priority starves them (an engine host's import
    and start took tens of times longer beside a CPU-bound job). A value the user set in the environment is kept;
    the nodes of a running cluster take theirs from where ``ray start`` ran.

    Raises:
        RuntimeError: Ray is already started in this process (``stop_cluster`` first).
        ValueError: resources given together with an address.
        ConnectionError: nothing answers at ``address`` (checked first, within ``REACH_TIMEOUT_S``: Ray itself
            waits minutes for an address that does not answer), or Ray found no cluster there.
    """
    ray = _ray()
    if ray.is_initialized():
        raise RuntimeError("start_cluster: Ray is already started in this process; stop_cluster() first")
    if threading.current_thread() is threading.main_thread():
        _SIGTERM_BEFORE[:] = [signal.getsignal(signal.SIGTERM)]
    quiet = {"include_dashboard": False, "logging_level": logging.WARNING, "log_to_driver": False}
    if address is not None:
        if (num_cpus, num_gpus, object_store_memory) != (None, None, None):
            raise ValueError(f"start_cluster(address={address!r}): a running cluster has its own resources; drop "
                             "num_cpus / num_gpus / object_store_memory, or leave address unset for a local cluster")
        _check_reachable(address)
        try:
            ray.init(address=address, **quiet)
        except ConnectionError as exc:
            raise ConnectionError(f"model.hosts.address={address!r}: no Ray cluster there ({exc}); start one with "
                                  "`ray start --head` on that node, or set model.hosts.address: null (a local "
                                  "cluster)") from exc
        return
    for name, value in (("num_cpus", num_cpus), ("num_gpus", num_gpus)):
        if value is not None and value < 0:
            raise ValueError(f"start_cluster({name}={value}): must be >= 0, or None for what the machine has")
    with env_unless_set(NICENESS, "0"):  # "local": a new cluster, never one RAY_ADDRESS or `ray start` left here
        ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus, object_store_memory=object_store_memory,
                 **quiet)


REACH_TIMEOUT_S = 10.0  # how long a cluster's head may take to accept a connection


def _check_reachable(address: str) -> None:
    """A ``host:port`` address must accept a TCP connection within ``REACH_TIMEOUT_S``; "auto" and client
    addresses (``ray://``) are left to Ray, which answers those at once."""
    host, _, port = address.rpartition(":")
    if not host or "://" in address or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=REACH_TIMEOUT_S).close()
    except OSError as exc:
        raise ConnectionError(f"model.hosts.address={address!r}: nothing answers at {host}:{port} within "
                              f"{REACH_TIMEOUT_S:g} s ({exc}); start the cluster's head there (`ray start --head "
                              f"--port {port}`), or set model.hosts.address: null (a local cluster)") from exc


def spawn_hosts(count: int, settings: HostSettings, num_cpus: float = 1, num_gpus: float = 0,
                max_restarts: int = 0, cores: tuple[tuple[int, ...], ...] | None = None,
                placed: NodeSandboxes | None = None) -> list[Any]:
    """``count`` Ray actors, each an ``EngineHost(settings)`` with ``num_cpus`` CPUs and ``num_gpus`` GPUs (and,
    given ``cores``, pinned to ``cores[k]``: ``zerotir.fleet.cores``; given ``placed``, started in bundle k of its
    placement with its node's sandbox URL: ``zerotir.fleet.sandboxes``); their handles. An actor starts in the
    background: its first method call waits for it (and raises its start error).
    Ray restarts an actor whose process dies up to ``max_restarts`` times (building a new ``EngineHost``); the calls
    it held fail (``EngineDied``) and are never retried by Ray: the caller decides what to run again.

    A host takes calls side by side: the rollout calls of several batches feed its stream together (which admits
    them by ``settings.max_in_flight``; with 0, whole shares one at a time), each call's jobs queued by a call in a
    group of one (``QUEUE``), so they reach the stream in the order the trainer made them and the oldest groups
    start first, then collected in the rollouts group, and a push (``receive_weights``) runs while they wait. Its
    weight-group calls (join, leave, receive) stay one at a time, in the order they were made (a group of one). Every
    host answers ``describe`` and ``occupancy`` in a group of their own (``QUESTIONS``): on a plain actor the
    trainer's question after taking batch k would queue behind the rollout of batch k + 1 (S >= 1), and step k
    would train only once batch k + 1 was generated.

    Raises:
        RuntimeError: no cluster (``start_cluster`` first).
        ValueError: a bad count or resource.
    """
    ray = _ray()
    if not ray.is_initialized():
        raise RuntimeError("spawn_hosts: no Ray cluster in this process; call start_cluster() first")
    if count < 1:
        raise ValueError(f"spawn_hosts(count={count}): the fleet needs at least one engine host")
    if cores is not None and len(cores) != count:
        raise ValueError(f"spawn_hosts(count={count}): {len(cores)} core sets given; one per host")
    if num_cpus < 0 or num_gpus < 0:
        raise ValueError(f"spawn_hosts(num_cpus={num_cpus}, num_gpus={num_gpus}): resources must be >= 0")
    options = {"num_cpus": num_cpus, "num_gpus": num_gpus, "max_restarts": max_restarts, "max_task_retries": 0}
    groups = {**STREAMING_GROUPS, QUESTIONS: 1, QUEUE: 1}
    actor = ray.remote(**options, concurrency_groups=groups)(_streaming_host(ray))
    if placed is None:
        return [actor.remote(replace(settings, cores=cores[k] if cores else None)) for k in range(count)]
    return [actor.options(scheduling_strategy=placed.strategy(k)).remote(
        replace(settings, cores=cores[k] if cores else None, sandbox_urls=placed.urls_of(k))) for k in range(count)]


# A host's concurrency groups: its weight-group calls one at a time, its rollout calls side by side (more than the
# batches the capacity rule ever lets run at once).
STREAMING_GROUPS = {"weights": 1, "rollouts": 64}
QUESTIONS = "questions"  # every host's group of the calls answered at once: describe, occupancy
QUEUE = "queue"  # every host's group of one that queues the jobs of its rollout calls, in the order they were made


def _answering_host(ray: Any) -> type:
    """``EngineHost`` whose questions (``describe``, ``occupancy``) run in the ``QUESTIONS`` group, beside the calls
    of the other groups; they only read counters."""

    class AnsweringEngineHost(EngineHost):
        @ray.method(concurrency_group=QUESTIONS)
        def describe(self) -> dict[str, Any]:
            return super().describe()

        @ray.method(concurrency_group=QUESTIONS)
        def occupancy(self) -> dict[str, float]:
            return super().occupancy()

    return AnsweringEngineHost


def _streaming_host(ray: Any) -> type:
    """``EngineHost`` with its methods in the host's concurrency groups (Ray's ``ray.method``)."""

    class StreamingEngineHost(_answering_host(ray)):
        @ray.method(concurrency_group="weights")
        def join_weights(self, *args: Any, **kwargs: Any) -> None:
            return super().join_weights(*args, **kwargs)

        @ray.method(concurrency_group="weights")
        def receive_weights(self) -> int | None:
            return super().receive_weights()

        @ray.method(concurrency_group="weights")
        def leave_weights(self) -> None:
            return super().leave_weights()

        @ray.method(concurrency_group="rollouts")
        def roll_out(self, *args: Any, **kwargs: Any) -> Any:
            return super().roll_out(*args, **kwargs)

        @ray.method(concurrency_group=QUEUE)
        def queue(self, *args: Any, **kwargs: Any) -> Any:
            return super().queue(*args, **kwargs)

        @ray.method(concurrency_group="rollouts")
        def collect(self, *args: Any, **kwargs: Any) -> Any:
            return super().collect(*args, **kwargs)

    return StreamingEngineHost


def fleet_cluster(fleet: HostsConfig, sandbox: SandboxConfig, tool: ToolConfig) -> None:
    """The cluster of ``model.hosts``: a local one of engines x cpus_per_engine CPUs and engines x gpus_per_engine
    GPUs, or the one at ``fleet.address``, joined and checked (``HostsConfig.check_sandbox_reach``: an embedded
    sandbox serves the trainer's node only), and left again when the check fails."""
    if fleet.address is None:
        start_cluster(num_cpus=math.ceil(fleet.engines * fleet.cpus_per_engine),
                      num_gpus=math.ceil(fleet.engines * fleet.gpus_per_engine))
        return
    start_cluster(address=fleet.address)
    try:
        fleet.check_sandbox_reach(sandbox, tool, other_nodes())
    except ValueError:
        stop_cluster()
        raise


def other_nodes() -> list[str]:
    """The addresses of the alive nodes of this process's cluster other than its own (a local cluster: none)."""
    ray = _ray()
    mine = ray.get_runtime_context().get_node_id()
    return [n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != mine]


def stop_cluster() -> None:
    """Shut this process's Ray down (a local cluster stops with it, its actors too) and put back the SIGTERM handler
    ``ray.init`` replaced (a trainer's, Lightning's); nothing if none runs."""
    ray = _ray()
    if ray.is_initialized():
        ray.shutdown()
    if _SIGTERM_BEFORE and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _SIGTERM_BEFORE.pop())


class EngineDied(RuntimeError):
    """An engine process of the fleet died (its calls in flight are lost); ``engine`` is its index in the list,
    ``restarting`` whether Ray is restarting it (a call after that may succeed) or gave it up."""

    def __init__(self, engine: int, message: str, restarting: bool):
        super().__init__(message)
        self.engine, self.restarting = engine, restarting


def ray_get(refs: list[Any], timeout_s: float, doing: str, engines: list[int] | None = None) -> list[Any]:
    """The results of ``refs`` (one per engine process, in order; ``engines``: their indices, default 0, 1, ...),
    all within ``timeout_s`` seconds; a failure names the engine and what it was ``doing``. Taken as they end, so
    the first failure raises at once, whichever engine it is (a live one still waiting does not hide a dead one).

    Raises:
        TimeoutError: an engine had not finished within ``timeout_s`` (``model.hosts.timeout_s``).
        EngineDied: an engine's process died.
        RuntimeError: an engine's call raised (its error in the message).
    """
    ray = _ray()
    names = engines if engines is not None else list(range(len(refs)))
    deadline, out, left = time.monotonic() + timeout_s, [None] * len(refs), list(range(len(refs)))
    while left:
        ready, _ = ray.wait([refs[i] for i in left], num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
        if not ready:
            raise TimeoutError(f"engine process {names[left[0]]} of the fleet did not finish {doing} within "
                               f"{timeout_s:g} s (model.hosts.timeout_s)")
        done = set(ready)  # ObjectRefs hash and compare by the object's id
        for i in [i for i in left if refs[i] in done]:
            out[i] = _result(refs[i], names[i], doing)
        left = [i for i in left if refs[i] not in done]
    return out


def _result(ref: Any, k: int, doing: str) -> Any:
    """The result of engine ``k``'s call ``ref``, which has ended; its failure as ``ray_get`` raises it."""
    from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError

    try:
        return _ray().get(ref, timeout=0)
    except RayActorError as exc:
        raise EngineDied(k, f"engine process {k} of the fleet died while {doing}: {exc}",
                         isinstance(exc, ActorUnavailableError)) from exc
    except RayTaskError as exc:
        cause = exc.cause if exc.cause is not None else exc
        if isinstance(cause, JobsLost):  # the process that queued them died; Ray restarted the actor
            raise EngineDied(k, f"engine process {k} of the fleet died while {doing}: {cause}", True) from exc
        raise RuntimeError(f"engine process {k} of the fleet failed while {doing}: {type(cause).__name__}: "
                           f"{cause}") from exc


@contextlib.contextmanager
def watch_push(received: list[Any], group: WeightGroup) -> Iterator[None]:
    """While this thread pushes over ``group``: a thread waits on the engines' ``receive_weights`` calls
    (``received``), and the first that ends in an error (its engine died, or its receive failed) interrupts the
    group (``WeightGroup.interrupt``), so that the push raises now instead of waiting out ``model.hosts.timeout_s``
    for a peer that is gone (an NCCL collective waits that long). The push's caller recovers."""
    ray, stop = _ray(), threading.Event()

    def watch() -> None:
        left = list(received)
        while left and not stop.is_set():
            ready, left = ray.wait(left, num_returns=1, timeout=WATCH_POLL_S)
            for ref in ready:
                try:
                    ray.get(ref, timeout=0)
                except Exception:  # noqa: BLE001 - any failed receive leaves the sender's collective hanging
                    if group.interrupt():
                        log.warning("weight push: an engine's receive failed; the %s is interrupted", group)
                    return

    watcher = threading.Thread(target=watch, name="zerotir-fleet-push-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()


WATCH_POLL_S = 0.5  # how often the push's watcher looks whether the push has ended (it stops then)


def ray_ready(refs: list[Any], timeout_s: float) -> list[int]:
    """The indices of ``refs`` whose calls have ended (returned, raised or died), waiting up to ``timeout_s`` for
    the first of them; [] if none ended in time. ``ray_get`` then gives each one's result or error."""
    if not refs:
        return []
    ready, _ = _ray().wait(refs, num_returns=1, timeout=max(0.0, timeout_s))
    if ready:  # and every other one that has ended by now
        ready, _ = _ray().wait(refs, num_returns=len(refs), timeout=0)
    done = set(ready)  # ObjectRefs hash and compare by the object's id
    return [k for k, ref in enumerate(refs) if ref in done]


def mean_occupancy(hosts: list[Any], timeout_s: float, before: dict[str, float]) -> dict[str, float]:
    """``EngineHost.occupancy`` of every host as ``fleet_<key>`` (``combine_occupancy``: shares of time averaged,
    counts added up); ``before`` (the figures of the last call) when a host died: it is recovered where its batches
    are collected.

    Raises:
        TimeoutError, RuntimeError: as ``ray_get``.
    """
    try:
        each = ray_get([h.occupancy.remote() for h in hosts], timeout_s, "reporting its occupancy")
    except EngineDied:
        return before
    return combine_occupancy(each)


def describe_hosts(hosts: list[Any], timeout_s: float, doing: str, wait: bool = False) -> list[dict[str, Any]]:
    """Every host's ``describe()`` (engine, node, pid); ``wait``: once it answers, Ray refusing calls while it
    restarts one (bounded by ``timeout_s``).

    Raises:
        EngineDied: a host died (``wait``: and Ray gave it up, or it was not back within ``timeout_s``).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return ray_get([h.describe.remote() for h in hosts], timeout_s, doing)
        except EngineDied as died:
            if not wait or not died.restarting or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def kill_hosts(hosts: list[Any]) -> None:
    """End the engine processes now (a call in flight is dropped); Ray does not restart a killed actor."""
    ray = _ray()
    for host in hosts:
        ray.kill(host, no_restart=True)
