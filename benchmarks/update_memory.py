"""Peak memory and throughput of the RL update on long-tailed response lengths: today's micro-batches of
``micro_batch_size`` rows with the full logits, against the token budget (``model.rl.max_tokens_per_micro_batch``)
and the chunked LM head (``model.rl.logprob_chunk_tokens``), and both with packed rows (``model.rl.pack_rows``),
side by side in one run on CPU.

    python -m benchmarks.update_memory                      # the docs/results.md table
    python -m benchmarks.update_memory --rows 8 --max-len 2048   # smaller and quicker

Method. A tiny Llama widened to a ``--vocab`` vocabulary (random weights: the update's cost does not depend on what
the model knows) and a batch of ``--rows`` trajectories whose lengths are lognormal around ``--median`` tokens, cut
to ``[prompt + 8, --max-len]``, the longest set to ``--max-len`` (the long tail is the point). Each response has a
masked tool-output span. Each variant runs in a fresh process: a warm-up update on the two shortest rows (the
optimizer's state), then the measured one on the batch, both ``prepare_batch`` + ``ppo_update`` (REINFORCE++, one
epoch, one mini-batch: a single pass) with an AdamW step. Today's micro-batches are ``--micro-batch-size`` rows in
batch order (4 by default rather than the project's 8, to keep today's peak within a small machine's memory).

* Peak memory: the process's peak resident memory during the measured update above its resident memory before it
  (Linux ``VmHWM`` after resetting it through ``/proc/self/clear_refs``, minus ``VmRSS``). torch's CPU allocator
  keeps no statistics and ``tracemalloc`` sees only Python's allocations, so resident memory is the measure; large
  tensors are their own mappings, returned to the system when freed, so the number follows the tensors.
* Tokens per second: the batch's real tokens (the attention mask's sum, the same for every variant) over the
  measured update's wall time. The tokens the micro-batches compute are shown beside them (padded: rows x longest
  row per micro-batch; packed: the real tokens).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import time
from typing import Any

import torch

VARIANTS = {  # name -> the model.rl settings it changes: a flag's name (its value) or a value
    "today": {},
    "token budget": {"max_tokens_per_micro_batch": "budget"},
    "chunked head": {"logprob_chunk_tokens": "chunk"},
    "budget + chunked": {"max_tokens_per_micro_batch": "budget", "logprob_chunk_tokens": "chunk"},
    "budget + chunked + packed": {"max_tokens_per_micro_batch": "budget", "logprob_chunk_tokens": "chunk",
                                  "pack_rows": True},
}
PROMPT = 16


def lengths_of(args: argparse.Namespace) -> list[int]:
    """Lognormal lengths (median ``--median``, sigma ``--sigma``), cut to the range, the longest at ``--max-len``."""
    gen = torch.Generator().manual_seed(args.seed)
    raw = torch.exp(math.log(args.median) + args.sigma * torch.randn(args.rows, generator=gen))
    lengths = [int(min(max(v, PROMPT + 8), args.max_len)) for v in raw.tolist()]
    lengths[max(range(len(lengths)), key=lengths.__getitem__)] = args.max_len
    return lengths


def trajectories(args: argparse.Namespace):
    """The batch: right-padded rows of ``lengths_of(args)``, a prompt of 16 tokens, a 10% tool output masked."""
    from zerotir.types import Trajectories

    lengths = lengths_of(args)
    b, width = len(lengths), max(lengths)
    gen = torch.Generator().manual_seed(args.seed + 1)
    ids = torch.randint(3, args.vocab, (b, width), generator=gen)
    positions = torch.arange(width)[None, :]
    n = torch.tensor(lengths)[:, None]
    attn = (positions < n).long()
    ids = ids * attn
    response = n - PROMPT
    tool = (positions >= PROMPT + response // 3) & (positions < PROMPT + response // 3 + response // 10)
    action = (positions >= PROMPT) & (positions < n) & ~tool
    zeros = torch.zeros(b, dtype=torch.long)
    return Trajectories(
        input_ids=ids, attention_mask=attn, action_mask=action, logprobs=torch.zeros(b, width),
        prompt_lens=torch.full((b,), PROMPT), response_lens=response[:, 0], group_ids=torch.arange(b) // 2,
        rewards=(torch.arange(b) % 2).float(), num_calls=zeros + 1, num_exec_errors=zeros, num_timeouts=zeros,
        num_sandbox_errors=zeros, truncated=torch.zeros(b, dtype=torch.bool), finish_reasons=["stop"] * b,
        response_texts=["x"] * b, ground_truths=["1"] * b,
    )


def model_of(args: argparse.Namespace):
    from transformers import LlamaForCausalLM

    from zerotir.toy.tiny_model import tiny_llama_config
    from zerotir.toy.tokenizer import build_byte_tokenizer

    config = tiny_llama_config(build_byte_tokenizer(), hidden_size=args.hidden, num_layers=2, num_heads=2,
                               max_position_embeddings=args.max_len + 1)
    config.vocab_size = args.vocab
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def _kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field} (this benchmark measures memory on Linux)")


def measured_update(cfg: Any, traj: Any, actor: torch.nn.Module) -> tuple[float, float, float]:
    """One REINFORCE++ update of ``actor`` on ``traj`` (``prepare_batch`` + ``ppo_update`` + an AdamW step over its
    trained parameters) after a warm-up on the two shortest rows (the optimizer's state): its seconds, its peak
    memory in MiB (module doc), and that peak above the memory before the optimizer existed (its state included)."""
    from zerotir.rl.micro_batches import row_lengths
    from zerotir.rl.update import ppo_update, prepare_batch

    stateless = _kib("VmRSS")
    optimizer = torch.optim.AdamW([p for p in actor.parameters() if p.requires_grad], lr=1e-5)

    def step(has_grad: bool) -> float:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return 0.0

    def update(traj) -> float:
        start = time.perf_counter()
        batch, _ = prepare_batch(cfg, traj, actor, None, None, temperature=1.0, top_p=1.0)
        ppo_update(cfg, batch, actor, None, lambda loss: loss.backward(), step, rl_step=1,
                   generator=torch.Generator().manual_seed(0), temperature=1.0)
        return time.perf_counter() - start

    lengths = row_lengths(traj.attention_mask)
    update(traj.select(lengths.argsort()[:2].tolist()))  # warm-up on the two shortest rows: the optimizer's state
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident size
    before = _kib("VmRSS")
    seconds = update(traj)
    peak = _kib("VmHWM")
    return seconds, (peak - before) / 1024, (peak - stateless) / 1024


def run_variant(args: argparse.Namespace, name: str) -> dict:
    """One variant's measured update (after a warm-up), in this process."""
    from zerotir.config import RLConfig
    from zerotir.rl.micro_batches import micro_batches, padded_tokens, row_lengths

    torch.set_num_threads(args.threads)
    settings = {k: getattr(args, v) if isinstance(v, str) else v for k, v in VARIANTS[name].items()}
    rows = {} if "max_tokens_per_micro_batch" in settings else {"micro_batch_size": args.micro_batch_size}
    cfg = RLConfig(algorithm="reinforce_pp", **rows, **settings)  # the budget replaces micro_batch_size
    traj = trajectories(args)
    seconds, peak_mib, _ = measured_update(cfg, traj, model_of(args))
    lengths = row_lengths(traj.attention_mask)
    chunks = micro_batches(lengths, cfg.micro_batch_size, cfg.max_tokens_per_micro_batch, cfg.pack_rows)
    real = int(lengths.sum())
    # A packed micro-batch computes its real tokens only; a padded one its rows x its longest row.
    computed = real if cfg.pack_rows else sum(padded_tokens(lengths, c) for c in chunks)
    return {"variant": name, "micro_batches": len(chunks), "padded_tokens": computed, "real_tokens": real,
            "peak_mib": peak_mib, "seconds": seconds, "tokens_per_s": real / seconds}


def _child(run, args: argparse.Namespace, name: str, queue) -> None:
    queue.put(run(args, name))


def in_fresh_processes(run, args: argparse.Namespace, names: list[str], seconds_key: str) -> list[dict]:
    """``run(args, name)`` for each name, each in a fresh (spawned) process, printing its peak and seconds."""
    ctx = mp.get_context("spawn")
    results = []
    for name in names:
        queue = ctx.Queue()
        proc = ctx.Process(target=_child, args=(run, args, name, queue))
        proc.start()
        proc.join()  # the result is a few numbers: it fits the queue's pipe before the child exits
        if proc.exitcode != 0:
            raise RuntimeError(f"variant {name!r} failed (exit code {proc.exitcode}; -9: out of memory, try fewer "
                               f"--rows or a smaller --max-len)")
        results.append(queue.get(timeout=10))
        print(f"  {name}: {results[-1]['peak_mib']:.0f} MiB, {results[-1][seconds_key]:.1f} s", flush=True)
    return results


def report(results: list[dict], table_of: Any, as_json: bool) -> None:
    """Print the results' table (``table_of(results)``), the load at the end and, with ``as_json``, the results."""
    print(table_of(results))
    print(f"load at the end {os.getloadavg()[0]:.1f}")
    if as_json:
        print(json.dumps(results))


def table(results: list[dict]) -> str:
    base = results[0]
    header = ("| variant | micro-batches | computed tokens | peak memory of the update (MiB) | x lower | update s | "
              "tokens/s | x faster |")
    lines = [header, "|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['variant']} | {r['micro_batches']} | {r['padded_tokens']} | {r['peak_mib']:.0f} | "
                     f"{base['peak_mib'] / max(r['peak_mib'], 1e-9):.1f} | {r['seconds']:.1f} | "
                     f"{r['tokens_per_s']:.0f} | {r['tokens_per_s'] / base['tokens_per_s']:.2f} |")
    return "\n".join(lines)


def batch_arguments(doc: str, rows: int, median: float, sigma: float, max_len: int) -> argparse.ArgumentParser:
    """The command line of a benchmark of the update on a ``trajectories`` batch (these defaults)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rows", type=int, default=rows, help="trajectories in the batch")
    p.add_argument("--median", type=float, default=median, help="median length (tokens)")
    p.add_argument("--sigma", type=float, default=sigma, help="lognormal sigma of the lengths")
    p.add_argument("--max-len", type=int, default=max_len, help="the longest row (tokens)")
    p.add_argument("--vocab", type=int, default=32768, help="vocabulary")
    p.add_argument("--micro-batch-size", type=int, default=4, help="rows per micro-batch")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the results as JSON too")
    return p


def main() -> None:
    p = batch_arguments(__doc__, rows=16, median=300.0, sigma=1.0, max_len=4096)
    p.add_argument("--hidden", type=int, default=64, help="hidden size of the toy model")
    p.add_argument("--budget", type=int, default=4096, help="max_tokens_per_micro_batch of the budget variants")
    p.add_argument("--chunk", type=int, default=1024, help="logprob_chunk_tokens of the chunked variants")
    args = p.parse_args()
    lengths = lengths_of(args)
    print(f"{args.rows} rows, lengths median {sorted(lengths)[len(lengths) // 2]}, max {max(lengths)}, "
          f"{sum(lengths)} tokens; vocabulary {args.vocab}, hidden {args.hidden}; load {os.getloadavg()[0]:.1f}",
          flush=True)
    report(in_fresh_processes(run_variant, args, list(VARIANTS), "seconds"), table, args.json)


if __name__ == "__main__":
    main()
