"""The fleet's thread budget: how many torch threads the trainer and each engine process compute on, and (on a local
cluster, where the OS allows) which cores each may run on, so that together they use the cores they have once.

Without it the trainer keeps torch's thread count (every core) while each engine process runs its own threads on the
same cores: both sides then wait on each other's threads (measured: the update took 1.46 s beside an
engine process against 0.67 s in line on 2 cores). The budget gives the engines ``model.hosts.engine_threads`` each
and the trainer the rest of this process's cores (``model.hosts.trainer_threads`` to choose), and pins each to cores
of its own (``os.sched_setaffinity``, Linux) when the budget fits them:

    budget = plan_cores(fleet, available_cores(), local=True)
    log.info("rollout fleet: %s", budget.describe())      # the trainer 1 thread on cores [0], engine 0: 1 on [1]
    restore = budget.apply_to_trainer()                   # ... the run ...; restore() at its end

A joined cluster's engines run on nodes this process does not see: only the trainer's threads are set there (its
cores stay the OS's). Engine processes apply their share themselves (``EngineHost``, ``pin_process``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from zerotir.config import HostsConfig


@dataclass(frozen=True)
class CoreBudget:
    """Threads and cores of the trainer and of each engine process.

    Attributes:
        trainer_threads: torch intra-op threads of the trainer while the fleet runs.
        engine_threads: torch intra-op threads of each engine process.
        available: the cores this process may run on (``os.sched_getaffinity``).
        trainer_cores: the cores the trainer is pinned to; None: not pinned.
        engine_cores: per engine process, the cores it is pinned to; None: not pinned.
    """

    trainer_threads: int
    engine_threads: int
    available: tuple[int, ...]
    trainer_cores: tuple[int, ...] | None = None
    engine_cores: tuple[tuple[int, ...], ...] | None = None

    def describe(self) -> str:
        """One line for the log that starts the fleet: every side's threads and cores."""
        pinned = self.trainer_cores is not None and self.engine_cores is not None
        trainer = f"trainer {self.trainer_threads} thread(s)" + (f" on cores {list(self.trainer_cores)}"
                                                                  if pinned else "")
        engines = (", ".join(f"engine {k}: {self.engine_threads} on cores {list(c)}"
                             for k, c in enumerate(self.engine_cores)) if pinned
                   else f"each engine {self.engine_threads} thread(s), cores not pinned")
        return f"thread budget of {len(self.available)} core(s): {trainer}; {engines}"

    def apply_to_trainer(self) -> Callable[[], None]:
        """Set this process's torch threads (and pin it, when planned); returns what puts both back as they were
        (a fleet closes within a longer process: a test run, a notebook)."""
        threads = torch.get_num_threads()
        torch.set_num_threads(self.trainer_threads)
        before = os.sched_getaffinity(0) if self.trainer_cores is not None else None
        if self.trainer_cores is not None:
            pin_process(self.trainer_cores)

        def restore() -> None:
            torch.set_num_threads(threads)
            if before is not None:
                pin_process(tuple(before))

        return restore


def available_cores() -> tuple[int, ...]:
    """The cores this process may run on (its affinity where the OS tells it, else every core)."""
    if hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    return tuple(range(os.cpu_count() or 1))


def plan_cores(fleet: HostsConfig, available: tuple[int, ...], local: bool) -> CoreBudget:
    """The budget of ``fleet`` on ``available`` cores; ``local``: the engines run on this machine (a local
    cluster), so they share its cores with the trainer.

    Local: the trainer gets ``fleet.trainer_threads``, or the cores left after the engines' (at least 1); pinning
    (``fleet.pin_cores``; None: where the budget fits and the OS can pin) gives the trainer the first cores and each
    engine the next ones. Joined cluster: the trainer gets ``trainer_threads`` or every available core, unpinned.

    Raises:
        ValueError: ``pin_cores: true`` where it cannot apply (the budget exceeds the cores, the OS cannot pin, or
            the engines run on a joined cluster), naming the settings and the fix.
    """
    engines, each = fleet.engines, fleet.engine_threads
    if not local:
        if fleet.pin_cores:
            raise ValueError(f"model.hosts.pin_cores=true with model.hosts.address={fleet.address!r}: the engines "
                             "run on the cluster's nodes, whose cores this process cannot pin; set pin_cores: null")
        return CoreBudget(fleet.trainer_threads or len(available), each, available)
    trainer = fleet.trainer_threads or max(1, len(available) - engines * each)
    needed = trainer + engines * each
    can_pin = hasattr(os, "sched_setaffinity") and needed <= len(available)
    if fleet.pin_cores and not can_pin:
        why = ("this OS cannot pin processes (no os.sched_setaffinity)" if needed <= len(available) else
               f"the trainer's {trainer} + {engines} engine(s) x {each} thread(s) = {needed} exceed the "
               f"{len(available)} core(s) this process may use")
        raise ValueError(f"model.hosts.pin_cores=true: {why}; lower model.hosts.trainer_threads / engine threads "
                         "(model.hosts.threads) or the engines, or set pin_cores: null (pin where it fits)")
    if fleet.pin_cores is False or not can_pin:
        return CoreBudget(trainer, each, available)
    cores = list(available)
    engine_cores = tuple(tuple(cores[trainer + k * each: trainer + (k + 1) * each]) for k in range(engines))
    return CoreBudget(trainer, each, available, tuple(cores[:trainer]), engine_cores)


def pin_process(cores: tuple[int, ...]) -> None:
    """Pin every thread of this process to ``cores`` (``os.sched_setaffinity`` sets one thread's; threads started
    later inherit their creator's), so torch's pools started before and after keep to them."""
    try:
        threads = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    for tid in threads:
        try:
            os.sched_setaffinity(tid, cores)
        except ProcessLookupError:
            pass  # the thread ended meanwhile
