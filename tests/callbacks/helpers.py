"""Small hand-made trajectory batches and stand-ins for the trainer and module, for the callback tests."""

from __future__ import annotations

from typing import Any

import torch

from zerotir.rl.step import FilterDecision, StepResult
from zerotir.types import FINISH_LENGTH, FINISH_STOP, Trajectories


def make_batch(
    rewards: list[float],
    group_ids: list[int],
    num_calls: list[int] | None = None,
    exec_errors: list[int] | None = None,
    timeouts: list[int] | None = None,
    sandbox_errors: list[int] | None = None,
    truncated: list[bool] | None = None,
    response_lens: list[int] | None = None,
    texts: list[str] | None = None,
) -> Trajectories:
    """A batch of B trajectories of width 6 (2 prompt tokens, then response tokens); unspecified stats are 0."""
    size = len(rewards)
    zeros = [0] * size
    trunc = truncated if truncated is not None else [False] * size
    lens = response_lens if response_lens is not None else [3] * size
    width = 6
    action = torch.zeros(size, width, dtype=torch.bool)
    action[:, 2:5] = True
    return Trajectories(
        input_ids=torch.arange(size * width).reshape(size, width) % 250 + 3,
        attention_mask=torch.ones(size, width, dtype=torch.long),
        action_mask=action,
        logprobs=torch.where(action, -0.5, 0.0),
        prompt_lens=torch.full((size,), 2),
        response_lens=torch.tensor(lens),
        group_ids=torch.tensor(group_ids),
        rewards=torch.tensor(rewards, dtype=torch.float32),
        num_calls=torch.tensor(num_calls if num_calls is not None else zeros),
        num_exec_errors=torch.tensor(exec_errors if exec_errors is not None else zeros),
        num_timeouts=torch.tensor(timeouts if timeouts is not None else zeros),
        num_sandbox_errors=torch.tensor(sandbox_errors if sandbox_errors is not None else zeros),
        truncated=torch.tensor(trunc),
        finish_reasons=[FINISH_LENGTH if t else FINISH_STOP for t in trunc],
        response_texts=texts if texts is not None else ["x = 1"] * size,
        ground_truths=["1"] * size,
    )


class FakeLogger:
    """Records ``log_metrics`` calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, float], int | None]] = []

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.calls.append((dict(metrics), step))

    def save(self) -> None:
        self.saves = getattr(self, "saves", 0) + 1


class FakeTrainer:
    def __init__(self) -> None:
        self.loggers = [FakeLogger()]
        self.is_global_zero = True


class FakeModule:
    """The module's side of the callbacks' protocol: ``log`` (recorded) and the ``tokenizer`` (the byte tokenizer)."""

    def __init__(self) -> None:
        from zerotir.toy.tokenizer import build_byte_tokenizer

        self.logged: dict[str, tuple[float, dict[str, Any]]] = {}
        self.tokenizer = build_byte_tokenizer()

    def log(self, name: str, value: float, **kwargs: Any) -> None:
        self.logged[name] = (value, kwargs)


def step_outputs(batch: Trajectories, rl_step: int = 1, decision: FilterDecision | None = None,
                 stats: dict[str, float] | None = None, timings: dict[str, float] | None = None) -> dict[str, Any]:
    """What ``training_step`` returns (``outputs`` of ``on_train_batch_end``) for a step over ``batch``."""
    keep = decision.keep if decision is not None else torch.ones(len(batch), dtype=torch.bool)
    return {"step": StepResult(rl_step, batch, keep, decision, dict(stats or {}), dict(timings or {}))}
