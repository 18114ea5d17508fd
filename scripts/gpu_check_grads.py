"""The gradient stage of ``scripts/gpu_check.sh`` (``python scripts/gpu_check.py grads``): gradients on one fixed
batch, ZeRO-3 against ZeRO-2 against plain torch, and ZeRO-3's log-probs and gradients through the chunked LM head
(``model.rl.logprob_chunk_tokens``, which gathers the partitioned head weight itself) against its full logits.

The fit stages accept any finite nonzero gradient, so they would not see ZeRO-3 train on the last micro-batch only.
This stage compares gradients on one batch: two micro-batch backward calls inside one ``engine.forward`` (Lightning's
call structure, through the module's own backward) and one SGD step with lr 1 (the weight change is the gradient),
plain torch on the full batch vs ZeRO-2 vs ZeRO-3, in fp32. The ZeRO-3 run is repeated with the log-probs taken a
chunk of tokens at a time: the log-probs and the gradients must be the full path's.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

GRAD_TOLERANCE = 1e-3  # relative L2 error in fp32; a lost micro-batch gives an error of the order of 0.5
CHUNK_TOKENS = 16  # smaller than a row (48 tokens), so every row crosses chunks


class _StepInForward(torch.nn.Module):
    """Stands in for the LightningModule that Lightning runs inside ``engine.forward``: the micro-batch backward
    calls and the optimizer step all happen in this forward."""

    def __init__(self, net: torch.nn.Module, chunk_tokens: int | None):
        super().__init__()
        self.net = net
        self.chunk_tokens = chunk_tokens  # the log-probs through the chunked LM head, or None: the full logits
        self.hooks: list = []  # (backward, step), set after deepspeed.initialize (not a submodule)
        self.logprobs: list[torch.Tensor] = []  # each micro-batch's, detached

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        from zerotir.rl.update import sequence_logprobs

        backward, step = self.hooks[0]
        for rows in (slice(0, 2), slice(2, 4)):  # equal micro-batches: each loss weighted 1/2 = its token share
            logp = sequence_logprobs(self.net, ids[rows], mask[rows], temperature=1.0,
                                     chunk_tokens=self.chunk_tokens)[0][:, 1:]
            self.logprobs.append(logp.detach().float().cpu())
            backward(-logp.mean() * 0.5)
        step()
        return torch.zeros(())


def _update(net: torch.nn.Module, stage: int | None, ids: torch.Tensor, mask: torch.Tensor,
            chunk_tokens: int | None = None) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """The weight change of one SGD step (lr 1) = the gradient: plain torch on the full batch (``stage`` None) or a
    DeepSpeed engine with the shipped ZeRO config (fp32, no clipping) through ``ZeroTIRModule._backward``, with the
    log-probs from the full logits or ``chunk_tokens`` at a time; and the engine's log-probs (rows in order)."""
    import deepspeed

    from zerotir.module import ZeroTIRModule
    from zerotir.rl.update import sequence_logprobs

    before = [p.detach().clone() for p in net.parameters()]
    if stage is None:
        (-sequence_logprobs(net, ids, mask, temperature=1.0)[0][:, 1:].mean()).backward()
        return [p.grad.detach().clone() for p in net.parameters()], None
    config = json.loads((REPO / "configs" / "deepspeed" / f"zero{stage}.json").read_text())
    config.update(bf16={"enabled": False}, gradient_clipping=0.0)
    wrapper = _StepInForward(net, chunk_tokens)
    opt = torch.optim.SGD(wrapper.parameters(), lr=1.0)
    engine, _, _, _ = deepspeed.initialize(model=wrapper, optimizer=opt, config=config,
                                           model_parameters=wrapper.parameters())

    class DeepSpeedStrategy:  # what the module's is_deepspeed() recognises (by class name)
        pass

    module = type("Module", (), {})()
    module.trainer = type("Trainer", (), {"strategy": DeepSpeedStrategy(), "model": engine})()
    module.manual_backward = engine.backward
    wrapper.hooks.append((lambda loss: ZeroTIRModule._backward(module, loss), engine.step))
    engine(ids, mask)
    with deepspeed.zero.GatheredParameters(list(net.parameters()), modifier_rank=None):
        delta = [b - p.detach() for b, p in zip(before, net.parameters())]
    engine.destroy()
    return delta, torch.cat(wrapper.logprobs)


def _relative_error(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    diff = sum(float((g.double() - w.double()).pow(2).sum()) for g, w in zip(got, want))
    return math.sqrt(diff / max(sum(float(w.double().pow(2).sum()) for w in want), 1e-300))


def grads(model_dir: Path, report: Path, cpu: bool) -> int:
    """ZeRO-2 must give plain torch's full-batch gradient and ZeRO-3 ZeRO-2's, on the same batch (one process)."""
    import copy
    import os

    if cpu:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29517", "RANK": "0", "WORLD_SIZE": "1",
                       "LOCAL_RANK": "0"}.items():
        os.environ.setdefault(key, value)
    import deepspeed
    from transformers import AutoModelForCausalLM

    device = torch.device("cpu") if cpu else torch.device("cuda", 0)
    if cpu:  # without the CPU backend's shared-memory op, which it would JIT-build for nothing (the rehearsal's way)
        from zerotir.parallel.cpu_deepspeed import without_shm_allreduce

        with without_shm_allreduce():
            deepspeed.init_distributed(dist_backend="gloo")
    else:
        torch.cuda.set_device(device)
        deepspeed.init_distributed(dist_backend="nccl")
    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).to(device)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 259, (4, 48), generator=gen).to(device)  # byte-tokenizer ids, 4 sequences
    mask = torch.ones_like(ids)
    start = time.perf_counter()
    full, _ = _update(copy.deepcopy(base), None, ids, mask)
    zero2, _ = _update(copy.deepcopy(base), 2, ids, mask)
    zero3, logp3 = _update(copy.deepcopy(base), 3, ids, mask)
    chunked, logp_chunked = _update(copy.deepcopy(base), 3, ids, mask, CHUNK_TOKENS)
    result = {"zero2_vs_full_batch": _relative_error(zero2, full), "zero3_vs_zero2": _relative_error(zero3, zero2),
              "zero3_chunked_vs_full_logits": _relative_error(chunked, zero3),
              "zero3_chunked_logprob_max_abs": float((logp_chunked - logp3).abs().max()),
              "chunk_tokens": CHUNK_TOKENS, "tolerance": GRAD_TOLERANCE, "seconds": time.perf_counter() - start}
    keys = ("zero2_vs_full_batch", "zero3_vs_zero2", "zero3_chunked_vs_full_logits")
    result["problems"] = [f"{key}: relative gradient error {result[key]:.3g} > {GRAD_TOLERANCE}"
                          for key in keys if result[key] > GRAD_TOLERANCE]
    if result["zero3_chunked_logprob_max_abs"] > GRAD_TOLERANCE:
        result["problems"].append(f"ZeRO-3 chunked log-probs differ from the full logits' by up to "
                                  f"{result['zero3_chunked_logprob_max_abs']:.3g} > {GRAD_TOLERANCE}")
    report.write_text(json.dumps(result, indent=2))
    print(f"[gpu_check] gradients on one batch: ZeRO-2 vs full batch {result['zero2_vs_full_batch']:.2e}, "
          f"ZeRO-3 vs ZeRO-2 {result['zero3_vs_zero2']:.2e}, ZeRO-3 chunked vs full logits "
          f"{result['zero3_chunked_vs_full_logits']:.2e} (log-probs within "
          f"{result['zero3_chunked_logprob_max_abs']:.1e}; tolerance {GRAD_TOLERANCE})", flush=True)
    for problem in result["problems"]:
        print(f"[gpu_check] PROBLEM: {problem}", flush=True)
    return 1 if result["problems"] else 0
