"""The response perplexity under the reference (base) model, for the high-perplexity filter
(``model.filters.perplexity``, the paper's code: a sample whose base-model perplexity is above 5 is dropped).

The RL step takes the reference log-probs once, on the trajectories the other rules kept, before the advantages:
the rows above the threshold leave the batch, and the rest keep their log-probs for the KL (``prepare_batch``'s
``ref_logp``), so no second reference pass runs. The log-probs are those of every reference pass: at
``model.sampling.temperature``, through the same micro-batches (``prepare_batch``'s).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from zerotir.config import RLConfig
from zerotir.rl.micro_batches import micro_batches, row_lengths
from zerotir.rl.update import forward_in_chunks, sequence_logprobs
from zerotir.parallel.distributed import global_max
from zerotir.types import Trajectories


def sequence_perplexity(logp: Tensor, mask: Tensor) -> Tensor:
    """(B,) exp(-mean of ``logp`` over each row's action tokens): the perplexity of what the policy sampled (injected
    tool output excluded); 1 for a row without an action token. Example: log-probs -1 and -3 give exp(2)."""
    mask = mask.bool()
    counts = mask.sum(1)
    total = torch.where(mask, logp.float(), torch.zeros_like(logp, dtype=torch.float32)).sum(1)
    return torch.exp(-total / counts.clamp(min=1))


@torch.no_grad()
def reference_logprobs(cfg: RLConfig, traj: Trajectories, reference: nn.Module, temperature: float) -> Tensor:
    """The reference model's log-probs of ``traj``, (B, T), as ``prepare_batch`` takes them (a collective: every
    rank runs as many forward passes)."""
    ids, attn = traj.input_ids, traj.attention_mask
    chunks = micro_batches(row_lengths(attn), cfg.micro_batch_size, cfg.max_tokens_per_micro_batch, cfg.pack_rows)
    passes = int(global_max(len(chunks)))
    options = {"temperature": temperature, "chunk_tokens": cfg.logprob_chunk_tokens, "packed": cfg.pack_rows}
    return forward_in_chunks(lambda i, m: sequence_logprobs(reference, i, m, **options)[0], ids, attn, chunks,
                             passes)
