"""Decode speed of the transformers engine with 1 and 2 torch threads, on the toy world's model size, interleaved.

    python -m benchmarks.decode_threads [--repeats 5] [--rows 128] [--tokens 64]

Picks ``HFRollout.num_threads``'s default: a random tiny Llama of the toy world's shape (hidden 128, 3 layers,
8 heads, MLP 512: 0.85M parameters), ``--rows`` rows sampled at temperature 1 for exactly ``--tokens`` tokens
(EOS off), with ``num_threads`` 1 and 2 alternating ``--repeats`` times; prints tokens/s of each, the median ratio
and the load average (other jobs on the cores change the answer: a descheduled worker thread stalls every op).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from zerotir.rollout.engine import SamplingParams, generate
from zerotir.rollout.hf_engine import HFEngine
from zerotir.toy.tiny_model import build_tiny_model
from zerotir.toy.tokenizer import build_byte_tokenizer


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rows", type=int, default=128)
    p.add_argument("--tokens", type=int, default=64)
    args = p.parse_args(argv)
    tok = build_byte_tokenizer()
    model = build_tiny_model(tok, hidden_size=128, num_layers=3, num_heads=8, intermediate_size=512, seed=0).eval()
    print(f"model: {sum(q.numel() for q in model.parameters()) / 1e6:.2f}M parameters", flush=True)
    prompts = [tok.encode(f"Q: what is {100 + i}*{7 + i % 13}?\n") for i in range(args.rows)]
    engines = {n: HFEngine(model, tok, max_batch_size=args.rows, num_threads=n) for n in (1, 2)}
    for engine in engines.values():
        engine.eos_ids = set()  # exactly --tokens per row
    params = SamplingParams(temperature=1.0, max_new_tokens=args.tokens, seed=0)
    generate(engines[1], prompts[:8], params)  # warm-up
    rates: dict[int, list[float]] = {1: [], 2: []}
    loads = []
    for r in range(args.repeats):
        for n in ((1, 2) if r % 2 == 0 else (2, 1)):
            start = time.perf_counter()
            out = generate(engines[n], prompts, params)
            rates[n].append(sum(len(s[0].token_ids) for s in out) / (time.perf_counter() - start))
            loads.append(os.getloadavg()[0])
        print(f"  round {r}: 1 thread {rates[1][-1]:.0f} tok/s, 2 threads {rates[2][-1]:.0f} tok/s, "
              f"load {loads[-1]:.1f}", flush=True)
    ratio = statistics.median(b / a for a, b in zip(rates[1], rates[2]))
    result = {"one": statistics.median(rates[1]), "two": statistics.median(rates[2]), "ratio_two_over_one": ratio,
              "load_min": min(loads), "load_max": max(loads)}
    print(f"median: 1 thread {result['one']:.0f} tok/s, 2 threads {result['two']:.0f} tok/s, 2/1 = {ratio:.2f} "
          f"(load {min(loads):.1f}-{max(loads):.1f}, {os.cpu_count()} cores)", flush=True)
    return result


if __name__ == "__main__":
    main()
