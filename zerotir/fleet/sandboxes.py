"""One sandbox server per node of the fleet, placed and watched through Ray (``model.hosts.sandbox_per_node``).

On a cluster of several nodes the trainer's embedded sandbox (127.0.0.1 of its node) serves no engine elsewhere,
and one shared server would carry every node's code over the network. So each node that hosts engines, and the
trainer's node, runs a server of its own:

- **placement**: the engines' resources are reserved first, as one Ray placement group of a bundle per engine, so
  the node of every engine is known before it starts; a server is then started on each of those nodes and on the
  trainer's, each by a ``NodeSandbox`` actor pinned there (``NodeAffinitySchedulingStrategy``, no CPU of its own:
  the engines' cores stay theirs), and engine k starts in bundle k with its node's URL as its only sandbox URL.
  A restarted engine comes back in its bundle, on its node, with the same URL.
- **address**: the actor binds a listening socket on its node's IP (``ray.util.get_node_ip_address``: the one
  Ray's nodes reach each other at) and hands it to the server (``sandbox.local.start_server``).
- **uids**: each server reserves a free block of snippet uids on its host (``sandbox.uids``), so two servers on one
  host never share a process budget.
- **watch**: a thread of the actor waits on its server; one that exits (killed, out of memory) is started again on
  the same socket, so its URL does not change, and requests made meanwhile wait in the socket's backlog. A request
  in flight on the dead server fails at its client: retried where the client retries (connection lost), else a
  ``SANDBOX_ERROR``, which marks the trajectory an infrastructure failure (never the model's error) and keeps it
  out of the gradient.

Ray is imported inside the functions that use it.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from typing import Any

from zerotir.config import HostsConfig, SandboxConfig

log = logging.getLogger(__name__)

RESTART_PAUSE_S = 1.0  # between two failed starts of a node's server


class NodeSandbox:
    """The body of a node's sandbox actor: a server on this node's IP, started again whenever it exits.

    Args:
        options: ``sandbox.local_sandbox`` keywords (``SandboxConfig.local_options``: workers, server options).
    """

    def __init__(self, options: dict[str, Any]):
        import ray

        from sandbox.local import listening_socket

        self.options = dict(options)
        self.workers = self.options.pop("workers", None)
        self.node_id = ray.get_runtime_context().get_node_id()
        self.sock = listening_socket(ray.util.get_node_ip_address(), 0)
        host, port = self.sock.getsockname()[:2]
        self.url = f"http://{host}:{port}"
        self.restarts = 0
        self._log = tempfile.TemporaryFile()
        self._stopping = threading.Event()
        self._proc = self._start()
        threading.Thread(target=self._watch, name="zerotir-node-sandbox-watch", daemon=True).start()

    def _start(self) -> Any:
        from sandbox.local import start_server

        return start_server(self.sock, self.workers, self.options, self._log)

    def _watch(self) -> None:
        """Wait on the server; start it again on the same socket when it exits, until ``stop``."""
        while not self._stopping.is_set():
            code = self._proc.wait()
            if self._stopping.is_set():
                return
            log.warning("the sandbox server at %s exited (code %s); starting it again", self.url, code)
            while not self._stopping.is_set():
                try:
                    self._proc = self._start()
                    self.restarts += 1
                    break
                except RuntimeError as exc:  # its start failed: say why, try again
                    log.error("the sandbox server at %s did not start again: %s", self.url, exc)
                    time.sleep(RESTART_PAUSE_S)

    def describe(self) -> dict[str, Any]:
        """The server's URL, node, process id and how many times it was started again."""
        return {"url": self.url, "node": self.node_id, "pid": self._proc.pid, "restarts": self.restarts}

    def stop(self) -> None:
        """Stop the server and no longer restart it."""
        from sandbox.local import stop_process_group

        self._stopping.set()
        stop_process_group(self._proc)
        self.sock.close()


class NodeSandboxes:
    """The engines' placement and a sandbox server on each of their nodes and the trainer's (see the module doc).

    Build with :meth:`start` once the cluster runs; :meth:`close` stops the servers and frees the placement.
    """

    def __init__(self, group: Any, engine_nodes: list[str], actors: dict[str, Any], urls: dict[str, str],
                 trainer_node: str):
        self.group, self.engine_nodes, self.actors, self.urls = group, engine_nodes, actors, urls
        self.trainer_node = trainer_node

    @classmethod
    def start(cls, fleet: HostsConfig, sandbox: SandboxConfig) -> NodeSandboxes:
        """Reserve the engines' resources (one bundle each, placed by Ray), then start a server on every node that
        got a bundle and on the trainer's; each within ``fleet.timeout_s``.

        Raises:
            TimeoutError: the cluster cannot fit the engines, or a server did not start, in time.
        """
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        # some resource is asked for: HostsConfig.sandbox_on_each_node refuses engines that ask for none
        bundle = {k: v for k, v in (("CPU", fleet.cpus_per_engine), ("GPU", fleet.gpus_per_engine)) if v > 0}
        group = placement_group([bundle] * fleet.engines, strategy="PACK")
        try:
            ready, _ = ray.wait([group.ready()], timeout=fleet.timeout_s)
            if not ready:
                raise TimeoutError(f"the cluster could not place {fleet.engines} engine(s) of {bundle} within "
                                   f"{fleet.timeout_s:g} s (model.hosts.timeout_s); add nodes or lower "
                                   "model.hosts.engines / cpus_per_engine / gpus_per_engine")
            table = ray.util.placement_group_table(group)["bundles_to_node_id"]
            engine_nodes = [table[k] for k in range(fleet.engines)]
            trainer = ray.get_runtime_context().get_node_id()
            actors = {node: _spawn(node, sandbox) for node in dict.fromkeys([trainer, *engine_nodes])}
            urls = _urls(actors, fleet.timeout_s)
        except BaseException:
            remove_placement_group(group)
            raise
        placed = cls(group, engine_nodes, actors, urls, trainer)
        log.info("sandbox per node: %s", placed.describe_layout())
        return placed

    def urls_of(self, engine: int) -> tuple[str, ...]:
        """The sandbox URLs of engine ``engine``: its own node's server."""
        return (self.urls[self.engine_nodes[engine]],)

    @property
    def trainer_urls(self) -> list[str]:
        """The trainer's node's server, for the trainer's own client."""
        return [self.urls[self.trainer_node]]

    def strategy(self, engine: int) -> Any:
        """Where Ray starts engine ``engine`` (and starts it again): its bundle of the placement group."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=engine)

    def describe(self, timeout_s: float) -> list[dict[str, Any]]:
        """Each node's server (``NodeSandbox.describe``), trainer's node first."""
        import ray

        return ray.get([actor.describe.remote() for actor in self.actors.values()], timeout=timeout_s)

    def describe_layout(self) -> str:
        """The layout in words: each engine's node and server."""
        engines = ", ".join(f"engine {k} -> {self.urls[n]}" for k, n in enumerate(self.engine_nodes))
        return f"trainer -> {self.urls[self.trainer_node]}; {engines}"

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop every server (each actor's ``stop``, then the actor) and free the engines' placement."""
        import ray
        from ray.util.placement_group import remove_placement_group

        try:
            ray.wait([actor.stop.remote() for actor in self.actors.values()], num_returns=len(self.actors),
                     timeout=timeout_s)
        finally:
            for actor in self.actors.values():
                ray.kill(actor, no_restart=True)
            remove_placement_group(self.group)


def _spawn(node: str, sandbox: SandboxConfig) -> Any:
    """A ``NodeSandbox`` actor pinned to ``node``, asking for no CPU (the node's cores are the engines')."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    actor = ray.remote(num_cpus=0, max_restarts=0)(NodeSandbox)
    return actor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
        sandbox.local_options)


def _urls(actors: dict[str, Any], timeout_s: float) -> dict[str, str]:
    """Each node's server URL, once every server answers (a server's start error raised, naming its node)."""
    import ray
    from ray.exceptions import GetTimeoutError, RayError

    urls = {}
    for node, actor in actors.items():
        try:
            urls[node] = ray.get(actor.describe.remote(), timeout=timeout_s)["url"]
        except GetTimeoutError as exc:
            raise TimeoutError(f"the sandbox server of node {node} did not start within {timeout_s:g} s "
                               "(model.hosts.timeout_s)") from exc
        except RayError as exc:
            raise RuntimeError(f"the sandbox server of node {node} did not start: {exc}") from exc
    return urls
