"""What a slow judge costs the trainer of the thread host and the fleet: the seconds it waits for a step's verdicts
after the step's last trajectory has ended, scored after the batch at the old judge's concurrency (8) against
scored as each prompt group comes back with the judge's concurrency sized to the batch (``max_concurrency``, 64),
and between them the sized concurrency alone (after the batch, 64).

    python -m benchmarks.judge_overhead                  # 2048 trajectories, judge latency 0.5 s: about 4 minutes
    python -m benchmarks.judge_overhead --quick          # 64 trajectories, 0.05 s: a few seconds

Method. The judge is a scripted OpenAI-compatible endpoint (FastAPI on uvicorn, in a process of its own) that
answers CORRECT after ``--latency`` seconds and serves at most ``--endpoint_concurrency`` calls at once (a
semaphore: what a real server's batch allows). A step's ``--trajectories`` end over ``--span`` seconds in prompt
groups of ``--n`` (the groups' end times drawn uniformly, seeded: an engine's completions), each response a text of
its own (no cached verdict). The trainer takes the groups as the fleet's schedule does: it waits for the next
group's end (``EarlyScores.wait``: in a worker thread, while its event loop scores), hands the group over
(``EarlyScores.ended``) and, after the last, takes the batch's scores (``score_trajectories``). ``after``: the same
groups, the whole batch scored once the last has ended (what the thread host and the fleet did), the judge at
``--old_concurrency`` and at ``--max_concurrency``. Trainer idle: the seconds from the last group's end until the
batch is scored. The endpoint's own bound, latency x trajectories / endpoint concurrency, is what no client can beat
once the batch is over; the target is ``early`` within that bound plus 5%.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import textwrap
import time

SERVER = textwrap.dedent("""
    import asyncio, socket, sys
    import uvicorn
    from fastapi import FastAPI
    app, latency, bound = FastAPI(), float(sys.argv[1]), int(sys.argv[2])
    gate = None

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "judge", "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat():
        global gate
        gate = gate or asyncio.Semaphore(bound)
        async with gate:
            await asyncio.sleep(latency)
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": "CORRECT"}}]}

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4096)
    print(sock.getsockname()[1], flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", backlog=4096)).run(sockets=[sock])
""")
QUICK = {"trajectories": 64, "latency": 0.05, "span": 0.5, "endpoint_concurrency": 16, "old_concurrency": 2,
         "max_concurrency": 16}


def ways(args: argparse.Namespace) -> list[tuple[str, int]]:
    """The arms, in the order they run: before (after the batch, the old concurrency), the concurrency alone
    (after the batch, sized), and both (as groups end, sized)."""
    return [("after", args.old_concurrency), ("after", args.max_concurrency), ("early", args.max_concurrency)]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trajectories", type=int, default=2048, help="trajectories of the step")
    parser.add_argument("--n", type=int, default=8, help="trajectories per prompt group (they end together)")
    parser.add_argument("--latency", type=float, default=0.5, help="seconds the judge takes per call")
    parser.add_argument("--endpoint_concurrency", type=int, default=64, help="calls the endpoint serves at once")
    parser.add_argument("--span", type=float, default=30.0, help="seconds over which the step's groups end")
    parser.add_argument("--old_concurrency", type=int, default=8, help="the judge's bound, scored after the batch")
    parser.add_argument("--max_concurrency", type=int, default=64, help="the judge's bound, scored as groups end")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help=f"a small run for the tests: {QUICK}")
    args = parser.parse_args(argv)
    if args.quick:
        vars(args).update(QUICK)
    if args.trajectories % args.n:
        parser.error(f"--trajectories={args.trajectories} must be a multiple of --n={args.n}")
    return args


def step_batch(trajectories: int, n: int) -> tuple[list[dict], object]:
    """The step's prompt rows and trajectories (every response a text of its own, one token each: only the text is
    judged)."""
    import torch

    from zerotir.types import Trajectories

    groups = trajectories // n
    rows = [{"problem": f"{g} + {g}", "answer": str(2 * g), "batch_index": 0, "position": g} for g in range(groups)]
    zeros, ones = torch.zeros(trajectories, 1, dtype=torch.long), torch.ones(trajectories, 1, dtype=torch.long)
    counts = torch.zeros(trajectories, dtype=torch.long)
    traj = Trajectories(ones, ones, ones.bool(), zeros.float(), counts, counts + 1,
                        torch.arange(groups).repeat_interleave(n), counts.float(), counts, counts, counts, counts,
                        counts.bool(), finish_reasons=["stop"] * trajectories,
                        response_texts=[f"response {i}: \\boxed{{{2 * (i // n)}}}" for i in range(trajectories)],
                        ground_truths=[row["answer"] for row in rows for _ in range(n)])
    return rows, traj


def run_step(url: str, way: str, concurrency: int, ends: list[float], rows: list[dict], traj) -> dict[str, float]:
    """One step the ``way`` given ("after" or "early"); its seconds and verdicts."""
    from zerotir.rewards import JudgeReward
    from zerotir.rollout.scoring import EarlyScores, score_trajectories

    judge = JudgeReward(base_url=url, max_concurrency=concurrency, timeout_s=600.0, cache_size=0)
    early = EarlyScores(judge) if way == "early" else None
    start = time.perf_counter()
    for group, end in enumerate(ends):  # the groups in the order they end
        left = start + end - time.perf_counter()
        if left > 0:
            (early.wait if early else lambda f, *a: f(*a))(time.sleep, left)
        if early is not None:
            one = traj.select(traj.group_ids == group)
            one.group_ids = one.group_ids - group
            early.ended(rows[group], one)
    last = time.perf_counter()
    score_trajectories(judge, traj, rows, early)
    done = time.perf_counter()
    stats = judge.stats()
    return {"idle": done - last, "step": done - start, "correct": float(traj.corrects.sum()),
            "calls": stats["judge_calls"], "failures": stats["judge_failures"]}


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    args = parse(argv)
    from zerotir.rewards import JudgeReward

    rng = random.Random(args.seed)
    groups = args.trajectories // args.n
    ends = sorted(rng.uniform(0.0, args.span) for _ in range(groups))  # group g of the step ends at ends[g]
    rows, traj = step_batch(args.trajectories, args.n)
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(args.latency), str(args.endpoint_concurrency)],
                              stdout=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{int(server.stdout.readline())}/v1"
        JudgeReward(base_url=url).start()  # the endpoint answers
        results = {f"{way}, {concurrency}": run_step(url, way, concurrency, ends, rows, traj)
                   for way, concurrency in ways(args)}
    finally:
        server.kill()
        server.wait()
    bound = args.latency * args.trajectories / args.endpoint_concurrency
    print(f"{args.trajectories} trajectories in groups of {args.n} ending over {args.span:g} s; judge latency "
          f"{args.latency:g} s, endpoint {args.endpoint_concurrency} calls at once; load {os.getloadavg()[0]:.1f}")
    print("| way | judge max_concurrency | step | trainer idle after the last group | correct | calls |")
    print("|---|---:|---:|---:|---:|---:|")
    for (way, concurrency), got in zip(ways(args), results.values()):
        print(f"| {way} | {concurrency} | {got['step']:.2f} s | {got['idle']:.2f} s | {got['correct']:.0f} | "
              f"{got['calls']:.0f} |")
    met = results[f"early, {args.max_concurrency}"]["idle"] <= 1.05 * bound
    print(f"endpoint bound (latency x calls / endpoint concurrency): {bound:.2f} s; early idle within it + 5%: "
          f"{'yes' if met else 'no'}")
    return results


if __name__ == "__main__":
    main()
