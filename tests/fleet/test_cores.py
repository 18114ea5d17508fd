"""The fleet's thread budget (``zerotir.fleet.cores``): trainer and engines add up to the cores they have, pinned to
cores of their own where the budget fits, an explicit setting that cannot apply refused naming it, and the trainer's
threads and cores put back when the fleet closes."""

from __future__ import annotations

import os

import pytest
import torch

from zerotir.config import HostsConfig
from zerotir.fleet.cores import CoreBudget, available_cores, plan_cores

pins = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="this OS cannot pin processes")


@pins
def test_a_local_fleet_and_its_trainer_share_the_cores_once():
    budget = plan_cores(ray_hosts(engines=1), (0, 1), local=True)
    assert budget == CoreBudget(1, 1, (0, 1), (0,), ((1,),))
    assert budget.describe() == ("thread budget of 2 core(s): trainer 1 thread(s) on cores [0]; engine 0: 1 on "
                                 "cores [1]")
    budget = plan_cores(ray_hosts(engines=2, cpus_per_engine=2), tuple(range(8)), local=True)
    assert (budget.trainer_threads, budget.engine_threads) == (4, 2)  # 8 cores - 2 engines x 2 threads
    assert budget.trainer_cores == (0, 1, 2, 3) and budget.engine_cores == ((4, 5), (6, 7))
    chosen = plan_cores(ray_hosts(engines=1, trainer_threads=2, threads=3), tuple(range(8)), local=True)
    assert chosen.trainer_cores == (0, 1) and chosen.engine_cores == ((2, 3, 4),)  # 3 cores left to the OS



def ray_hosts(**settings) -> HostsConfig:
    """``model.hosts`` with Ray engines (the schedule's S does not enter the core budget)."""
    return HostsConfig(max_staleness=0, **settings)

def test_a_budget_over_the_cores_is_not_pinned_unless_asked_and_then_refused():
    over = plan_cores(ray_hosts(engines=2), (0, 1), local=True)  # 1 trainer thread + 2 engines x 1 > 2 cores
    assert over == CoreBudget(1, 1, (0, 1))
    assert "cores not pinned" in over.describe()
    with pytest.raises(ValueError, match=r"model.hosts.pin_cores=true: the trainer's 1 \+ 2 engine\(s\) x 1 "
                                         r"thread\(s\) = 3 exceed the 2 core\(s\).*pin_cores: null"):
        plan_cores(ray_hosts(engines=2, pin_cores=True), (0, 1), local=True)
    assert plan_cores(ray_hosts(engines=1, pin_cores=False), (0, 1), local=True) == CoreBudget(1, 1, (0, 1))


def test_a_joined_cluster_leaves_the_trainer_its_cores_and_cannot_pin_the_engines():
    fleet = ray_hosts(engines=4, address="10.0.0.1:6379")
    assert plan_cores(fleet, (0, 1, 2), local=False) == CoreBudget(3, 1, (0, 1, 2))
    assert plan_cores(ray_hosts(engines=4, trainer_threads=2), (0, 1, 2), local=False).trainer_threads == 2
    with pytest.raises(ValueError, match=r"model.hosts.pin_cores=true with model.hosts.address='10.0.0.1:6379'"):
        plan_cores(ray_hosts(engines=1, address="10.0.0.1:6379", pin_cores=True), (0, 1), local=False)


@pins
def test_the_trainers_threads_and_cores_are_set_then_put_back():
    threads, cores = torch.get_num_threads(), os.sched_getaffinity(0)
    mine = available_cores()
    restore = CoreBudget(1, 1, mine, mine[:1], ((mine[-1],),)).apply_to_trainer()
    try:
        assert torch.get_num_threads() == 1 and os.sched_getaffinity(0) == {mine[0]}
    finally:
        restore()
    assert torch.get_num_threads() == threads and os.sched_getaffinity(0) == cores
