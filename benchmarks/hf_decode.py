"""The transformers engine's decode against a plain ``model.generate`` of the same batch, side by side in one run.

    python -m benchmarks.hf_decode [--repeats 3] [--prompts 16] [--samples 8] [--tokens 128] [--threads 2] [--profile]

The toy shape of a training step: ``--prompts`` prompts x ``--samples`` samples, exactly ``--tokens`` new tokens each
(EOS off in both arms, so both decode the same number of tokens), temperature 1, ``--threads`` torch threads, on a
random tiny Llama of the toy world's shape (hidden 128, 3 layers, 8 heads, MLP 512). Arms, alternating
``--repeats`` times:

- ``engine``: ``HFEngine`` through the engine protocol (``zerotir.rollout.engine.generate``: every sample submitted,
  then engine steps until none runs), what the tool loop drives in a run without tools;
- ``generate``: transformers' ``model.generate`` on the same prompts repeated ``--samples`` times, left-padded, one
  call (static batch, no requests joining or leaving).

Prints tokens/s of each, the median ratio engine / generate and the load average (other jobs on the cores change
both arms, the ratio less). ``--profile`` adds one profiled engine run: the functions where its seconds go.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import time

import torch

from zerotir.rollout.engine import SamplingParams, generate
from zerotir.rollout.hf_engine import HFEngine
from zerotir.toy.tiny_model import build_tiny_model
from zerotir.toy.tokenizer import build_byte_tokenizer


def _prompts(tok, n: int) -> list[list[int]]:
    return [tok.encode(f"Q: what is {100 + i}*{7 + i % 13}? Think, then answer.\n") for i in range(n)]


def engine_arm(engine: HFEngine, prompts: list[list[int]], samples: int, tokens: int, seed: int) -> int:
    """Decode every sample through the engine protocol; the number of tokens generated."""
    params = SamplingParams(n=samples, temperature=1.0, max_new_tokens=tokens, seed=seed)
    out = generate(engine, prompts, params)
    return sum(len(s.token_ids) for group in out for s in group)


def generate_arm(model, prompts: list[list[int]], samples: int, tokens: int, pad_id: int, seed: int) -> int:
    """The same batch through ``model.generate`` (left-padded, one call); the number of tokens generated."""
    rows = [p for p in prompts for _ in range(samples)]
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad_id] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                             max_new_tokens=tokens, min_new_tokens=tokens, pad_token_id=pad_id)
    return int(out[:, width:].numel())


def profile_engine(engine: HFEngine, prompts: list[list[int]], samples: int, tokens: int, top: int = 18) -> str:
    """One engine run under cProfile: the functions with the most seconds of their own."""
    profiler = cProfile.Profile()
    profiler.enable()
    engine_arm(engine, prompts, samples, tokens, seed=99)
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--profile", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    tok = build_byte_tokenizer()
    model = build_tiny_model(tok, hidden_size=128, num_layers=3, num_heads=8, intermediate_size=512, seed=0).eval()
    model.generation_config.eos_token_id = None  # exactly --tokens per row in both arms
    rows = args.prompts * args.samples
    engine = HFEngine(model, tok, max_batch_size=rows, num_threads=args.threads)
    engine.eos_ids = set()
    prompts = _prompts(tok, args.prompts)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    engine_arm(engine, prompts[:2], 2, 8, seed=0)  # warm-up, both arms
    generate_arm(model, prompts[:2], 2, 8, pad_id, seed=0)
    rates: dict[str, list[float]] = {"engine": [], "generate": []}
    loads = []
    for r in range(args.repeats):
        for arm in (("engine", "generate") if r % 2 == 0 else ("generate", "engine")):
            start = time.perf_counter()
            n = (engine_arm(engine, prompts, args.samples, args.tokens, seed=r) if arm == "engine"
                 else generate_arm(model, prompts, args.samples, args.tokens, pad_id, seed=r))
            rates[arm].append(n / (time.perf_counter() - start))
            loads.append(os.getloadavg()[0])
        print(f"  round {r}: engine {rates['engine'][-1]:.0f} tok/s, generate {rates['generate'][-1]:.0f} tok/s, "
              f"load {loads[-1]:.1f}", flush=True)
    ratio = statistics.median(e / g for e, g in zip(rates["engine"], rates["generate"]))
    result = {"engine": statistics.median(rates["engine"]), "generate": statistics.median(rates["generate"]),
              "ratio_engine_over_generate": ratio, "load_min": min(loads), "load_max": max(loads)}
    print(f"median ({args.prompts} prompts x {args.samples} samples, {args.tokens} tokens, {args.threads} threads): "
          f"engine {result['engine']:.0f} tok/s, generate {result['generate']:.0f} tok/s, engine / generate = "
          f"{ratio:.2f} (load {min(loads):.1f}-{max(loads):.1f}, {os.cpu_count()} cores)", flush=True)
    if args.profile:
        print(profile_engine(engine, prompts, args.samples, args.tokens), flush=True)
    return result


if __name__ == "__main__":
    main()
