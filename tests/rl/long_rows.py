"""Batches of trajectories with different lengths and masked tool-output spans, a tiny actor and critic, and an
update runner that records what the backward and the optimizer steps receive: shared by the token-budget tests
(the spawned gloo workers import this module, so it imports nothing heavier than transformers)."""

from __future__ import annotations

import torch

from zerotir.config import RLConfig
from zerotir.models import ValueModel
from zerotir.rl.update import TrainBatch, ppo_update, prepare_batch
from zerotir.toy.tiny_model import build_tiny_model
from zerotir.toy.tokenizer import build_byte_tokenizer
from zerotir.types import Trajectories

PROMPT = 3
LENGTHS = [5, 14, 8, 20, 11, 6]  # real tokens of each row (prompt included); the batch is one column wider
REWARDS = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
GROUPS = [0, 0, 1, 1, 2, 2]
MAX_RESPONSE_TOKENS = 20


def action_row(length: int, width: int) -> list[bool]:
    """Sampled tokens after the prompt, except a tool output (2 tokens, injected) 2 tokens into a long response."""
    row = [PROMPT <= t < length for t in range(width)]
    if length >= PROMPT + 6:
        row[PROMPT + 2] = row[PROMPT + 3] = False
    return row


def long_rows(lengths: list[int] = LENGTHS, rewards: list[float] = REWARDS, groups: list[int] = GROUPS,
              seed: int = 0, width: int | None = None) -> Trajectories:
    """Right-padded trajectories of ``lengths`` real tokens, ``width`` columns (default: the longest + 1)."""
    width = width or max(lengths) + 1
    b = len(lengths)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 250, (b, width), generator=gen)
    attn = torch.tensor([[t < n for t in range(width)] for n in lengths], dtype=torch.long)
    ids = torch.where(attn.bool(), ids, torch.zeros_like(ids))
    action = torch.tensor([action_row(n, width) for n in lengths], dtype=torch.bool)
    zeros = torch.zeros(b, dtype=torch.long)
    return Trajectories(
        input_ids=ids, attention_mask=attn, action_mask=action, logprobs=torch.zeros(b, width),
        prompt_lens=torch.full((b,), PROMPT), response_lens=torch.tensor(lengths) - PROMPT,
        group_ids=torch.tensor(groups), rewards=torch.tensor(rewards), num_calls=zeros + 1, num_exec_errors=zeros,
        num_timeouts=zeros, num_sandbox_errors=zeros, truncated=torch.zeros(b, dtype=torch.bool),
        finish_reasons=["stop"] * b, response_texts=["x"] * b, ground_truths=["1"] * b,
    )


class TinyCritic(torch.nn.Module):
    """A critic with the ``critic(input_ids, attention_mask) -> (B, T)`` interface of ``zerotir.models.ValueModel``;
    it sees the tokens before each position (a causal running mean), so padding never reaches a real position."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.embed = torch.nn.Embedding(260, 8)
        self.head = torch.nn.Linear(8, 1)

    def forward(self, input_ids, attention_mask):
        x = torch.tanh(self.embed(input_ids))
        running = x.cumsum(1) / torch.arange(1, x.shape[1] + 1)[None, :, None]
        return self.head(running).squeeze(-1)


def models(seed: int = 0):
    """(actor, reference, critic): two tiny Llamas of different seeds, and a ``TinyCritic``."""
    tok = build_byte_tokenizer()
    actor = build_tiny_model(tok, hidden_size=32, num_layers=2, num_heads=2, seed=seed)
    ref = build_tiny_model(tok, hidden_size=32, num_layers=2, num_heads=2, seed=seed + 1)
    for m in (actor, ref):
        m.eval()
    return actor, ref, TinyCritic()


def value_critic(seed: int = 2):
    """A ``zerotir.models.ValueModel`` on a tiny Llama backbone: the project's critic, which takes packed rows."""
    backbone = build_tiny_model(build_byte_tokenizer(), hidden_size=32, num_layers=2, num_heads=2, seed=seed)
    torch.manual_seed(seed)
    critic = ValueModel(backbone.model, backbone.config.hidden_size)
    critic.eval()
    return critic


def all_reduced_backward(calls: list[int], world: int):
    """``backward_fn`` of ``run_update`` for a gloo rank: each backward's gradients all-reduced and divided by
    ``world`` (as DDP or ZeRO's reduction does), counted in ``calls[0]``."""
    import torch.distributed as dist

    def backward(loss: torch.Tensor, params: list[torch.nn.Parameter]) -> None:
        calls[0] += 1
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        for p, g in zip(params, grads):
            g = torch.zeros_like(p) if g is None else g.clone()
            dist.all_reduce(g)  # the backend's reduction: sum over ranks, then the mean
            g /= world
            p.grad = g if p.grad is None else p.grad + g

    return backward


def run_update(cfg: RLConfig, traj: Trajectories, actor, ref, critic, backward_fn=None
               ) -> tuple[TrainBatch, list[float], list[dict[str, torch.Tensor]], dict[str, float]]:
    """``prepare_batch`` then ``ppo_update`` at temperature 0.8; returns the batch, the summed weighted loss of each
    optimizer step, every trained parameter's gradient at each step (the step changes nothing: the gradients are
    read and zeroed) and the update's statistics. ``backward_fn(loss, params)`` replaces ``loss.backward()``."""
    trained = [m for m in (actor, critic if cfg.uses_critic else None) if m is not None]
    params = {f"{i}.{n}": p for i, m in enumerate(trained) for n, p in m.named_parameters()}
    for p in params.values():
        p.grad = None
    batch, _ = prepare_batch(cfg, traj, actor, ref if cfg.kl_coef > 0 else None,
                             critic if cfg.uses_critic else None, temperature=0.8, top_p=1.0)
    losses, step_losses, grads = [], [], []

    def backward(loss: torch.Tensor) -> None:
        losses.append(float(loss.detach()))
        if backward_fn is None:
            loss.backward()
        else:
            backward_fn(loss, list(params.values()))

    def step(has_grad: bool) -> float:
        step_losses.append(sum(losses))
        losses.clear()
        grads.append({n: p.grad.clone() for n, p in params.items() if p.grad is not None})
        for p in params.values():
            p.grad = None
        return 1.0

    stats = ppo_update(cfg, batch, actor, critic if cfg.uses_critic else None, backward, step, rl_step=1,
                       generator=torch.Generator().manual_seed(0), max_response_tokens=MAX_RESPONSE_TOKENS,
                       temperature=0.8)
    return batch, step_losses, grads, stats
