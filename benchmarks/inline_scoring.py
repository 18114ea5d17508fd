"""The in-line step with a slow reward (the judge with a scripted latency), scored after the batch or as each
trajectory finishes.

    python -m benchmarks.inline_scoring                       # judge latency 0.2 s, 16 prompts x 4, ~1 min
    python -m benchmarks.inline_scoring --latency 0.5 --max_concurrency 4

Every source scores through ``zerotir.rollout.scoring.score_trajectories``; the in-line source starts it early
(``EarlyScores``: each trajectory scored the moment it finishes, while the others still generate). This measures,
alternating, on the toy base (``data/toy_base``, the transformers engine, sampling at ``--temperature``, no tools) the
step (the rollout and the scoring) and the wait for the verdicts after the rollout, both ways: ``after`` (the whole
batch scored once the rollout is over) and ``early``. The reward is the ``judge`` against a local
OpenAI-compatible server in a process of its own that answers CORRECT after ``--latency`` seconds.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SERVER = textwrap.dedent("""
    import asyncio, socket, sys
    import uvicorn
    from fastapi import FastAPI
    app, latency = FastAPI(), float(sys.argv[1])

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "judge", "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat():
        await asyncio.sleep(latency)
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": "CORRECT"}}]}

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    print(sock.getsockname()[1], flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
""")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency", type=float, default=0.2, help="seconds the judge takes per call")
    parser.add_argument("--max_concurrency", type=int, default=8, help="the judge's calls in flight at most")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max_new_tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=1.6,
                        help="1.6 spreads the toy base's response lengths (12 to 256 tokens); at 1.0 nearly every "
                             "response ends at the same step, and nothing is left to overlap")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from zerotir.config import ToolConfig
    from zerotir.rewards import JudgeReward
    from zerotir.rollout.agent_loop import rollout_sync
    from zerotir.rollout.engine import SamplingParams
    from zerotir.rollout.hf_engine import HFEngine
    from zerotir.rollout.scoring import EarlyScores, score_trajectories
    from zerotir.toy.template import toy_prompt

    torch.set_num_threads(1)
    judge_process = subprocess.Popen([sys.executable, "-c", SERVER, str(args.latency)], stdout=subprocess.PIPE,
                                     text=True)
    try:
        url = f"http://127.0.0.1:{int(judge_process.stdout.readline())}/v1"
        JudgeReward(base_url=url).start()  # the server answers
        tok = AutoTokenizer.from_pretrained(REPO / "data" / "toy_base")
        model = AutoModelForCausalLM.from_pretrained(REPO / "data" / "toy_base").eval()
        engine = HFEngine(model, tok, max_batch_size=args.prompts * args.n)
        problems = [f"{100 + 37 * i} * {200 + 53 * i}" for i in range(args.prompts)]
        prompts = [tok.encode(toy_prompt(p), add_special_tokens=False) for p in problems]
        rows = [{"problem": p, "answer": "0"} for p in problems]
        times: dict[str, list[tuple[float, float]]] = {"after": [], "early": []}
        for repeat in range(args.repeats):
            params = SamplingParams(n=args.n, temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=repeat)
            for mode in times:
                judge = JudgeReward(base_url=url, max_concurrency=args.max_concurrency, timeout_s=30.0)  # no cache
                early = EarlyScores(judge, rows, tok) if mode == "early" else None
                start = time.perf_counter()
                traj, _ = rollout_sync(engine, tok, None, prompts, params, ToolConfig(max_tool_calls=0),
                                       on_end=early.finished if early else None)
                wait = score_trajectories(judge, traj, rows, early)
                times[mode].append((time.perf_counter() - start, wait))
    finally:
        judge_process.kill()
        judge_process.wait()
    print(f"{args.prompts} prompts x {args.n}, temperature {args.temperature}, judge latency {args.latency} s, max_concurrency "
          f"{args.max_concurrency}, median of {args.repeats}:")
    for mode, runs in times.items():
        step, wait = statistics.median(s for s, _ in runs), statistics.median(w for _, w in runs)
        print(f"  {mode:5s}: step {step:.2f} s, waiting for the scores after the rollout {wait:.2f} s")


if __name__ == "__main__":
    main()
