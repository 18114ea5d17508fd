"""The constructed trajectories and the tiny model the RL step's tests share: rows of a fixed layout (prompt,
sampled, injected, sampled, padding), and one update run that records each optimizer step's gradients."""

from __future__ import annotations

import torch

from zerotir.rl.update import RLConfig, TrainBatch, ppo_update, prepare_batch
from zerotir.toy.tiny_model import build_tiny_model
from zerotir.toy.tokenizer import build_byte_tokenizer
from zerotir.types import Trajectories

# Row layout used throughout (T = 10): prompt 0..2, sampled 3..4, injected 5..6, sampled 7..8, then padding.
ROW_MASK = [0, 0, 0, 1, 1, 0, 0, 1, 1, 0]


def make_traj(rewards: list[float], groups: list[int], seed: int = 0) -> Trajectories:
    g = torch.Generator().manual_seed(seed)
    b, t = len(rewards), len(ROW_MASK)
    ids = torch.randint(3, 250, (b, t), generator=g)
    ids[:, -1] = 0
    attn = torch.ones(b, t, dtype=torch.long)
    attn[:, -1] = 0
    action = torch.tensor([ROW_MASK] * b, dtype=torch.bool)
    zeros = torch.zeros(b, dtype=torch.long)
    return Trajectories(
        input_ids=ids, attention_mask=attn, action_mask=action, logprobs=torch.zeros(b, t),
        prompt_lens=torch.full((b,), 3), response_lens=torch.full((b,), 6), group_ids=torch.tensor(groups),
        rewards=torch.tensor(rewards), num_calls=zeros + 1, num_exec_errors=zeros, num_timeouts=zeros,
        num_sandbox_errors=zeros, truncated=torch.zeros(b, dtype=torch.bool),
        finish_reasons=["stop"] * b, response_texts=["x"] * b, ground_truths=["1"] * b,
    )


def tiny_model() -> torch.nn.Module:
    """A tiny random Llama (seed 0) over the byte tokenizer."""
    torch.manual_seed(0)
    return build_tiny_model(build_byte_tokenizer(), hidden_size=32, num_layers=2, num_heads=2)


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def run_update(model: torch.nn.Module, batch: TrainBatch, cfg: RLConfig, max_response_tokens: int | None = None):
    """``ppo_update`` on ``batch`` with a recording optimizer step: (gradients per step, has_grad per step, stats)."""
    model.zero_grad(set_to_none=True)
    captured, calls = [], []

    def step(has_grad: bool) -> float:
        calls.append(has_grad)
        captured.append(grads(model))
        model.zero_grad(set_to_none=True)
        return 1.0

    stats = ppo_update(cfg, batch, model, None, lambda loss: loss.backward(), step, rl_step=3,
                       generator=torch.Generator().manual_seed(0), max_response_tokens=max_response_tokens,
                       temperature=1.0)
    return captured, calls, stats


def prepared(model: torch.nn.Module, traj: Trajectories, cfg: RLConfig) -> TrainBatch:
    """The update's batch of ``traj`` (one prepare pass, no reference, no critic)."""
    model.eval()
    batch, _ = prepare_batch(cfg, traj, model, None, None, temperature=1.0, top_p=1.0)
    return batch
