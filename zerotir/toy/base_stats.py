"""Measure a toy model on held-out questions with the real tool loop: how often it writes code, how often it is right.

The same machinery as RL: ``HFEngine`` sampling, ``agent_loop.rollout_sync`` with a real sandbox server (a local one
is started unless URLs are given), the outcome reward of ``zerotir.rewards.verify``. For the base model this answers the
questions ZeroTIR starts from: does it rarely open a code block (aim < 20%)? is it almost never right without code on
hard questions? and when it does write code, how often does that lead to the right boxed answer?

``python -m zerotir.toy.base_stats --model data/toy_base [--n 256 --samples 4]`` prints the JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Hashable, Iterator
from pathlib import Path
from typing import Any

import torch

from zerotir.cli.console import StepDisplay
from zerotir.config import ToolConfig
from zerotir.rewards.verify import score
from zerotir.rollout.agent_loop import Schedule, rollout_sync
from zerotir.rollout.engine import EngineWrapper, SamplingParams
from zerotir.rollout.hf_engine import HFEngine
from zerotir.toy.tasks import Question, heldout_set
from zerotir.toy.template import toy_prompt


@contextlib.contextmanager
def _sandbox_client(urls: list[str] | None) -> Iterator[object]:
    """A ``SandboxClient`` on ``urls``, or on a local server started (and stopped) here."""
    from sandbox import SandboxClient, local_sandbox

    if urls:
        yield SandboxClient(urls)
        return
    with local_sandbox(workers=1) as local_urls:
        yield SandboxClient(local_urls)


PROGRESS_EVERY = 16  # engine steps (a token for every running answer) between two progress lines


class ReportingEngine(EngineWrapper):
    """A measurement's engine that reports its progress: a line per ``every`` engine steps through a pipe, and one
    after 8 s without (a step's own time keeps the gap under 10 s; ``StepDisplay``), a live bar in a terminal. The
    measurement samples every answer a token at a time, for minutes on a loaded machine; without these lines it
    would run silently."""

    def __init__(self, engine: Any, display: StepDisplay) -> None:
        super().__init__(engine)
        self.display, self.steps = display, 0

    def step(self) -> list[tuple[Hashable, Any]]:
        done = self.engine.step()
        self.steps += 1
        self.display.update(self.steps, None, {"answers running": str(self.engine.num_running)})
        return done


def _rate(hits: int, total: int) -> float | None:
    return round(hits / total, 4) if total else None


def measure_base(
    model_dir: str | Path,
    n: int = 256,
    samples: int = 1,
    seed: int = 0,
    heldout_n: int = 256,
    heldout_seed: int = 1234,
    kinds: str = "hard",
    temperature: float = 1.0,
    max_response_tokens: int = 192,
    max_tool_calls: int = 4,
    sandbox_urls: list[str] | None = None,
    progress: bool = False,
) -> dict:
    """Sample ``samples`` answers to each of the first ``n`` held-out questions and report the rates.

    Args:
        model_dir: a toy model folder (model + tokenizer).
        n: questions, taken from the start of the held-out set (``heldout_n``, ``heldout_seed``, ``kinds``).
        samples: answers per question.
        seed: sampling seed.
        temperature: sampling temperature (1.0: the model's own distribution).
        max_response_tokens: response budget (sampled + injected tokens); a longer response scores 0.
        max_tool_calls: code blocks executed per answer.
        sandbox_urls: sandbox servers to use; None starts a local one for the duration of the call.
        progress: report on stderr while sampling (:class:`ReportingEngine`).

    Returns:
        ``code_rate`` (answers with >= 1 executed code block), ``accuracy``, ``accuracy_no_code`` (among answers
        without code), ``code_run_accuracy`` (among answers with code), ``exec_error_rate`` (per execution),
        ``truncation_rate``, ``mean_response_tokens``, counts and ``seconds``.
    """
    if n < 1 or n > heldout_n or samples < 1:
        raise ValueError(f"n={n}, samples={samples}: need 1 <= n <= heldout_n={heldout_n} and samples >= 1")
    questions = heldout_set(heldout_n, heldout_seed, kinds)[:n]
    stats = measure_questions(model_dir, questions, samples, seed, temperature, max_response_tokens, max_tool_calls,
                              sandbox_urls, progress)
    return {**stats, "kinds": kinds}


def measure_questions(
    model_dir: str | Path,
    questions: list[Question],
    samples: int = 1,
    seed: int = 0,
    temperature: float = 1.0,
    max_response_tokens: int = 192,
    max_tool_calls: int = 4,
    sandbox_urls: list[str] | None = None,
    progress: bool = False,
) -> dict:
    """The rates of :func:`measure_base` on the given questions (any world's), in the toy prompt."""
    if not questions or samples < 1:
        raise ValueError(f"{len(questions)} questions, samples={samples}: need at least one of each")
    # Every answer in one batch: the lockstep schedule keeps a row that stopped at its code block in its batch slot
    # until all rows have stopped; with fewer slots than answers the rest start only in the slots of stopped rows,
    # whose keys / values are then computed again (``hf_session.DecodeSession._evict_parked``).
    engine: Any = HFEngine(str(model_dir), max_batch_size=len(questions) * samples)
    tok = engine.tokenizer
    if progress:
        engine = ReportingEngine(engine, StepDisplay(f"toy-base: base stats ({len(questions) * samples} answers), "
                                                     "engine step", every=PROGRESS_EVERY, quiet_s=8.0))
    prompts = [tok(toy_prompt(q.problem), add_special_tokens=False)["input_ids"] for q in questions]
    params = SamplingParams(n=samples, temperature=temperature, max_new_tokens=max_response_tokens, seed=seed)
    tool = ToolConfig(max_tool_calls=max_tool_calls, max_output_chars=1024)
    start = time.monotonic()
    with torch.inference_mode(), _sandbox_client(sandbox_urls) as client:
        traj, _ = rollout_sync(engine, tok, client, prompts, params, tool, [q.answer for q in questions],
                               Schedule("lockstep"))  # every row a step at a time: the same numbers every run
    if progress:
        engine.display.close()
    rewards = [score(text, truth, bool(cut)) for text, truth, cut
               in zip(traj.response_texts, traj.ground_truths, traj.truncated.tolist(), strict=True)]
    used = traj.used_tool.tolist()  # the toy prompt's one tool is python
    code_hits = sum(r for r, u in zip(rewards, used, strict=True) if u)
    plain_hits = sum(r for r, u in zip(rewards, used, strict=True) if not u)
    total, with_code = len(rewards), sum(used)
    calls = int(traj.num_calls.sum())
    return {
        "n_answers": total,
        "code_rate": _rate(with_code, total),
        "accuracy": _rate(int(sum(rewards)), total),
        "accuracy_no_code": _rate(int(plain_hits), total - with_code),
        "code_run_accuracy": _rate(int(code_hits), with_code),
        "answers_with_code": with_code,
        "exec_error_rate": _rate(int(traj.num_exec_errors.sum()), calls),
        "multi_call_rate": _rate(int((traj.num_calls >= 2).sum()), total),
        "truncation_rate": _rate(int(traj.truncated.sum()), total),
        "mean_response_tokens": round(float(traj.response_lens.float().mean()), 1),
        "temperature": temperature,
        "seconds": round(time.monotonic() - start, 1),
    }


def main(argv: list[str] | None = None) -> dict:
    """``python -m zerotir.toy.base_stats``: measure a toy model folder and print the JSON."""
    parser = argparse.ArgumentParser(prog="python -m zerotir.toy.base_stats", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="toy model folder")
    parser.add_argument("--n", type=int, default=256, help="held-out questions")
    parser.add_argument("--samples", type=int, default=1, help="answers per question")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kinds", default="hard", help="'hard', 'easy', 'all' or kind names")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    stats = measure_base(args.model, n=args.n, samples=args.samples, seed=args.seed, kinds=args.kinds,
                         temperature=args.temperature)
    print(json.dumps(stats, indent=2))
    return stats


if __name__ == "__main__":
    main()
