"""``CpuDeepSpeedStrategy``: Lightning's DeepSpeed strategy on CPU processes (the 2-rank fits are in
tests/e2e/test_rehearsal_*.py); here its device and its refusal of another accelerator."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.accelerators import CUDAAccelerator
from lightning.pytorch.strategies import DeepSpeedStrategy

from zerotir.parallel.cpu_deepspeed import CpuDeepSpeedStrategy
from zerotir.parallel.deepspeed_setup import is_deepspeed


class _Trainer:
    def __init__(self, strategy):
        self.strategy = strategy


def test_root_device_is_the_cpu_of_the_local_rank_and_the_module_sees_deepspeed(monkeypatch):
    from lightning.fabric.plugins.environments import LightningEnvironment
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    # set_global_rank sets the process-wide rank_zero_only.rank: put back after the test, or every later trainer of
    # this process would take itself for rank 1 and write no log (its CSV and TensorBoard files never appear).
    monkeypatch.setattr(rank_zero_only, "rank", rank_zero_only.rank)
    environment = LightningEnvironment()
    environment.set_world_size(2)
    environment.set_global_rank(1)
    monkeypatch.setenv("LOCAL_RANK", "1")
    strategy = CpuDeepSpeedStrategy(config={"zero_optimization": {"stage": 3}}, cluster_environment=environment)
    assert strategy.root_device == torch.device("cpu", 1)
    assert isinstance(strategy, DeepSpeedStrategy) and is_deepspeed(_Trainer(strategy))


def test_another_accelerator_is_refused_naming_the_field():
    strategy = CpuDeepSpeedStrategy(config={"zero_optimization": {"stage": 2}})
    strategy.accelerator = CUDAAccelerator()  # on a GPU machine Lightning's own DeepSpeedStrategy is the one to use
    with pytest.raises(ValueError, match="trainer.accelerator"):
        strategy.setup_environment()
