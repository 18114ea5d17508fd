"""What dumping rollouts costs the training thread: ``RolloutDumper.on_train_batch_end`` against the write it hands
to the background thread, for a toy-sized step and a paper-sized one, without and with per-token records.

    python -m benchmarks.rollout_dump                 # about 2 minutes on 2 cores

Method. Synthetic scored trajectories (responses of the given length in characters, one code call each with its
output; per-token tensors of one token per 3 characters, all rows trained) go through the real callback with a real
``TensorBoardLogger`` (text samples on) and the byte tokenizer decoding the sampled rows. Per repeat the script
times, on the calling thread, the hook call (what a training step pays: with tokens, the sampled rows copied to CPU
and each row's mean advantage) and then ``flush`` (the write itself: records, token pieces and spans, gzip, rename,
pruning, text samples). Medians of ``--repeats``, for ``token_samples`` 0 (off) and 4 (the default); the load
average is printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.trainer.states import TrainerFn

from callbacks import RolloutDumper
from zerotir.rl.step import BatchInfo, StepResult, TrainedTokens
from zerotir.toy.tokenizer import build_byte_tokenizer
from zerotir.types import ToolCall, Trajectories

SIZES = {"toy": (128, 300), "paper": (2048, 20000)}  # trajectories per step, response characters


def make_rollout(rows: int, chars: int, seed: int, step: int) -> dict:
    """``training_step``'s outputs for one step of ``rows`` scored trajectories of about ``chars`` characters."""
    gen = torch.Generator().manual_seed(seed)
    words = ["Let", "me", "compute", "the", "sum", "of", "x", "=", "42", "and", "then", "check", "it."]
    picks = torch.randint(len(words), (rows, chars // 4), generator=gen).tolist()
    code = "```python\nprint(sum(range(10)))\n```\n```output\n45\n```\n"
    texts = [(" ".join(words[i] for i in p))[: chars - len(code) - 12] + code + "\\boxed{45}" for p in picks]
    prompt, width = 64, 64 + chars // 3
    action = torch.ones(rows, width, dtype=torch.bool)
    action[:, :prompt] = False
    traj = Trajectories(
        input_ids=torch.randint(3, 250, (rows, width), generator=gen),
        attention_mask=torch.ones(rows, width, dtype=torch.long),
        action_mask=action, logprobs=-torch.rand(rows, width, generator=gen) * action,
        versions=torch.where(action, step - 1, -1),
        prompt_lens=torch.full((rows,), prompt), response_lens=torch.full((rows,), chars // 3),
        group_ids=torch.arange(rows) // 16, rewards=(torch.rand(rows, generator=gen) > 0.5).float(),
        num_calls=torch.ones(rows, dtype=torch.long), num_exec_errors=torch.zeros(rows, dtype=torch.long),
        num_timeouts=torch.zeros(rows, dtype=torch.long), num_sandbox_errors=torch.zeros(rows, dtype=torch.long),
        truncated=torch.zeros(rows, dtype=torch.bool), finish_reasons=["stop"] * rows, response_texts=texts,
        ground_truths=["45"] * rows, tool_calls=[[ToolCall("print(sum(range(10)))\n", "ok", "45")]] * rows)
    groups = (rows + 15) // 16
    batch = BatchInfo(prompts=[f"Q{g}: what is 0 + ... + 9?" for g in range(groups)],
                      problem_ids=[f"q{g}" for g in range(groups)], sources=["bench"] * groups, weight_version=0)
    trained = TrainedTokens(torch.arange(rows), -torch.rand(rows, width, generator=gen),
                            torch.randn(rows, width, generator=gen) * action, torch.rand(rows, width, generator=gen))
    return {"step": StepResult(rl_step=step, rollout=traj, kept=torch.ones(rows, dtype=torch.bool), filter=None,
                               stats={}, batch=batch, trained=trained)}


def measure(name: str, rows: int, chars: int, repeats: int, token_samples: int) -> None:
    with tempfile.TemporaryDirectory() as root:
        logger = TensorBoardLogger(root, name="tb", version="")
        trainer = SimpleNamespace(default_root_dir=root, global_rank=0, world_size=1, is_global_zero=True,
                                  loggers=[logger], sanity_checking=False, state=SimpleNamespace(fn=TrainerFn.FITTING))
        module = SimpleNamespace(rl_step=0, tokenizer=build_byte_tokenizer())
        dumper = RolloutDumper(keep_last=2, token_samples=token_samples)
        dumper.setup(trainer, module, "fit")
        hook, write = [], []
        for k in range(repeats):
            outputs = make_rollout(rows, chars, k, step=k + 1)
            module.rl_step = k + 1
            start = time.perf_counter()
            dumper.on_train_batch_end(trainer, module, outputs, None, 0)
            hook.append(time.perf_counter() - start)
            dumper._writer.flush()  # noqa: SLF001 - the benchmark waits for the write to time it
            write.append(time.perf_counter() - start)
        dumper.on_fit_end(trainer, module)
        size = (Path(root) / "rollouts" / f"step_{repeats}.jsonl.gz").stat().st_size
        logger.experiment.close()
    print(f"{name:6s} {rows:5d} x {chars:6d} chars, token_samples {token_samples}: hook {1e3 * statistics.median(hook):7.2f} ms | write "
          f"{1e3 * statistics.median(write):8.1f} ms | file {size / 2**20:6.2f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", choices=sorted(SIZES), default=["toy", "paper"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--token_samples", type=int, nargs="+", default=[0, 4])
    args = parser.parse_args()
    print(f"load average {os.getloadavg()}")
    for name in args.sizes:
        for token_samples in args.token_samples:
            measure(name, *SIZES[name], args.repeats, token_samples)
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
