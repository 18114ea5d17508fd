"""Overhead of the tool loop: tokens per second with real tool calls against the same engine without tools.

    python benchmarks/rollout_overhead.py                    # both workloads, about 6 minutes on 2 cores
    python benchmarks/rollout_overhead.py --profiles dense   # the stress workload only, about 2 minutes
    python benchmarks/rollout_overhead.py --sweep            # also HFEngine's plain tokens/s by model size and batch

Method. A random model almost never writes a code fence, so for each workload (``--profiles``) the script first
pretrains a tiny Llama (byte tokenizer, hidden 64, 2 layers, 0.16M parameters) for ``--train_steps`` steps on
synthetic documents of that shape. Sampled at temperature 1 on held-out questions, it then opens and closes code
blocks on its own, and the tool loop really runs them in a real local sandbox server (``sandbox.local_sandbox``)
and injects the results. Two workloads:

* ``paper`` (the headline): shaped like a ZeroTIR rollout. Sentences of reasoning, one code block (two in one
  document of ten: the paper finds over 90% of successful trajectories use exactly one execution), the output, a
  check, the boxed answer; budget 1024. About 600 sampled tokens per call: still denser in calls than the paper's
  responses of thousands of tokens.
* ``dense`` (stress): ``Q: what is A*B?``, a code block at once, its output, the answer; budget 256. About 60
  sampled tokens per call, and half as many injected: every sandbox call weighs about as much as the whole row's
  decoding.

Measured in one run, alternating ``--repeats`` times (medians reported), for two sandboxes and both schedules of the
tool loop (``HFRollout.schedule``: rounds of ``generate`` calls, or one continuously batched decode session):

* ``real``: ``SandboxClient`` against the local server, as the trainer runs it (``run_many``: one ``/run_batch``
  request per batch of finished code blocks);
* ``instant``: an object that answers at once with a fixed output: the loop's own cost, without the sandbox's.

For each, the tool loop (``rollout_sync`` over ``--prompts`` x ``--n`` rows; wall time of the whole call; tokens =
tokens the policy sampled, ``action_mask``) against, on the same model and prompts with the same engine class:

* same tokens per row, no tools (the headline's denominator): one ``generate`` call in which every row decodes
  exactly as many tokens as it sampled in the tool run (per-row ``max_new_tokens``, EOS disabled, no stop string);
* natural (reference): one ``generate`` call with EOS on and no stop strings; the model writes its own imagined
  output blocks and ends when it likes.

Also printed: CPU seconds of this process and of the sandbox server (with its workers) during the tool run: on a
2-core machine the sandbox's CPU competes with decoding.

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
from zerotir.config import DEFAULT_TOKENS_PER_CALL, ToolConfig  # noqa: E402
from zerotir.rollout.agent_loop import Schedule, rollout_sync  # noqa: E402
from zerotir.rollout.engine import SamplingParams  # noqa: E402
from zerotir.rollout.hf_engine import HFEngine  # noqa: E402
from zerotir.toy.tiny_model import build_tiny_model  # noqa: E402
from zerotir.toy.tokenizer import build_byte_tokenizer  # noqa: E402

TARGET = 0.8


def dense_document(rng: random.Random) -> str:
    """The ``dense`` profile: a code block every ~25 sampled tokens (a stress case, far denser than ZeroTIR)."""
    a, b = rng.randint(10, 999), rng.randint(10, 999)
    if rng.random() < 2 / 3:
        return (f"Q: what is {a}*{b}?\n```python\nprint({a}*{b})\n```\n```output\n{a * b}\n```\n"
                f"A: \\boxed{{{a * b}}}")
    c = rng.randint(10, 99)
    return (f"Q: what is {a}*{b}+{c}?\n```python\nx = {a}*{b}\nprint(x)\n```\n```output\n{a * b}\n```\n"
            f"```python\nprint({a * b}+{c})\n```\n```output\n{a * b + c}\n```\nA: \\boxed{{{a * b + c}}}")


_THINK = ("Let me think about this step by step.", "We need the product of {a} and {b}.",
          "The first factor is {a} and the second one is {b}.", "Multiplying by hand is slow and easy to get wrong.",
          "A rough estimate first: about {ra} times {rb}.", "So the result should be near {est}.",
          "Python can compute this exactly, so I will use it.", "I will write a short program and check its output.",
          "The last digit of the product is the last digit of {la} times {lb}.", "Both numbers are positive.")
_AFTER = ("The program printed {p}.", "That agrees with the estimate of {est}.", "The last digit checks out too.",
          "So the product is {p}.")


def paper_document(rng: random.Random) -> str:
    """The ``paper`` profile, shaped like a ZeroTIR rollout: several sentences of reasoning, one code block (two in
    one document of ten: "over 90% of successful trajectories use exactly one code execution"), the output, a
    check, the boxed answer. About 400 sampled tokens per call with the byte tokenizer, i.e. still denser in tool
    calls than the paper's responses of thousands of tokens."""
    a, b = rng.randint(10, 9999), rng.randint(10, 9999)
    p, ra, rb = a * b, round(a, -2), round(b, -2)
    fill = {"a": a, "b": b, "p": p, "ra": ra, "rb": rb, "est": ra * rb, "la": a % 10, "lb": b % 10}
    think = " ".join(rng.choice(_THINK) for _ in range(rng.randint(5, 12))).format(**fill)
    after = " ".join(rng.choice(_AFTER) for _ in range(rng.randint(2, 4))).format(**fill)
    if rng.random() < 0.9:
        code = f"```python\nprint({a}*{b})\n```\n```output\n{p}\n```\n"
    else:
        c = rng.randint(10, 99)
        code = (f"```python\nx = {a}*{b}\nprint(x)\n```\n```output\n{p}\n```\nNow add {c}. "
                f"```python\nprint({p}+{c})\n```\n```output\n{p + c}\n```\n")
        p += c
    return f"Q: what is {a}*{b}?\n{think}\n{code}{after}\nA: \\boxed{{{p}}}"


PROFILES = {"paper": paper_document, "dense": dense_document}
BUDGET = {"paper": 1024, "dense": 256}  # response tokens per row
TRAIN_TOKENS = 2048  # tokens per pretraining batch (batch = this / the profile's longest document, at least 4)


def pretrain(tok, document, steps: int, batch: int, seed: int, hidden: int, layers: int) -> torch.nn.Module:
    """A tiny Llama trained briefly on ``document(rng)`` s (next-token loss, AdamW)."""
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


class InstantSandbox:
    """Answers every snippet at once with a fixed output: isolates the loop's own cost from the sandbox's."""

    async def run(self, code: str, *, run_timeout: float | None = None) -> ExecResult:
        return ExecResult(ExecStatus.OK, "0\n", "", 0.0, 0)


def time_tool_loop(engine, tok, sandbox, prompts, params, tool,
                   schedule=Schedule()) -> tuple[float, list[int], int, float, dict]:
    """Wall time, sampled tokens per row, injected tokens, mean calls per row, the loop's timings."""
    start = time.perf_counter()
    traj, timings = rollout_sync(engine, tok, sandbox, prompts, params, tool, schedule=schedule)
    wall = time.perf_counter() - start
    sampled = traj.action_mask.sum(1).tolist()
    injected = int(traj.response_lens.sum()) - sum(sampled)
    return wall, sampled, injected, float(traj.num_calls.float().mean()), timings


def time_generate(engine, prompts, params) -> tuple[float, int]:
    start = time.perf_counter()
    out = engine.generate(prompts, params)
    return time.perf_counter() - start, sum(len(s.token_ids) for samples in out for s in samples)


def measure(fixed, engine, tok, sandbox, prompts, args, budget: int, seed: int, url: str,
            continuous: bool) -> dict[str, float]:
    """One tool-loop run and its no-tool baselines; tokens per second of each."""
    params = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=budget, seed=seed)
    tool = ToolConfig(max_tool_calls=args.max_tool_calls, max_output_chars=1024)
    rounds = Schedule("rounds", args.tokens_per_call) if args.tokens_per_call else Schedule("lockstep")
    schedule = Schedule("continuous") if continuous else rounds
    cpu_before, own_before = sandbox_cpu(url), time.process_time()
    wall, sampled, injected, calls, timings = time_tool_loop(engine, tok, sandbox, prompts, params, tool, schedule)
    server_cpu, own_cpu = sandbox_cpu(url) - cpu_before, time.process_time() - own_before
    rows = [p for p in prompts for _ in range(args.n)]
    # Same tokens row by row: each row decodes exactly what it sampled in the tool run, in one call.
    per_row = [SamplingParams(max_new_tokens=k, temperature=1.0, seed=seed) for k in sampled]
    swall, stokens = time_generate(fixed, rows, per_row)
    nwall, ntokens = time_generate(engine, prompts, params)
    load = os.getloadavg()[0]  # other jobs on the cores slow the sandbox and the engine unevenly: say so
    print(f"    load {load:.1f} | tool {sum(sampled)} sampled + {injected} injected tokens in {wall:.2f}s (generation "
          f"{timings['generation']:.2f}s, sandbox wait {timings['sandbox']:.2f}s, {calls:.2f} calls/row; CPU "
          f"seconds: this process {own_cpu:.2f}, sandbox server {server_cpu:.2f}) | same tokens per row {stokens} "
          f"in {swall:.2f}s | natural {ntokens} in {nwall:.2f}s", flush=True)
    return {"tool": sum(sampled) / wall, "same": stokens / swall, "natural": ntokens / nwall, "load": load,
            "per_call": sum(sampled) / max(1.0, calls * len(rows)), "injected_share": injected / sum(sampled),
            "calls": calls}


def overhead(args: argparse.Namespace, profile: str) -> dict[str, float]:
    """Pretrain a model on the profile's documents and measure; returns the median ratio per configuration."""
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    tok = build_byte_tokenizer()
    budget = args.max_response_tokens or BUDGET[profile]
    batch = max(4, TRAIN_TOKENS // max(len(PROFILES[profile](random.Random(k))) for k in range(64)))
    print(f"\n== profile {profile}: pretraining a tiny model for {args.train_steps} steps (batch {batch}) ...",
          flush=True)
    model = pretrain(tok, PROFILES[profile], args.train_steps, batch, args.seed, args.hidden, args.layers)
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters", flush=True)
    rng = random.Random(args.seed + 1)
    # Factors of 2-4 digits: prompts of different lengths, as real problems are (with prompts all of one length the
    # plain decode would get attention without a padding mask, a fast path no real batch takes).
    prompts = [tok.encode(f"Q: what is {rng.randint(10, 9999)}*{rng.randint(10, 9999)}?\n")
               for _ in range(args.prompts)]
    rows = args.prompts * args.n
    engine = HFEngine(model, tok, max_batch_size=rows)
    fixed = HFEngine(model, tok, max_batch_size=rows)
    fixed.eos_ids = set()  # decode exactly max_new_tokens per row
    schedules = {"rounds": False, "continuous": True}
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    with local_sandbox(workers=args.sandbox_workers) as urls:
        sandboxes = {"real": SandboxClient(urls), "instant": InstantSandbox()}
        time_tool_loop(engine, tok, sandboxes["real"], prompts[:2], SamplingParams(n=2, max_new_tokens=32),
                       ToolConfig())
        for r in range(args.repeats):
            for name, sandbox in sandboxes.items():
                for schedule, continuous in schedules.items():
                    print(f"  run {r}, {name} sandbox, {schedule}:", flush=True)
                    results.setdefault((name, schedule), []).append(
                        measure(fixed, engine, tok, sandbox, prompts, args, budget, args.seed + r, urls[0],
                                continuous))
    return report(results, args, rows, profile, budget)


def report(results: dict[tuple[str, str], list[dict[str, float]]], args: argparse.Namespace, rows: int,
           profile: str, budget: int) -> dict[str, float]:
    med = statistics.median
    loads = [x["load"] for runs in results.values() for x in runs]
    print(f"\nprofile {profile}: hidden {args.hidden}, {args.layers} layers; {rows} rows ({args.prompts} prompts x "
          f"{args.n}), budget {budget}, rounds of tokens_per_call {args.tokens_per_call or 'None (lockstep)'}; "
          f"1-minute load average {min(loads):.1f}-{max(loads):.1f}; medians of {args.repeats}:\n")
    print("| sandbox | schedule | sampled tokens per call | injected / sampled | tool loop tok/s | same tokens per "
          "row, no tools | ratio | natural, no tools |")
    print("|---|---|---|---|---|---|---|---|")
    ratios = {}
    for (name, schedule), runs in results.items():
        ratios[f"{name}, {schedule}"] = ratio = med([x["tool"] / x["same"] for x in runs])
        print(f"| {name} | {schedule} | {med([x['per_call'] for x in runs]):.0f} | "
              f"{med([x['injected_share'] for x in runs]):.2f} | {med([x['tool'] for x in runs]):.0f} | "
              f"{med([x['same'] for x in runs]):.0f} | {ratio:.2f} | {med([x['natural'] for x in runs]):.0f} |")
    calls = med([x["calls"] for runs in results.values() for x in runs])
    if calls < 0.5:
        print(f"\nWARNING: only {calls:.2f} tool calls per row: this model rarely writes code, so these ratios say "
              f"little about the tool loop; pretrain it longer (--train_steps)")
    best = max(("rounds", "continuous"), key=lambda sch: ratios[f"real, {sch}"])
    verdict = "meets" if ratios[f"real, {best}"] >= TARGET else "MISSES"
    print(f"\nprofile {profile}: ratio tool loop / same tokens without tools, real sandbox: rounds "
          f"{ratios['real, rounds']:.2f}, continuous {ratios['real, continuous']:.2f} -> the better {verdict} the "
          f"target {TARGET}; the loop alone (instant sandbox): rounds {ratios['instant, rounds']:.2f}, continuous "
          f"{ratios['instant, continuous']:.2f}", flush=True)
    return ratios


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
    parser.add_argument("--profiles", default="paper,dense",
                        help="comma-separated workloads: paper (ZeroTIR-shaped) and / or dense (stress)")
    parser.add_argument("--max_response_tokens", type=int, default=0,
                        help="response budget per row (0: the profile's, paper 1024, dense 256)")
    parser.add_argument("--max_tool_calls", type=int, default=4, help="code blocks executed per row at most")
    parser.add_argument("--tokens_per_call", type=int, default=DEFAULT_TOKENS_PER_CALL,
                        help="tokens per engine call of the rounds schedule (0 = lockstep)")
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
    profiles = [p for p in args.profiles.split(",") if p]
    unknown = [p for p in profiles if p not in PROFILES]
    if unknown or not profiles:
        parser.error(f"--profiles: unknown {unknown}; choose from {sorted(PROFILES)}")
    ratios = {p: overhead(args, p) for p in profiles}
    print(f"\nsummary, tool loop / same tokens without tools (target {TARGET}):")
    for p, r in ratios.items():
        print(f"  {p}: " + ", ".join(f"{k} {v:.2f}" for k, v in r.items()))
    if args.sweep:
        sweep(args)


if __name__ == "__main__":
    main()
