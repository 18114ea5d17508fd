"""The fleet's weights: the weight group of the trainer's sender and every engine, each update's push into it with
its version, and the other training ranks' side of a push under ZeRO-3.

    weights = FleetWeights(fleet, ranks)
    weights.form(hosts)                  # the group: this process rank 0, engine k rank k + 1
    weights.push(hosts, actor, version)  # bucket by bucket, every engine reports ``version`` back
    weights.reform(hosts, dead)          # after a death: the broken group abandoned, a new one formed
    weights.join_push(actor)             # a rank >= 1: the same bucket gathers (ZeRO-3 collectives), nothing sent

A push that an engine's death interrupts raises (``EngineDied`` or ``WeightGroupError``) for the source to recover
(``zerotir.fleet.source``: restart, ``reform``, push again); ``version`` moves only once every engine has the push.
"""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

from zerotir.config import HostsConfig
from zerotir.fleet.ranks import Discard, TrainerRanks
from zerotir.fleet.weight_group import GroupAddress, form_weight_group, free_port
from zerotir.fleet.weight_push import PushStats, WeightSender, push_weights
from zerotir.lora import is_adapted
from zerotir.rollout.vllm_lora import actor_adapter
from zerotir.parallel.weight_sync import DEFAULT_BUCKET_BYTES, sync_weights

log = logging.getLogger(__name__)


class FleetWeights:
    """The sender's side of the fleet's weight group (see the module doc).

    Args:
        fleet: the ``model.hosts`` group (where the group listens, its device and the bound on every wait).
        ranks: the training ranks, told of each push so that every rank joins its gathers.
    """

    def __init__(self, fleet: HostsConfig, ranks: TrainerRanks):
        self.fleet, self.ranks = fleet, ranks
        self.sender: WeightSender | None = None
        self.version: int | None = None  # of the last push the engines received; None: the folder's weights

    def form(self, hosts: Any) -> GroupAddress:
        """A weight group of this process (the sender) and every engine, at ``model.hosts.weight_port`` (0: a free
        one; a group formed again takes the same port, the abandoned group's store no longer holding it)."""
        from zerotir.fleet.cluster import ray_get

        fleet = self.fleet
        address = GroupAddress(fleet.weight_host, fleet.weight_port or free_port(fleet.weight_host))
        world = 1 + len(hosts)
        joined = [hosts[r].join_weights.remote(address, r + 1, world, fleet.timeout_s) for r in range(len(hosts))]
        self.sender = WeightSender(form_weight_group(address, 0, world, fleet.engine_device, fleet.timeout_s))
        ray_get(joined, fleet.timeout_s, "joining the weight group")
        return address

    def reform(self, hosts: Any, dead: list[int]) -> None:
        """After the ``dead`` engines were restarted: abandon the broken group, the others leave it, form a new one."""
        self.sender.group.abandon()
        hosts.leave_weights(dead)
        self.form(hosts)

    def push(self, hosts: Any, actor: nn.Module, version: int) -> PushStats:
        """``actor``'s weights to every engine as ``version``, bucket by bucket; waits until each has them. An engine
        that dies meanwhile interrupts the push at once (``cluster.watch_push``).

        Raises:
            EngineDied, WeightGroupError: an engine died or the transport failed (the caller recovers).
            RuntimeError: an engine reports another version.
        """
        from zerotir.fleet.cluster import ray_get, watch_push

        received = [host.receive_weights.remote() for host in hosts.handles]
        self.ranks.announce_push(version)  # every rank joins the gathers, which run to the end whatever fails
        with watch_push(received, self.sender.group):
            push_weights(self.sender, actor, version)
            got = ray_get(received, self.fleet.timeout_s, f"receiving the weights of version {version}")
        if got != [version] * len(hosts):
            raise RuntimeError(f"weight push {version}: the engines report versions {got}")
        self.version = version
        stats = self.sender.pushes[-1]
        log.debug("weight push %d: %.2f s, %.1f MB in %d buckets", version, stats.seconds, stats.bytes / 2**20,
                  stats.buckets)
        return stats

    def join_push(self, actor: nn.Module, version: int) -> None:
        """A rank >= 1's side of rank 0's push: the same gathers (ZeRO-3 collectives), nothing sent: the buckets, or a
        LoRA actor's adapter (``weight_push.push_adapter``)."""
        if is_adapted(actor):
            with actor_adapter(actor):
                return
        sync_weights(actor, Discard(), DEFAULT_BUCKET_BYTES)

    def last(self) -> PushStats | None:
        """The last push's figures; None before any."""
        return self.sender.pushes[-1] if self.sender is not None and self.sender.pushes else None

    def close(self) -> None:
        """Leave the group without the ordered goodbye: its receivers were killed, none would leave in order."""
        sender, self.sender = self.sender, None
        if sender is not None:
            sender.group.abandon()
