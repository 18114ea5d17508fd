"""LoRA against full fine-tuning on CPU: the peak memory and speed of the RL update, and the bytes and seconds of the
weight push to an engine, side by side in one run on one small Qwen2.

    python -m benchmarks.lora                      # the docs/results.md table
    python -m benchmarks.lora --rows 4 --max-len 256   # smaller and quicker
    python -m benchmarks.lora --chunk 0            # the LM head's logits whole (no logprob_chunk_tokens)
    python -m benchmarks.lora --toy-world          # the toy world's finding instead (benchmarks/lora_toy.py)

Method. A random Qwen2 of hidden 512, 8 layers, 8 heads (2 key / value heads) and a 32k vocabulary (``--vocab``):
the cost does not depend on what the model knows. Arms: ``full`` (every weight trained) and ``lora r8`` /
``lora r64`` (``peft.get_peft_model`` with a LoRA of that rank on every projection, alpha = 2 x rank, the base
frozen). Each arm runs in a fresh process: a warm-up update on the two shortest rows (the optimizer's state), then
the measured update on the batch (``benchmarks.update_memory.trajectories``: ``--rows`` lognormal lengths up to
``--max-len``), both ``prepare_batch`` + ``ppo_update`` (REINFORCE++, one pass) with an AdamW step over the trained
parameters, the log-probs chunked as a real run computes them (``model.rl.logprob_chunk_tokens``: ``--chunk`` tokens
of the LM head's logits at a time, so that the 32k-wide logits of a micro-batch do not dominate the peak and the
weights, their gradients and Adam's state, what LoRA saves, show); then one push of the actor through the fleet's weight group (``zerotir.fleet.weight_push.push_weights``
over gloo on loopback, the receiving engine a thread of the same process that drops what it gets): full weights,
or only the adapter (``push_adapter``).

* Peak memory of the update: the peak resident memory during the measured update (as ``benchmarks.update_memory``
  measures it) above the resident memory of the model before the optimizer existed: the optimizer's state, the
  gradients and the activations, what LoRA saves.
* Update tokens per second: the batch's real tokens over the measured update's wall time.
* Push bytes and seconds: the push's ``PushStats`` (tensor bytes sent; begin to end).

Targets: LoRA's push bytes >= 50x smaller, its peak update memory >= 2x lower.

``--toy-world``: the toy world's finding instead, ``benchmarks.lora_toy`` with its defaults: does LoRA RL reach 80%
held-out accuracy and code use from the shipped base, and in how many steps against full fine-tuning (RL seeds 0 1 2,
its rule and verdict, into ``runs/lora_toy``).
"""

from __future__ import annotations

import argparse
import os
from concurrent.futures import ThreadPoolExecutor

import torch

from benchmarks.update_memory import batch_arguments, in_fresh_processes, measured_update, report, trajectories

ARMS = {"full": None, "lora r8": 8, "lora r64": 64}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def model_of(args: argparse.Namespace, rank: int | None) -> torch.nn.Module:
    """The random Qwen2; with ``rank`` wrapped in a peft LoRA of that rank."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    base = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=args.vocab, hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
        num_key_value_heads=2, max_position_embeddings=args.max_len + 1, tie_word_embeddings=False))
    if rank is None:
        return base
    import peft

    return peft.get_peft_model(base, peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS))


class _Drop:
    """The receiving engine: takes full weights or an adapter and keeps nothing."""

    def update_weights(self, named_tensors) -> None:
        pass

    def update_adapter(self, tensors, config) -> None:
        pass

    def adapter_path(self, actor) -> str:
        return "adapter"  # it takes a LoRA actor's adapter (RolloutEngine.adapter_path)


def push_once(actor: torch.nn.Module) -> dict:
    """One push of ``actor`` through a weight group of this thread (sender) and another (receiver)."""
    from zerotir.fleet.weight_group import GroupAddress, form_weight_group, free_port
    from zerotir.fleet.weight_push import WeightSender, push_weights, receive_push

    address = GroupAddress("127.0.0.1", free_port("127.0.0.1"))

    def receiver() -> None:
        group = form_weight_group(address, 1, 2, "cpu", 300.0)
        receive_push(group, _Drop())
        receive_push(group, _Drop())  # the stop

    with ThreadPoolExecutor(1) as pool:
        done = pool.submit(receiver)
        sender = WeightSender(form_weight_group(address, 0, 2, "cpu", 300.0))
        stats = push_weights(sender, actor, version=1)
        sender.stop()
        done.result(timeout=300)
    return {"push_bytes": stats.bytes, "push_s": stats.seconds}


def run_arm(args: argparse.Namespace, name: str) -> dict:
    """One arm's measured update (after a warm-up) and push, in this process."""
    from zerotir.config import RLConfig
    from zerotir.rl.micro_batches import row_lengths

    torch.set_num_threads(args.threads)
    cfg = RLConfig(algorithm="reinforce_pp", micro_batch_size=args.micro_batch_size,
                   logprob_chunk_tokens=args.chunk or None)
    traj, actor = trajectories(args), model_of(args, ARMS[name])
    seconds, _, peak_mib = measured_update(cfg, traj, actor)  # the optimizer's state included
    return {"arm": name, "trained": sum(p.numel() for p in actor.parameters() if p.requires_grad),
            "peak_mib": peak_mib, "update_s": seconds,
            "tokens_per_s": int(row_lengths(traj.attention_mask).sum()) / seconds, **push_once(actor)}


def table(results: list[dict]) -> str:
    full = results[0]
    lines = ["| arm | trained parameters | peak update memory (MiB) | x lower | update tokens/s | push MB | x smaller "
             "| push s |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['arm']} | {r['trained'] / 1e6:.2f} M | {r['peak_mib']:.0f} | "
                     f"{full['peak_mib'] / max(r['peak_mib'], 1e-9):.1f} | {r['tokens_per_s']:.0f} | "
                     f"{r['push_bytes'] / 1e6:.2f} | {full['push_bytes'] / r['push_bytes']:.0f} | {r['push_s']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = batch_arguments(__doc__, rows=8, median=128.0, sigma=0.5, max_len=512)
    parser.add_argument("--chunk", type=int, default=1024, help="logprob_chunk_tokens of both arms (0: off)")
    parser.add_argument("--toy-world", action="store_true", help="run the toy world's 3-seed finding instead")
    args = parser.parse_args()
    if args.toy_world:
        from benchmarks import lora_toy

        lora_toy.main([])
        return
    print(f"{args.rows} rows up to {args.max_len} tokens, log-probs chunked by {args.chunk or 'none'}; load "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    report(in_fresh_processes(run_arm, args, list(ARMS), "update_s"), table, args.json)


if __name__ == "__main__":
    main()
