"""How the fleet reaches its engine hosts: one interface over the two transports an ``EngineHost`` runs under.

- ``RayTransport``: each host a Ray actor, a process of its own (``zerotir.fleet.cluster``), its weights pushed
  over the weight group (``zerotir.fleet.weights``); ``model.hosts.engines`` >= 1.
- ``ThreadTransport`` (``zerotir.fleet.thread_host``): one host in a thread of the trainer's process, its weights
  copied from the actor between two of its engine steps; ``model.hosts`` without ``model.hosts.engines``.

Either way a host's rollouts are calls, ``transport.roll_out(handle, calls)`` (Ray actor methods, or futures of the
thread host's): the jobs of the calls made together queued at once, in the order the calls were made, so the
source, its schedule and its recovery are one code path (``zerotir.fleet.source``); the transport answers what
differs: starting the hosts, waiting on their calls and ending them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from zerotir.config import HostsConfig, SandboxConfig, ToolConfig
from zerotir.fleet.cores import available_cores, plan_cores
from zerotir.fleet.engine_host import HostSettings
from zerotir.fleet.ranks import TrainerRanks
from zerotir.fleet.weights import FleetWeights


class Transport(Protocol):
    """What the fleet's source, hosts and schedule ask of a transport; a call's reference is whatever ``.remote``
    returned."""

    timeout_setting: str  # the setting that bounds every wait, named by a timeout
    trainer_sandbox: list[str] | None  # after ``up``: the sandbox it started for the trainer (None: none)

    def check_trainer(self, world_size: int, zero3: bool) -> None:
        """Refuse a trainer the transport cannot serve, naming the fix."""
        ...

    def settings(self, settings: HostSettings, trainer_device: Any) -> HostSettings:
        """The hosts' settings as this transport runs them (device, threads, a process of their own)."""
        ...

    def plan(self, fleet: HostsConfig, world: int) -> tuple[Any, Callable[[], Callable[[], None]], str]:
        """The cores of each host (None: the OS places them), what sets the trainer's once the hosts run
        (returning what puts them back), and the plan in words."""
        ...

    def weights(self, fleet: HostsConfig, ranks: TrainerRanks) -> Any:
        """How the hosts get each update's weights (``FleetWeights``: form, push, last, close)."""
        ...

    def up(self, fleet: HostsConfig, sandbox: SandboxConfig, tool: ToolConfig) -> None:
        """Whatever the hosts run on (a Ray cluster, and a sandbox server on each of its nodes where
        ``HostsConfig.sandbox_on_each_node``; nothing for threads)."""
        ...

    def down(self) -> None:
        ...

    def spawn(self, fleet: HostsConfig, settings: HostSettings, cores: tuple[tuple[int, ...], ...] | None) -> list[Any]:
        """The hosts' handles, in engine order."""
        ...

    def roll_out(self, host: Any, calls: list[tuple]) -> list[Any]:
        """The rollout ``calls`` (each the arguments of ``EngineHost.roll_out``) on ``host``, queued together; a
        reference per call. The jobs reach the host's stream in the order the calls were made, so its groups
        start oldest first, as the schedule submitted them."""
        ...

    def get(self, refs: list[Any], timeout_s: float, doing: str, engines: list[int] | None = None) -> list[Any]:
        """The results of ``refs`` within ``timeout_s``; a failure names the engine and what it was ``doing``
        (``cluster.EngineDied`` for a process that died)."""
        ...

    def ready(self, refs: list[Any], timeout_s: float) -> list[int]:
        """The indices of ``refs`` that have ended, waiting up to ``timeout_s`` for the first."""
        ...

    def describe(self, hosts: list[Any], timeout_s: float, doing: str, wait: bool = False) -> list[dict[str, Any]]:
        ...

    def occupancy(self, hosts: list[Any], timeout_s: float, before: dict[str, float]) -> dict[str, float]:
        ...

    def kill(self, hosts: list[Any]) -> None:
        ...


class RayTransport:
    """The hosts as Ray actors (``zerotir.fleet.cluster``; Ray imported there, inside each function)."""

    timeout_setting = "model.hosts.timeout_s"

    def __init__(self) -> None:
        self.sandboxes: Any = None  # zerotir.fleet.sandboxes.NodeSandboxes, while they run

    @property
    def trainer_sandbox(self) -> list[str] | None:
        """The trainer's node's server, where ``up`` started one on each node."""
        return self.sandboxes.trainer_urls if self.sandboxes is not None else None

    def check_trainer(self, world_size: int, zero3: bool) -> None:
        """Any trainer: rank 0 drives the fleet for every rank, the engines have weights of their own."""

    def settings(self, settings: HostSettings, trainer_device: Any) -> HostSettings:
        return settings

    def plan(self, fleet: HostsConfig, world: int) -> tuple[Any, Callable[[], Callable[[], None]], str]:
        """The thread budget (``zerotir.fleet.cores``): engines pinned to cores of their own where it fits, the
        trainer's threads and cores set (one training process: several share the node's cores as their launcher
        placed them) until ``close`` puts them back."""
        budget = plan_cores(fleet, available_cores(), fleet.address is None and world == 1)
        apply = budget.apply_to_trainer if world == 1 else lambda: (lambda: None)
        return budget.engine_cores, apply, budget.describe()

    def weights(self, fleet: HostsConfig, ranks: TrainerRanks) -> FleetWeights:
        return FleetWeights(fleet, ranks)

    def up(self, fleet: HostsConfig, sandbox: SandboxConfig, tool: ToolConfig) -> None:
        from zerotir.fleet.cluster import fleet_cluster, stop_cluster
        from zerotir.fleet.sandboxes import NodeSandboxes

        fleet_cluster(fleet, sandbox, tool)
        if fleet.sandbox_on_each_node(sandbox, tool):
            try:
                self.sandboxes = NodeSandboxes.start(fleet, sandbox)
            except BaseException:
                stop_cluster()
                raise

    def down(self) -> None:
        from zerotir.fleet.cluster import stop_cluster

        sandboxes, self.sandboxes = self.sandboxes, None
        try:
            if sandboxes is not None:
                sandboxes.close()
        finally:
            stop_cluster()

    def spawn(self, fleet: HostsConfig, settings: HostSettings, cores: tuple[tuple[int, ...], ...] | None) -> list[Any]:
        from zerotir.fleet.cluster import spawn_hosts

        return spawn_hosts(fleet.engines, settings, fleet.cpus_per_engine, fleet.gpus_per_engine, fleet.max_restarts,
                           cores, self.sandboxes)

    def roll_out(self, host: Any, calls: list[tuple]) -> list[Any]:
        """The calls' jobs queued by one call in the host's ordered group (``cluster.QUEUE``: Ray runs a group of one
        in submission order), each call collected by a call that waits for it in its rollouts group (side by
        side)."""
        queued = host.queue.remote(calls)
        return [host.collect.remote(queued, i) for i in range(len(calls))]

    def get(self, refs: list[Any], timeout_s: float, doing: str, engines: list[int] | None = None) -> list[Any]:
        from zerotir.fleet.cluster import ray_get

        return ray_get(refs, timeout_s, doing, engines)

    def ready(self, refs: list[Any], timeout_s: float) -> list[int]:
        from zerotir.fleet.cluster import ray_ready

        return ray_ready(refs, timeout_s)

    def describe(self, hosts: list[Any], timeout_s: float, doing: str, wait: bool = False) -> list[dict[str, Any]]:
        from zerotir.fleet.cluster import describe_hosts

        return describe_hosts(hosts, timeout_s, doing, wait)

    def occupancy(self, hosts: list[Any], timeout_s: float, before: dict[str, float]) -> dict[str, float]:
        from zerotir.fleet.cluster import mean_occupancy

        return mean_occupancy(hosts, timeout_s, before)

    def kill(self, hosts: list[Any]) -> None:
        from zerotir.fleet.cluster import kill_hosts

        kill_hosts(hosts)
