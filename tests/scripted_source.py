"""A scripted rollout source for tests of the module's Lightning plumbing: the real in-line source (its ``batch``,
versions, tensor-parallel share and evaluation) with a rollout that samples random tokens and scores them by rule,
no sandbox and no engine; a fixed training stream; and a callback keeping each step's ``StepResult``."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
from lightning.pytorch.callbacks import Callback

from zerotir.config import HFRollout, SandboxConfig, ToolConfig
from zerotir.module import ZeroTIRModule
from zerotir.rollout.source import InlineSource
from zerotir.types import Trajectories

RESPONSE = 8  # scripted response: 3 sampled, 2 injected, 3 sampled


class IdleEngine:
    """The scripted source's engine: nothing to load, nothing to release."""

    def load_weights_from(self, actor) -> None:
        pass

    def rest(self) -> None:
        pass

    def close(self) -> None:
        pass


class ScriptedSource(InlineSource):
    """The in-line rollout source with a scripted rollout in place of sandbox + engine (its ``batch``, versions,
    tensor-parallel share and evaluation are the real ones); records the rows it was asked to roll out."""

    def __init__(self, module: ZeroTIRModule, all_wrong: bool = False, engine=None):
        super().__init__(HFRollout(), SandboxConfig(), ToolConfig(), module.sampling, None, "unused", module.seed)
        self.all_wrong = all_wrong
        self.seen: list[list[str]] = []
        self.closed = False
        self.failure: str | None = None  # a rollout that raises this
        self.engine = engine or IdleEngine()

    def start(self, actor, tokenizer, device, stream) -> None:
        self.stream = stream  # the training stream the real ``batch`` reads

    def close(self) -> None:
        self.closed = True

    def roll_out(self, rows, params):
        if self.failure is not None:
            raise RuntimeError(self.failure)
        self.seen.append([r["id"] for r in rows])
        g = torch.Generator().manual_seed(params.seed)
        parts = []
        for gi, row in enumerate(rows):
            for s in range(params.n):
                prompt = torch.tensor(row["prompt_ids"])
                response = torch.randint(3, 250, (RESPONSE,), generator=g)
                ids = torch.cat([prompt, response])[None]
                action = torch.zeros_like(ids, dtype=torch.bool)
                action[0, len(prompt):] = True
                action[0, len(prompt) + 3:len(prompt) + 5] = False  # injected tool output
                reward = 0.0 if self.all_wrong else float(s % 2 == 0)
                parts.append(scripted_traj(ids, action, len(prompt), gi, reward))
        return Trajectories.cat(parts, pad_token_id=0), {"generation": 0.01, "sandbox": 0.0, "reward": 0.0}


def scripted_traj(ids, action, prompt_len, group, reward) -> Trajectories:
    one = torch.ones(1, dtype=torch.long)
    return Trajectories(
        input_ids=ids, attention_mask=torch.ones_like(ids), action_mask=action,
        logprobs=torch.where(action, -5.5, 0.0), prompt_lens=one * prompt_len, response_lens=one * RESPONSE,
        group_ids=one * group, rewards=torch.tensor([reward]), num_calls=one, num_exec_errors=one * 0,
        num_timeouts=one * 0, num_sandbox_errors=one * 0, truncated=torch.zeros(1, dtype=torch.bool),
        finish_reasons=["stop"], response_texts=["\\boxed{1}"], ground_truths=["1"],
    )


class FixedStream:
    """A training stream (``rollout.source.TrainStream``) whose batch ``b`` is ``batch(b)``, read whole from 0."""

    def __init__(self, batch: Callable[[int], list[dict]], prompts_per_step: int):
        self.batch, self.prompts_per_step = batch, prompts_per_step

    def train_batch(self, batch_index: int) -> list[dict]:
        return self.batch(batch_index)

    def train_batches(self, steps_take: str):
        return map(self.batch, itertools.count())


class Recorder(Callback):
    """Keeps the ``StepResult`` of every training step, as the callbacks receive it."""

    def __init__(self):
        self.results = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.results.append(outputs["step"])


def recorded(trainer) -> list:
    """The step results the trainer's ``Recorder`` kept."""
    return next(cb for cb in trainer.callbacks if isinstance(cb, Recorder)).results
