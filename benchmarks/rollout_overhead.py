"""Overhead of the tool loop: tokens per second with real tool calls against the same engine without tools.

    python benchmarks/rollout_overhead.py            # about 2 minutes on 2 cores
    python benchmarks/rollout_overhead.py --sweep    # also HFEngine's plain tokens/s by model size and batch

Method. A random model almost never writes a code fence, so the script first pretrains a tiny Llama (byte tokenizer,
hidden 64, 2 layers, 0.16M parameters) for ``--train_steps`` steps on synthetic documents in the shape of a
tool-integrated solution (``Q: what is A*B?`` / a ```python block that prints it / the ```output block / a boxed
answer; a third of them with two code blocks). Sampled at temperature 1 on held-out questions, it then opens and
closes code blocks on its own, and the tool loop really runs them in a real local sandbox server
(``sandbox.local_sandbox``) and injects the results.

Measured in one run, alternating ``--repeats`` times (medians reported), with three sandboxes:

* ``real``: ``SandboxClient`` against the local server, as the trainer runs it (``run_many``: one ``/run_batch``
  request per round, chunked to the server's queue size);
* ``real, /run_batch``: the same server through a minimal hand-written ``/run_batch`` caller (a reference for the
  client's own overhead: the two rows should agree);
* ``instant``: an object that answers at once with a fixed output: the loop's own cost, without the sandbox's.

For each, the tool loop (``rollout_sync`` over ``--prompts`` x ``--n`` rows; wall time of the whole call; tokens =
tokens the policy sampled, ``action_mask``) against, on the same model and prompts with the same engine class:

* same tokens per row, no tools (the headline's denominator): one ``generate`` call in which every row decodes
  exactly as many tokens as it sampled in the tool run (per-row ``max_new_tokens``, EOS disabled, no stop string);
* uniform lengths (reference): every row decodes the mean length: a full batch to the end, the best case;
* natural (reference): one ``generate`` call with EOS on and no stop strings; the model writes its own imagined
  output blocks and ends when it likes.

Also printed: CPU seconds of this process and of the sandbox server (with its workers) during the tool run: on a
2-core machine the sandbox's CPU, not the loop, is what the real-sandbox ratio pays for.

The headline is ``tool tok/s / same-tokens-per-row tok/s`` (target >= 0.8 on CPU).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

import httpx
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sandbox import ExecResult, ExecStatus, SandboxClient, local_sandbox  # noqa: E402 - after the path set-up
from sandbox.result import parse_run_code_response  # noqa: E402
from zerotir.rollout.agent_loop import ToolConfig, rollout_sync  # noqa: E402
from zerotir.rollout.engine import SamplingParams  # noqa: E402
from zerotir.rollout.hf_engine import HFEngine  # noqa: E402
from zerotir.toy.tiny_model import build_tiny_model  # noqa: E402
from zerotir.toy.tokenizer import build_byte_tokenizer  # noqa: E402

TARGET = 0.8


def document(rng: random.Random) -> str:
    """One synthetic tool-integrated solution (the shape a ZeroTIR rollout takes)."""
    a, b = rng.randint(10, 999), rng.randint(10, 999)
    if rng.random() < 2 / 3:
        return (f"Q: what is {a}*{b}?\n```python\nprint({a}*{b})\n```\n```output\n{a * b}\n```\n"
                f"A: \\boxed{{{a * b}}}")
    c = rng.randint(10, 99)
    return (f"Q: what is {a}*{b}+{c}?\n```python\nx = {a}*{b}\nprint(x)\n```\n```output\n{a * b}\n```\n"
            f"```python\nprint({a * b}+{c})\n```\n```output\n{a * b + c}\n```\nA: \\boxed{{{a * b + c}}}")


def pretrain(tok, steps: int, batch: int, seed: int, hidden: int, layers: int) -> torch.nn.Module:
    """A tiny Llama trained briefly on ``document`` s (next-token loss, AdamW)."""
    rng = random.Random(seed)
    model = build_tiny_model(tok, hidden_size=hidden, num_layers=layers, seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for step in range(steps):
        docs = [tok.encode(document(rng)) + [tok.eos_token_id] for _ in range(batch)]
        width = max(map(len, docs))
        ids = torch.full((batch, width), tok.pad_token_id)
        mask = torch.zeros_like(ids)
        for i, d in enumerate(docs):
            ids[i, : len(d)], mask[i, : len(d)] = torch.tensor(d), 1
        loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"  pretrain step {step:4d}  loss {loss.item():.3f}", flush=True)
    return model.eval()


_TICK = os.sysconf("SC_CLK_TCK")


def sandbox_cpu(url: str) -> float:
    """CPU seconds spent so far by the sandbox server and its workers (snippet children included once reaped)."""
    pid = httpx.get(url + "/health", timeout=10, trust_env=False).json()["server_pid"]
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        pids = [pid, *map(int, f.read().split())]
    total = 0.0
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                total += sum(int(v) for v in f.read().rsplit(")", 1)[1].split()[11:15]) / _TICK
        except FileNotFoundError:  # a worker replaced since the listing
            continue
    return total


class BatchEndpointSandbox:
    """The same server reached with one ``POST /run_batch`` per round (results parsed by the sandbox package's own
    ``parse_run_code_response``), with none of the client's retry / chunking logic: a reference for the client's
    own overhead (~0.03 ms of client CPU per snippet; per-snippet ``/run_code`` requests cost 2-10 ms each)."""

    def __init__(self, url: str):
        self.url = url
        self.http: httpx.AsyncClient | None = None

    async def run_many(self, codes: list[str], *, run_timeout: float | None = None) -> list[ExecResult]:
        if self.http is None:
            self.http = httpx.AsyncClient(timeout=120, trust_env=False)
        start = time.monotonic()
        body = {"requests": [{"code": c, "language": "python", "run_timeout": run_timeout} for c in codes]}
        answer = await self.http.post(self.url + "/run_batch", json=body)
        answer.raise_for_status()
        wall = time.monotonic() - start
        return [parse_run_code_response(r, wall) for r in answer.json()["results"]]

    async def run(self, code: str, *, run_timeout: float | None = None) -> ExecResult:
        return (await self.run_many([code], run_timeout=run_timeout))[0]


class InstantSandbox:
    """Answers every snippet at once with a fixed output: isolates the loop's own cost from the sandbox's."""

    async def run(self, code: str, *, run_timeout: float | None = None) -> ExecResult:
        return ExecResult(ExecStatus.OK, "0\n", "", 0.0, 0)


def time_tool_loop(engine, tok, sandbox, prompts, params, tool) -> tuple[float, list[int], int, float, dict]:
    """Wall time, sampled tokens per row, injected tokens, mean calls per row, the loop's timings."""
    start = time.perf_counter()
    traj, timings = rollout_sync(engine, tok, sandbox, prompts, params, tool)
    wall = time.perf_counter() - start
    sampled = traj.action_mask.sum(1).tolist()
    injected = int(traj.response_lens.sum()) - sum(sampled)
    return wall, sampled, injected, float(traj.num_calls.float().mean()), timings


def time_generate(engine, prompts, params) -> tuple[float, int]:
    start = time.perf_counter()
    out = engine.generate(prompts, params)
    return time.perf_counter() - start, sum(len(s.token_ids) for samples in out for s in samples)


def measure(fixed, engine, tok, sandbox, prompts, args, seed, url: str) -> dict[str, float]:
    """One tool-loop run and its no-tool baselines; tokens per second of each."""
    params = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.max_response_tokens, seed=seed)
    tool = ToolConfig(max_tool_calls=args.max_tool_calls, max_response_tokens=args.max_response_tokens,
                      tokens_per_call=args.tokens_per_call or None)
    cpu_before, own_before = sandbox_cpu(url), time.process_time()
    wall, sampled, injected, calls, timings = time_tool_loop(engine, tok, sandbox, prompts, params, tool)
    server_cpu, own_cpu = sandbox_cpu(url) - cpu_before, time.process_time() - own_before
    rows = [p for p in prompts for _ in range(args.n)]
    # Same tokens row by row: each row decodes exactly what it sampled in the tool run, in one call.
    per_row = [SamplingParams(max_new_tokens=k, temperature=1.0, seed=seed) for k in sampled]
    swall, stokens = time_generate(fixed, rows, per_row)
    uwall, utokens = time_generate(fixed, prompts, SamplingParams(n=args.n, temperature=1.0, seed=seed,
                                                                  max_new_tokens=round(sum(sampled) / len(rows))))
    nwall, ntokens = time_generate(engine, prompts, params)
    load = os.getloadavg()[0]  # other jobs on the cores slow the sandbox and the engine unevenly: say so
    print(f"    load {load:.1f} | tool {sum(sampled)} sampled + {injected} injected tokens in {wall:.2f}s (generation "
          f"{timings['generation']:.2f}s, sandbox wait {timings['sandbox']:.2f}s, {calls:.2f} calls/row; CPU "
          f"seconds: this process {own_cpu:.2f}, sandbox server {server_cpu:.2f}) | same "
          f"tokens per row {stokens} in {swall:.2f}s | uniform {utokens} in {uwall:.2f}s | natural {ntokens} in "
          f"{nwall:.2f}s", flush=True)
    return {"tool": sum(sampled) / wall, "same": stokens / swall, "uniform": utokens / uwall,
            "natural": ntokens / nwall, "load": load}


def overhead(args: argparse.Namespace) -> None:
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    tok = build_byte_tokenizer()
    print(f"pretraining a tiny model for {args.train_steps} steps ...", flush=True)
    model = pretrain(tok, args.train_steps, 32, args.seed, args.hidden, args.layers)
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters", flush=True)
    rng = random.Random(args.seed + 1)
    prompts = [tok.encode(f"Q: what is {rng.randint(10, 999)}*{rng.randint(10, 999)}?\n") for _ in range(args.prompts)]
    rows = args.prompts * args.n
    engine = HFEngine(model, tok, max_batch_size=rows)
    fixed = HFEngine(model, tok, max_batch_size=rows)
    fixed.eos_ids = set()  # decode exactly max_new_tokens per row
    results: dict[str, list[dict[str, float]]] = {"real": [], "real, /run_batch": [], "instant": []}
    with local_sandbox(workers=args.sandbox_workers) as urls:
        sandboxes = {"real": SandboxClient(urls), "real, /run_batch": BatchEndpointSandbox(urls[0]),
                     "instant": InstantSandbox()}
        warm = ToolConfig(max_response_tokens=32)
        time_tool_loop(engine, tok, sandboxes["real"], prompts[:2], SamplingParams(n=2, max_new_tokens=32), warm)
        for r in range(args.repeats):
            for name, sandbox in sandboxes.items():
                print(f"  run {r}, {name} sandbox:", flush=True)
                results[name].append(measure(fixed, engine, tok, sandbox, prompts, args, args.seed + r, urls[0]))
    report(results, args, rows)


def report(results: dict[str, list[dict[str, float]]], args: argparse.Namespace, rows: int) -> None:
    med = statistics.median
    loads = [x["load"] for runs in results.values() for x in runs]
    print(f"\nhidden {args.hidden}, {args.layers} layers; {rows} rows ({args.prompts} prompts x {args.n}), budget "
          f"{args.max_response_tokens}, tokens_per_call "
          f"{args.tokens_per_call or 'None (lockstep)'}; 1-minute load average {min(loads):.1f}-{max(loads):.1f}; "
          f"tokens/s, medians of {args.repeats}:\n")
    print("| sandbox | tool loop | same tokens per row, no tools | ratio | uniform lengths | natural |")
    print("|---|---|---|---|---|---|")
    ratios = {}
    for name, runs in results.items():
        ratios[name] = med([x["tool"] / x["same"] for x in runs])
        print(f"| {name} | {med([x['tool'] for x in runs]):.0f} | {med([x['same'] for x in runs]):.0f} | "
              f"{ratios[name]:.2f} | {med([x['uniform'] for x in runs]):.0f} | {med([x['natural'] for x in runs]):.0f} |")
    verdict = "meets" if ratios["real"] >= TARGET else "MISSES"
    print(f"\nratio tool loop / same tokens without tools (real sandbox): {ratios['real']:.2f} -> {verdict} the "
          f"target {TARGET}; with one /run_batch per round: {ratios['real, /run_batch']:.2f}; the loop alone "
          f"(instant sandbox): {ratios['instant']:.2f}")


def sweep(args: argparse.Namespace) -> None:
    """HFEngine's plain decoding speed (random weights, no EOS, fixed length) by model size and batch."""
    tok = build_byte_tokenizer()
    prompt = tok.encode("Q: what is 123*456?\n")
    print("\n| hidden | layers | params | batch | tokens | seconds | tokens/s |\n|---|---|---|---|---|---|---|")
    for hidden in (64, 96, 160):
        model = build_tiny_model(tok, hidden_size=hidden, num_layers=2).eval()
        params_m = sum(p.numel() for p in model.parameters()) / 1e6
        for batch in (64, 128):
            engine = HFEngine(model, tok, max_batch_size=batch)
            engine.eos_ids = set()
            engine.generate([prompt], SamplingParams(n=batch, max_new_tokens=8))
            wall, tokens = time_generate(engine, [prompt], SamplingParams(n=batch, max_new_tokens=args.sweep_tokens,
                                                                         seed=0))
            print(f"| {hidden} | 2 | {params_m:.2f}M | {batch} | {tokens} | {wall:.2f} | {tokens / wall:.0f} |",
                  flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=16, help="questions per rollout")
    parser.add_argument("--n", type=int, default=8, help="samples per question")
    parser.add_argument("--max_response_tokens", type=int, default=256, help="response budget per row")
    parser.add_argument("--max_tool_calls", type=int, default=4, help="code blocks executed per row at most")
    parser.add_argument("--tokens_per_call", type=int, default=ToolConfig.tokens_per_call,
                        help="ToolConfig.tokens_per_call (0 = None, strict lockstep)")
    parser.add_argument("--train_steps", type=int, default=300, help="pretraining steps of the tiny model")
    parser.add_argument("--hidden", type=int, default=64, help="hidden size of the tiny Llama (128: ~0.6M params)")
    parser.add_argument("--layers", type=int, default=2, help="layers of the tiny Llama")
    parser.add_argument("--repeats", type=int, default=3, help="alternating measurements; medians are reported")
    parser.add_argument("--sandbox_workers", type=int, default=2, help="sandbox worker processes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads for pretraining (1: tiny matmuls stall on a shared, loaded CPU)")
    parser.add_argument("--sweep", action="store_true", help="also print HFEngine tokens/s by model size and batch")
    parser.add_argument("--sweep_tokens", type=int, default=256, help="tokens per row in the sweep")
    args = parser.parse_args()
    overhead(args)
    if args.sweep:
        sweep(args)


if __name__ == "__main__":
    main()
