"""Where the time of an RL step goes on CPU, and how fast the update is against a bare forward + backward.

    python -m benchmarks.train_step                          # REINFORCE++, about 2-3 minutes on 2 cores
    python -m benchmarks.train_step --algorithm ppo --steps 8

Method. A tiny Llama (byte tokenizer, hidden 128, 2 layers) is pretrained for about a minute on one-digit additions
answered in text or through a tool call (``tests/e2e/base_model.py``, cached under ``runs/bench_train_step_base``), so
that it writes code blocks that really run. Then, in one process:

1. Phase shares: ``--steps`` RL steps of ``ZeroTIRModule`` in a Lightning ``Trainer`` with the embedded sandbox,
   ``--prompts`` x ``--n`` trajectories per step, the pass-rate filter off (every step updates). The module's own
   timings (``time/*``) are averaged over the steps after the first (warm-up) and shown as shares of the step.
2. Update throughput: on the trajectories of the last step, alternating ``--repeats`` times (medians reported):
   * update: what the module's update phase runs (``rl_step.prepare_batch`` + ``rl_step.ppo_update``: old
     log-probs, reference / critic passes as configured, advantages, the clipped loss, backward, clipping, AdamW);
   * bare: a plain forward, masked next-token cross-entropy, backward and AdamW step over the same micro-batches
     (same rows, same trimmed widths), on copies of the same models (the actor, and for PPO the critic with a plain
     squared-error loss). The reference model's forward (kl_coef > 0) is extra work the bare step does not do.
   Tokens = rows x trimmed width summed over the micro-batches (identical for both). The headline is
   ``update tok/s / bare tok/s`` (target >= 0.7).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time
from pathlib import Path
from typing import get_args

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from tests.e2e.base_model import TEMPLATE, pretrain, write_problems
from zerotir.rl import algorithms as A
from zerotir.data.datamodule import PromptDataModule
from zerotir.config import (
    Algorithm, BaseModelConfig, OptimConfig, RLConfig, SamplingConfig, SandboxConfig, ToolConfig)
from zerotir.module import ZeroTIRModule
from zerotir.rl.update import iter_rows, ppo_update, prepare_batch

REPO = Path(__file__).resolve().parents[1]

PHASES = ("generation", "sandbox", "reward", "update", "weight_sync")


class Recorder(Callback):
    """Keeps each step's timings and the scored trajectories of the last step."""

    def __init__(self) -> None:
        self.timings: list[dict[str, float]] = []
        self.last = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.timings.append(dict(outputs["step"].timings))
        self.last = outputs["step"].rollout


def run_steps(args: argparse.Namespace, base: Path, train_file: Path) -> tuple[ZeroTIRModule, Recorder]:
    pl.seed_everything(0)
    module = ZeroTIRModule(BaseModelConfig(str(base)), rl=RLConfig(algorithm=args.algorithm, kl_coef=args.kl_coef,
                                                                   micro_batch_size=args.micro_batch_size),
                           optim=OptimConfig(lr=1e-4), sampling=SamplingConfig(n=args.n, max_response_tokens=64),
                           tool=ToolConfig(max_tool_calls=2, max_output_chars=128, sandbox=SandboxConfig(workers=1)))
    data = PromptDataModule(train_files=[str(train_file)], template=TEMPLATE, tokenizer=str(base),
                            prompts_per_step=args.prompts, test_files=[])
    recorder = Recorder()
    trainer = pl.Trainer(accelerator="cpu", max_steps=args.steps, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[recorder], default_root_dir=REPO / "runs")
    trainer.fit(module, datamodule=data)
    return module, recorder


def phase_shares(timings: list[dict[str, float]]) -> dict[str, float]:
    steady = timings[1:] or timings
    mean = {k: statistics.mean(t.get(k, 0.0) for t in steady) for k in (*PHASES, "step")}
    mean["other"] = mean["step"] - sum(mean[k] for k in PHASES)
    return mean


def micro_batches(traj, size: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    out = []
    for rows in iter_rows(len(traj), size):
        width = int(traj.attention_mask[rows].sum(1).max())
        out.append((traj.input_ids[rows, :width], traj.attention_mask[rows, :width], traj.action_mask[rows, :width]))
    return out


def bare_step(model, critic, opt, batches) -> None:
    """Forward, masked next-token cross-entropy (token mean over the step), backward, AdamW: nothing else. With a
    critic (PPO), it is trained too, on a plain masked squared error, so both sides train the same models."""
    total = sum(int(m[:, 1:].sum()) for _, _, m in batches)
    for ids, attn, mask in batches:
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2).float(), ids[:, 1:], reduction="none")
        loss = A.masked_sum(nll, mask[:, 1:]) / total
        if critic is not None:
            loss = loss + A.masked_sum(critic(ids, attn)[:, :-1] ** 2, mask[:, 1:]) / total
        loss.backward()
    torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


def update_step(module: ZeroTIRModule, actor, critic, opt, traj) -> None:
    """The module's update phase on plain torch (the same rl_step functions, without Lightning's wrappers)."""
    params = [p for g in opt.param_groups for p in g["params"]]

    def step(has_grad: bool) -> float:
        norm = float(torch.nn.utils.clip_grad_norm_(params, 1.0)) if has_grad else 0.0
        opt.step()
        opt.zero_grad(set_to_none=True)
        return norm

    for m in (actor, critic):
        if m is not None:
            m.eval()
    sampling = module.sampling
    batch, _ = prepare_batch(module.rl, traj, actor, module.ref_model, critic, temperature=sampling.temperature,
                             top_p=sampling.top_p)
    for m in (actor, critic):
        if m is not None:
            m.train()
    ppo_update(module.rl, batch, actor, critic, lambda loss: loss.backward(), step, rl_step=0,
               generator=torch.Generator().manual_seed(0), temperature=sampling.temperature)


def throughput(module: ZeroTIRModule, traj, repeats: int) -> dict[str, float]:
    actor, critic = copy.deepcopy(module.actor), copy.deepcopy(module.critic)
    groups = [{"params": list(actor.parameters())}] + ([{"params": list(critic.parameters())}] if critic else [])
    update_opt = torch.optim.AdamW(groups, lr=1e-6)
    bare_model = copy.deepcopy(module.actor).train()
    bare_critic = copy.deepcopy(module.critic)
    bare_opt = torch.optim.AdamW([p for m in (bare_model, bare_critic) if m is not None for p in m.parameters()],
                                 lr=1e-6)
    batches = micro_batches(traj, module.rl.micro_batch_size)
    tokens = sum(ids.numel() for ids, _, _ in batches)
    times = {"update": [], "bare": []}
    for _ in range(repeats):
        for name, fn in (("bare", lambda: bare_step(bare_model, bare_critic, bare_opt, batches)),
                         ("update", lambda: update_step(module, actor, critic, update_opt, traj))):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"tokens": tokens, "update_tok_s": tokens / med["update"], "bare_tok_s": tokens / med["bare"],
            "ratio": med["bare"] / med["update"], "update_s": med["update"], "bare_s": med["bare"]}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--algorithm", default="reinforce_pp", choices=list(get_args(Algorithm)))
    p.add_argument("--kl_coef", type=float, default=0.0)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--micro_batch_size", type=int, default=8)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", type=str, default=None, help="also write the results here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    base = pretrain(REPO / "runs" / "bench_train_step_base")
    train_file = write_problems(REPO / "runs" / "bench_train_step_base" / "train.jsonl", 256, seed=1)
    module, recorder = run_steps(args, base, train_file)
    shares = phase_shares(recorder.timings)
    result = {"algorithm": args.algorithm, "steps": args.steps, "trajectories_per_step": args.prompts * args.n,
              "phase_seconds": shares, "throughput": throughput(module, recorder.last, args.repeats)}
    print(f"\nRL step on CPU ({args.algorithm}, {args.prompts} prompts x {args.n} samples, mean of steps 2..{args.steps})")
    for k in (*PHASES, "other"):
        print(f"  {k:<12} {shares[k]:7.3f} s  {100 * shares[k] / shares['step']:5.1f} %")
    print(f"  {'step':<12} {shares['step']:7.3f} s")
    t = result["throughput"]
    print(f"\nUpdate vs bare forward+backward over the same {t['tokens']} tokens (median of {args.repeats}):")
    print(f"  update {t['update_tok_s']:9.0f} tok/s   bare {t['bare_tok_s']:9.0f} tok/s   ratio {t['ratio']:.2f} "
          f"(target >= 0.7)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
