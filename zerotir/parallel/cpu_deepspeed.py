"""``CpuDeepSpeedStrategy``: Lightning's ``DeepSpeedStrategy`` on CPU processes (gloo), for the CPU rehearsal of the
scale configs (``configs/rehearsal/*.yaml``, docs/scale.md).

Lightning's strategy refuses any accelerator but CUDA and checks that the device indices equal the local ranks; on
CPU every device is ``cpu`` without an index. Three overrides lift that and nothing else: ``setup_environment`` (the
CUDA check), ``setup_distributed`` (the device-index check) and ``root_device`` (``cpu:<local rank>``, the index
DeepSpeed reads as ``device_rank``). DeepSpeed itself runs on its CPU accelerator (``DS_ACCELERATOR=cpu``, set by
the CLI when CUDA is absent) with the gloo backend, without the shared-memory allreduce op of DeepSpeed's CPU backend
(``without_shm_allreduce``). Everything else (the ZeRO stages, the engine, checkpoints) is
Lightning's and DeepSpeed's own code, so a rehearsal run executes what a GPU run executes, minus CUDA.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator

import torch
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.strategies import DeepSpeedStrategy
from lightning.pytorch.strategies.ddp import DDPStrategy


class CpuDeepSpeedStrategy(DeepSpeedStrategy):
    """``DeepSpeedStrategy`` with ``trainer.accelerator: cpu`` (gloo); takes the same arguments (``config``, ...)."""

    strategy_name = "deepspeed_cpu"

    def setup_environment(self) -> None:
        """Lightning's environment setup without the CUDA-only check of ``DeepSpeedStrategy``."""
        if not isinstance(self.accelerator, CPUAccelerator):
            raise ValueError(f"trainer.strategy=zerotir.parallel.cpu_deepspeed.CpuDeepSpeedStrategy runs on CPU processes "
                             f"but trainer.accelerator is {type(self.accelerator).__name__}. Fix: set trainer.accelerator: "
                             "cpu, or use lightning.pytorch.strategies.DeepSpeedStrategy on GPUs")
        DDPStrategy.setup_environment(self)

    def setup_distributed(self) -> None:
        """DeepSpeed's process group (gloo on CPU), without the check that device indices equal local ranks."""
        reset_seed()
        self.set_world_ranks()
        with without_shm_allreduce():
            self._init_deepspeed_distributed()

    @property
    def root_device(self) -> torch.device:
        """``cpu:<local rank>``: DeepSpeed takes the index as this process's ``device_rank``."""
        return torch.device("cpu", self.local_rank)


@contextlib.contextmanager
def without_shm_allreduce() -> Iterator[None]:
    """``deepspeed.init_distributed`` without DeepSpeed's CPU shared-memory allreduce op (``deepspeed_shm_comm``).

    Its CPU backend JIT-builds that C++ op when it starts (minutes on a loaded 2-core machine) for
    ``inference_all_reduce`` alone, which falls back to ``torch.distributed`` without it; training reduces over gloo
    through ``torch.distributed`` either way. The build is cached in one folder of ``~/.cache/torch_extensions``
    whose command line names the checkout's virtual environment, so runs from another checkout rebuild it, behind a
    lock file that a run killed mid-build leaves for the next run to wait on. The rehearsal skips it."""
    # deepspeed.comm's attribute ``torch`` is torch itself: the module is reached by its name
    backend = importlib.import_module("deepspeed.comm.torch")
    build = backend.build_shm_op
    backend.build_shm_op = lambda: None
    try:
        yield
    finally:
        backend.build_shm_op = build
