"""What the DeepSpeed gradient-accumulation tests share: one rank on DeepSpeed's CPU accelerator in a new process, and
the exact check that two half-batch backward calls and one SGD step (lr 1) move a small MLP's weights like one
full-batch gradient step (``tests/parallel/test_deepspeed_configs.py``, ``tests/parallel/test_deepspeed_setup.py``).

The checks run in a new process because DeepSpeed must see ``DS_ACCELERATOR`` before it is imported; bf16 and
gradient clipping are off there so that the comparison is exact in fp32."""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from tests.gloo import spawned
from tests.ports import free_port


def deepspeed_importable() -> bool:
    """Whether deepspeed is installed (found without importing it: the import reads ``DS_ACCELERATOR``)."""
    return importlib.util.find_spec("deepspeed") is not None


def run_one_cpu_rank(process: Callable[..., None], args: tuple, timeout_s: float) -> None:
    """``process(0, *args)`` in one new process as rank 0 of 1 (gloo on a free loopback port) on DeepSpeed's CPU
    accelerator; waits at most ``timeout_s`` for it (``tests.gloo.spawned``)."""
    env = {"DS_ACCELERATOR": "cpu", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0",
           "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        with spawned(process, args, 1, timeout_s=timeout_s):
            pass


def exact_on_cpu(config: dict) -> dict:
    """``config`` (changed in place, and returned) for an exact fp32 comparison on CPU: bf16 and clipping off, and
    no optimizer offload (the check's client optimizer is SGD; offload needs DeepSpeed's CPU Adam)."""
    config["bf16"] = {"enabled": False}
    config["gradient_clipping"] = 0.0
    config["zero_optimization"].pop("offload_optimizer", None)
    return config


@dataclass
class FullBatch:
    """A seeded MLP, its weights before any step, a batch of 6 rows and the full batch's MSE gradient."""

    net: torch.nn.Module
    before: list[torch.Tensor]
    x: torch.Tensor
    y: torch.Tensor
    grads: list[torch.Tensor]

    def error(self, after: list[torch.Tensor]) -> float:
        """How far ``after`` is from one SGD step of lr 1 on the full batch (after = before - gradient)."""
        return max(float((b - a - g).abs().max()) for b, a, g in zip(self.before, after, self.grads))


def full_batch() -> FullBatch:
    """The problem of the check, the same on every call (seed 0)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    before = [p.detach().clone() for p in net.parameters()]
    x, y = torch.randn(6, 4), torch.randn(6, 1)
    full = copy.deepcopy(net)
    torch.nn.functional.mse_loss(full(x), y).backward()
    return FullBatch(net, before, x, y, [p.grad.clone() for p in full.parameters()])

