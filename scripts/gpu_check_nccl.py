"""The fleet's weight group over NCCL on one GPU (the ``nccl`` stage of scripts/gpu_check.sh).

One GPU holds an NCCL group of one rank: the sender alone. That still runs the NCCL side of the fleet's own code,
which the gloo stage (``scripts/gpu_check_fleet.py``) cannot: the backend built under the setting that makes a failed
collective raise instead of tearing the process down (``TORCH_NCCL_ASYNC_ERROR_HANDLING``), the first broadcast that
connects NCCL, a push of a model's buckets (manifests and flat per-dtype buffers), the communicator aborted by
``interrupt`` (a later collective must raise ``WeightGroupError``, never hang), the group dropped, and the process's
environment as it was before: nothing of the group's settings leaks into the trainer's own NCCL groups.

    python scripts/gpu_check_nccl.py --report OUT/nccl.json               # skipped, saying so, without a GPU
    python scripts/gpu_check_nccl.py --report OUT/nccl.json --device cpu  # the same steps over gloo on CPU
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared command line: gpu_check_stage

from gpu_check_stage import device_check_main  # noqa: E402

from zerotir.fleet.weight_group import (  # noqa: E402
    GroupAddress, WeightGroupError, form_weight_group, free_port,
)
from zerotir.fleet.weight_push import WeightSender  # noqa: E402
from zerotir.parallel.weight_sync import sync_weights  # noqa: E402
from zerotir.toy.tiny_model import build_tiny_model  # noqa: E402
from zerotir.toy.tokenizer import build_byte_tokenizer  # noqa: E402

TIMEOUT_S = 30.0


def check(device: str) -> dict:
    """Form a group of one rank on ``device``, broadcast, push a model, abort, drop; what went wrong, if anything."""
    before = dict(os.environ)
    problems: list[str] = []
    start = time.perf_counter()
    group = form_weight_group(GroupAddress("127.0.0.1", free_port("127.0.0.1")), 0, 1, device, TIMEOUT_S)
    formed_s = time.perf_counter() - start
    tensor = torch.arange(4096, dtype=torch.float32, device=device)
    group.broadcast(tensor, "a check tensor")
    if not torch.equal(tensor.cpu(), torch.arange(4096, dtype=torch.float32)):
        problems.append("the broadcast changed the sender's own tensor")
    model = build_tiny_model(build_byte_tokenizer(), hidden_size=64, num_layers=2, num_heads=4, seed=0).to(device)
    sender = WeightSender(group)
    with sender.push(1):
        sync_weights(model, sender, bucket_bytes=1)  # a bucket per layer
    stats = sender.pushes[-1]
    aborted = group.interrupt()
    if device.startswith("cuda") and not aborted:
        problems.append("interrupt() did not abort the NCCL communicator")
    try:
        group.broadcast(tensor, "a tensor after the interrupt")
        problems.append("a broadcast after interrupt() did not raise")
    except WeightGroupError:
        pass
    group.abandon()
    after = dict(os.environ)
    leaked = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    if leaked:
        problems.append(f"the environment changed: {leaked}")
    return {"device": device, "backend": "nccl" if device.startswith("cuda") else "gloo", "form_s": formed_s,
            "push_buckets": stats.buckets, "push_bytes": stats.bytes, "push_s": stats.seconds, "aborted": aborted,
            "problems": problems}


def main(argv: list[str] | None = None) -> int:
    return device_check_main(
        argv, __doc__.splitlines()[0], check, "an NCCL group needs one", "NCCL weight group",
        lambda r: f"weight group of one rank over {r['backend']} on {r['device']}: formed in {r['form_s']:.2f} s, "
                  f"push of {r['push_buckets']} buckets ({r['push_bytes'] / 2**20:.1f} MiB) in {r['push_s']:.2f} s, "
                  f"aborted {r['aborted']}")


if __name__ == "__main__":
    sys.exit(main())
