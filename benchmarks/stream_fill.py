"""How full the streaming schedule keeps one engine: batch shares against streamed prompt groups of the same
prompts on one ``HFEngine``, side by side in one run.

    python -m benchmarks.stream_fill [--prompts 16] [--samples 4] [--room 16] [--tokens 64] [--threads 2]

A random tiny Llama (the toy world's shape) samples at temperature 1 with no tools; a few stop characters end each
trajectory at a length that varies as a rambler's would (at most ``--tokens``). Arms, run one after the other
through ``GroupStream`` (``zerotir.fleet.stream``) with the same seeds:

- ``shares``: batch shares of ``--room`` trajectories each (``max_in_flight`` 0: one share at a time, every share
  one tool loop), what a run without streaming does;
- ``streamed``: one group per prompt, admitted while the trajectories in flight stay within ``--room``
  (``max_in_flight``), all stepping the one engine through their ``EngineShare``.

Prints, per arm, the engine steps, the tokens sampled, tokens per engine step, the mean requests running in the
engine at each step (at most ``--room``), seconds, and the load average (other jobs on the cores change the
seconds, not the counts).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Hashable
from dataclasses import dataclass, replace

import torch

from zerotir.config import ToolConfig
from zerotir.fleet.stream import GroupStream, Job
from zerotir.rollout.agent_loop import Schedule
from zerotir.rollout.engine import EngineWrapper, Sample, SamplingParams
from zerotir.rollout.hf_engine import HFEngine
from zerotir.toy.tiny_model import build_tiny_model
from zerotir.toy.tokenizer import build_byte_tokenizer
from zerotir.tools import Toolbox

NO_TOOL = ToolConfig(max_tool_calls=0)
STOPS = ["q", "z", "x", "j", "k", "Q", "Z", "X"]  # rare enough that lengths spread up to the budget
TIMEOUT_S = 600.0


class MeteredEngine(EngineWrapper):
    """An engine's protocol calls, counting its steps and the requests running at each."""

    def __init__(self, engine: HFEngine):
        super().__init__(engine)
        self.steps = self.running = 0

    def step(self) -> list[tuple[Hashable, Sample]]:
        self.steps += 1
        self.running += self.engine.num_running
        return self.engine.step()


@dataclass
class Fill:
    """One arm's counts: engine steps, tokens sampled, requests running summed over the steps, seconds."""

    steps: int
    tokens: int
    running: int
    seconds: float

    def line(self, name: str) -> str:
        return (f"{name:>9}: {self.steps:5d} engine steps, {self.tokens:6d} tokens, "
                f"{self.tokens / max(self.steps, 1):6.2f} tokens/step, {self.running / max(self.steps, 1):6.2f} "
                f"running/step, {self.seconds:6.2f} s")


def jobs(prompts: list[list[int]], params: SamplingParams, per_job: int) -> list[Job]:
    """The prompts as jobs of ``per_job`` prompts each, every job seeded as its first row in one batch."""
    out = []
    for start in range(0, len(prompts), per_job):
        chunk = prompts[start:start + per_job]
        seed = params.seed + start * params.n
        out.append(Job(start, chunk, [""] * len(chunk), replace(params, seed=seed)))
    return out


def run_arm(engine: HFEngine, tok, prompts: list[list[int]], params: SamplingParams, per_job: int,
            room: int) -> Fill:
    """The prompts through a ``GroupStream`` of ``room`` (0: one job at a time), jobs of ``per_job`` prompts."""
    metered = MeteredEngine(engine)
    stream = GroupStream(metered, tok, NO_TOOL, Schedule(), Toolbox.build(NO_TOOL), max_in_flight=room)
    work = jobs(prompts, params, per_job)
    start = time.perf_counter()
    try:
        stream.submit(work)
        got = stream.take([job.key for job in work], TIMEOUT_S)
    finally:
        stream.close()
    seconds = time.perf_counter() - start
    tokens = sum(int(traj.action_mask.sum()) for traj in got)
    return Fill(metered.steps, tokens, metered.running, seconds)


def main(argv: list[str] | None = None) -> dict[str, Fill]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--samples", type=int, default=4, help="samples per prompt (a group's size)")
    p.add_argument("--room", type=int, default=16, help="trajectories in flight at most (a share's size)")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.room % args.samples:
        p.error(f"--room {args.room} must be a multiple of --samples {args.samples} (whole groups per share)")
    torch.set_num_threads(args.threads)
    tok = build_byte_tokenizer()
    model = build_tiny_model(tok, hidden_size=128, num_layers=3, num_heads=8, intermediate_size=512, seed=0).eval()
    engine = HFEngine(model, tok, max_batch_size=args.room, num_threads=args.threads)
    prompts = [tok.encode(f"Q: what is {100 + i}*{7 + i % 13}? Think, then answer.\n") for i in range(args.prompts)]
    params = SamplingParams(n=args.samples, temperature=1.0, max_new_tokens=args.tokens, seed=args.seed, stop=STOPS)
    run_arm(engine, tok, prompts[:1], replace(params, max_new_tokens=4), 1, args.room)  # warm-up
    load = os.getloadavg()[0]
    result = {"shares": run_arm(engine, tok, prompts, params, args.room // args.samples, 0),
              "streamed": run_arm(engine, tok, prompts, params, 1, args.room)}
    print(f"{args.prompts} prompts x {args.samples} samples, room {args.room}, at most {args.tokens} tokens, "
          f"{args.threads} threads (load {load:.1f}-{os.getloadavg()[0]:.1f}, {os.cpu_count()} cores):")
    for name, fill in result.items():
        print(fill.line(name), flush=True)
    return result


if __name__ == "__main__":
    main()
