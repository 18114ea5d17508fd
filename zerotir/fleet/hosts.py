"""The fleet's engine hosts as one pool: started (Ray actors, or a thread: ``zerotir.fleet.transport``), asked how
they are, their shares of a batch submitted and collected, and after a death the restarted ones found, counted and
their calls made again.

    hosts = FleetHosts(fleet, transport)
    hosts.start(settings, cores)                 # the actors, each built (model loaded) before this returns
    hosts.submit(shares)                         # one roll_out call per share, each engine's queued together
    hosts.collect(submitted, what, recover)      # a batch's shares in row order; a dead engine recovered first
    dead = hosts.restarted(cause, step)          # after a death: which engines are new processes (bounded)
    hosts.resubmit(dead, batches)                # their shares made again, with the same seeds
    hosts.kill()

What a death means for the weights (a new weight group, a push of the current version) is the source's to
compose (``zerotir.fleet.source``); the pool knows the processes only. Every wait is bounded by
``model.hosts.timeout_s``; an error names the engine, its node and pid, and the step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from zerotir.config import HostsConfig
from zerotir.fleet.engine_host import HostSettings
from zerotir.fleet.shares import Share, Submitted, merge
from zerotir.fleet.transport import Transport
from zerotir.types import Trajectories

log = logging.getLogger(__name__)


class FleetHosts:
    """The engine processes of ``model.hosts`` (Ray actor handles of ``EngineHost``), in engine order.

    Args:
        fleet: the ``model.hosts`` group: their count, resources, restarts allowed and the bound on every wait.
        transport: how the hosts run and are called (``zerotir.fleet.transport``: Ray actors or a thread).
    """

    def __init__(self, fleet: HostsConfig, transport: Transport):
        self.fleet, self.transport = fleet, transport
        self.handles: list[Any] = []
        self.restarts = 0  # engine processes that died and were restarted
        self._where: list[dict[str, Any]] = []  # per engine: its describe() (node, pid) when it last started
        self._occupancy: dict[str, float] = {}  # the engines', as of the last call of ``occupancy``

    def __len__(self) -> int:
        return len(self.handles)

    def __getitem__(self, engine: int) -> Any:
        return self.handles[engine]

    def start(self, settings: HostSettings, cores: tuple[tuple[int, ...], ...] | None) -> None:
        """Spawn the hosts (``Transport.spawn``) and wait until each has built its engine."""
        self.handles = self.transport.spawn(self.fleet, settings, cores)
        self._where = self.transport.describe(self.handles, self.fleet.timeout_s, "starting (loading the model)")

    @property
    def adapter_paths(self) -> list[str]:
        """How a LoRA actor's pushes reach each engine, as it declared at start (``EngineWeights.adapter_path``)."""
        return [where["adapter_path"] for where in self._where]

    def submit(self, shares: list[Share]) -> None:
        """One ``roll_out`` call per share, the calls of each engine queued together (in the shares' order); each
        share keeps its call's reference."""
        by_engine: dict[int, list[Share]] = {}
        for share in shares:
            by_engine.setdefault(share.engine, []).append(share)
        for engine, theirs in by_engine.items():
            for share, ref in zip(theirs, self.transport.roll_out(self.handles[engine], [s.args for s in theirs])):
                share.ref = ref

    def collect(self, submitted: Submitted, what: str, pad: int,
                recover: Callable[[Exception, list[Submitted]], None]) -> tuple[Trajectories, dict[str, float]]:
        """The shares of one batch, in row order (group ids shifted to the batch's rows), not scored; an engine that
        died meanwhile is recovered (``recover(cause, [submitted])``) and its shares are waited for again."""
        from zerotir.fleet.cluster import EngineDied

        while True:
            try:
                results = self.transport.get([share.ref for share in submitted.shares], self.fleet.timeout_s,
                                  f"rolling out {what}", [share.engine for share in submitted.shares])
                break
            except EngineDied as died:
                recover(died, [submitted])
        return merge(results, [share.lo for share in submitted.shares], pad)

    def occupancy(self) -> dict[str, float]:
        """The engines' mean ``EngineHost.occupancy`` as ``fleet_<key>``; the last figures when one died (it is
        recovered where its batches are collected)."""
        self._occupancy = self.transport.occupancy(self.handles, self.fleet.timeout_s, self._occupancy)
        return self._occupancy

    def restarted(self, cause: Exception, step: int) -> list[int]:
        """After an engine died: wait for Ray's restart and return the engines that are new processes, counted
        against ``model.hosts.max_restarts`` (past it the run stops, naming the engine, its node and ``step``).

        Raises:
            RuntimeError: Ray could not restart an engine, or the restarts passed the bound.
            Exception: ``cause`` itself when every engine is the one that started (not a death: a push that timed
                out, say).
        """
        from zerotir.fleet.cluster import EngineDied

        try:
            now = self.transport.describe(self.handles, self.fleet.timeout_s, "restarting after an engine died",
                                          wait=True)
        except EngineDied as died:
            where = self._where[died.engine]
            raise RuntimeError(f"engine process {died.engine} of the fleet (node {where['node']}, pid "
                               f"{where['pid']}) died at step {step} and Ray could not restart it: {died}; "
                               f"first failure: {cause}") from cause
        dead = [k for k, (old, new) in enumerate(zip(self._where, now)) if old["pid"] != new["pid"]]
        if not dead:
            raise cause
        self.restarts += len(dead)
        if self.restarts > self.fleet.max_restarts:
            names = ", ".join(f"{k} (node {self._where[k]['node']}, pid {self._where[k]['pid']})" for k in dead)
            raise RuntimeError(f"engine process {names} of the fleet died at step {step}: {self.restarts} "
                               f"restarts, past model.hosts.max_restarts={self.fleet.max_restarts}: {cause}") from cause
        log.warning("rollout fleet: engine %s died at step %d (%s); restarted (%d of %d restarts allowed)", dead,
                    step, cause, self.restarts, self.fleet.max_restarts)
        self._where = now
        return dead

    def leave_weights(self, dead: list[int]) -> None:
        """The engines that live on leave the weight group a dead one broke (after their calls in flight, before
        they join the new one)."""
        for k, host in enumerate(self.handles):
            if k not in dead:
                host.leave_weights.remote()

    def resubmit(self, dead: list[int], batches: list[Submitted]) -> None:
        """The shares of ``batches`` that the ``dead`` engines held, made again on their restarted processes (with
        the same seeds: the same trajectories where the weights are the same); each batch once."""
        pending = {id(b): b for b in batches}
        for submitted in pending.values():
            self.submit([share for share in submitted.shares if share.engine in dead])

    def kill(self) -> None:
        """End the engine processes now (a call in flight is dropped: it was never trained); idempotent."""
        handles, self.handles = self.handles, []
        if handles:
            self.transport.kill(handles)
