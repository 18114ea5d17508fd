"""The fleet's weight push with CUDA tensors on one GPU (the ``fleet`` stage of scripts/gpu_check.sh).

One GPU cannot hold an NCCL group of two ranks, but gloo carries CUDA tensors (host-staged), so the fleet's own code
from the GPU side runs here: the sender's bucket views of a model on the GPU (``sync_weights``), the receiver's
buffers and views on the GPU (``receive_push``) into a transformers engine on the GPU, the versions, and the ordered
stop. Sender and receiver are two threads of this process, each with its own gloo backend. The receiver's weights
must equal the sender's bit for bit, and its greedy tokens the sender model's.

    python scripts/gpu_check_fleet.py --report OUT/fleet.json            # skipped, saying so, without a GPU
    python scripts/gpu_check_fleet.py --report OUT/fleet.json --device cpu  # the same plumbing on CPU
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared command line: gpu_check_stage

from gpu_check_stage import device_check_main  # noqa: E402

from zerotir.fleet.weight_group import GroupAddress, form_weight_group, free_port  # noqa: E402
from zerotir.fleet.weight_push import WeightSender, receive_push  # noqa: E402
from zerotir.rollout.engine import SamplingParams, generate  # noqa: E402
from zerotir.rollout.hf_engine import HFEngine  # noqa: E402
from zerotir.parallel.weight_sync import sync_weights  # noqa: E402
from zerotir.toy.tiny_model import build_tiny_model  # noqa: E402
from zerotir.toy.tokenizer import build_byte_tokenizer  # noqa: E402

VERSION = 7
TIMEOUT_S = 60.0


def check(device: str) -> dict:
    """Push a model (seed 1) into an engine holding another (seed 0) over gloo, on ``device``; the findings."""
    tok = build_byte_tokenizer()
    sender_model = build_tiny_model(tok, hidden_size=64, num_layers=2, num_heads=4, seed=1).to(device).eval()
    engine = HFEngine(build_tiny_model(tok, hidden_size=64, num_layers=2, num_heads=4, seed=0).to(device).eval(),
                      tok, device)
    address, got = GroupAddress("127.0.0.1", free_port("127.0.0.1")), {}

    def receiver() -> None:
        group = form_weight_group(address, 1, 2, device, TIMEOUT_S, gloo=True)
        got["version"] = receive_push(group, engine)
        got["after_stop"] = receive_push(group, engine)

    thread = threading.Thread(target=receiver, daemon=True)
    thread.start()
    sender = WeightSender(form_weight_group(address, 0, 2, device, TIMEOUT_S, gloo=True))
    with sender.push(VERSION):
        sync_weights(sender_model, sender, bucket_bytes=1)  # a bucket per layer
    sender.stop()
    thread.join(TIMEOUT_S)
    pushed = dict(sender_model.named_parameters())
    differ = [n for n, p in engine.model.named_parameters() if not torch.equal(p, pushed[n])]
    prompts = [tok.encode(p) for p in ("Hello", "2+3=")]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    tokens = [s[0].token_ids for s in generate(engine, prompts, greedy)]
    want = [s[0].token_ids for s in generate(HFEngine(sender_model, tok, device), prompts, greedy)]
    problems = ([f"parameters differ after the push: {differ[:5]}"] if differ else []) + (
        [] if got.get("version") == VERSION else [f"the receiver reports version {got.get('version')}"]) + (
        [] if got.get("after_stop", 0) is None else ["the receiver did not see the stop"]) + (
        [] if tokens == want else ["greedy tokens differ from the sender model's"])
    stats = sender.pushes[-1]
    return {"device": device, "buckets": stats.buckets, "bytes": stats.bytes, "seconds": stats.seconds,
            "problems": problems}


def main(argv: list[str] | None = None) -> int:
    return device_check_main(
        argv, __doc__.splitlines()[0], check, "the check pushes CUDA tensors", "fleet push with CUDA tensors",
        lambda r: f"fleet push on {r['device']} over gloo: {r['buckets']} buckets, {r['bytes'] / 2**20:.1f} MiB in "
                  f"{r['seconds']:.2f} s")


if __name__ == "__main__":
    sys.exit(main())
