"""The reward protocol (``model.reward``; the built-ins are ``zerotir.rewards``) and the one scoring path of every
rollout source.

A reward sees what a person judging the answer would: the prompt row (question, reference answer, metadata), the
response and its tool trace, whether it was cut at the budget. It returns a ``Score``: the number the RL update
trains on AND whether the answer counts as correct. The two are kept apart on purpose: the filters (pass rate, the
overlong and correct-with-errors rules, GRPO-RoC) and the evaluation (avg@k, pass@k) read ``correct``, so a graded
or composed reward (a tool-call cost, a judge's partial credit) never silently changes what "correct" means.

``score_trajectories`` is the only place a reward is applied: the in-line source, the thread host and the fleet
all call it on the trainer once a batch's trajectories are back (rewards never cross to an engine host). It lives
here, beside the sources, so that the rollout imports no reward implementation (``zerotir.rewards`` imports this).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from zerotir.rollout.sync import run_sync
from zerotir.types import PromptRow, ToolCall, Trajectories

_ROW_TEXT_KEYS = ("problem", "answer", "prompt_ids")  # the row keys a Sample holds as fields, not metadata


@dataclass(frozen=True)
class Sample:
    """One finished trajectory as a reward sees it.

    Attributes:
        question: the problem text (the row's ``problem``).
        answer: the reference answer (the row's ``answer``).
        response: the decoded response (sampled text and the injected tool outputs).
        truncated: the response reached the token budget.
        tool_calls: the calls the trajectory made, in order (``ToolCall.tool`` names the tool).
        metadata: the rest of the prompt row (``id``, ``source``, ``prompt_text``, ...).
    """

    question: str
    answer: str
    response: str
    truncated: bool = False
    tool_calls: tuple[ToolCall, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Score:
    """What a reward says of one sample: ``score`` (trained on) and ``correct`` (what filters and evaluation
    count)."""

    score: float
    correct: bool


class Reward:
    """Base of the ``model.reward`` choices: ``zerotir.rewards.MathReward`` (the default), ``JudgeReward``,
    ``WeightedReward``, ``ToolCallCost``, or a subclass of your own (docs/extending.md).

    A subclass is a dataclass of its settings (the CLI builds it from ``class_path`` / ``init_args``) and implements
    ``score``. ``start`` runs once before step 1 (reach a service here: an unreachable one is an error then, not at
    the first batch); ``close`` at teardown.
    """

    async def score(self, samples: Sequence[Sample]) -> list[Score]:
        raise NotImplementedError(f"{type(self).__qualname__}.score: a Reward subclass must implement it")

    def start(self) -> None:
        """Check what the reward needs (an endpoint, a file) before the first rollout; nothing by default."""

    def close(self) -> None:
        """Release what ``start`` or ``score`` opened; nothing by default."""

    def stats(self) -> dict[str, float]:
        """Counts since the last call (a judge's calls, cache hits, parse failures), logged with the step as
        ``pipeline/<name>`` and reset; none by default."""
        return {}


def samples_of(traj: Trajectories, rows: Sequence[PromptRow]) -> list[Sample]:
    """The samples of ``traj``, trajectory ``i`` with prompt row ``rows[traj.group_ids[i]]``."""
    groups = traj.group_ids.tolist()
    if groups and max(groups) >= len(rows):
        raise ValueError(f"score_trajectories: group id {max(groups)} but only {len(rows)} prompt rows")
    calls = traj.tool_calls or [[] for _ in groups]
    out = []
    for i, group in enumerate(groups):
        row = rows[group]
        meta = {k: v for k, v in row.items() if k not in _ROW_TEXT_KEYS}
        out.append(Sample(row["problem"], row["answer"], traj.response_texts[i], bool(traj.truncated[i]),
                          tuple(calls[i]), meta))
    return out


def score_trajectories(reward: Reward | None, traj: Trajectories, rows: Sequence[PromptRow]) -> float:
    """Fill ``traj.rewards`` and ``traj.corrects`` with ``reward``'s scores of ``traj``
    (prompt rows ``rows``, indexed by its group ids); the seconds it took (0 without a reward: rewards stay 0)."""
    if reward is None:
        return 0.0
    start = time.perf_counter()
    samples = samples_of(traj, rows)
    scores = run_sync(reward.score(samples), "score_trajectories") if samples else []
    if len(scores) != len(samples):
        raise RuntimeError(f"{type(reward).__qualname__}.score returned {len(scores)} scores for {len(samples)} "
                           "samples: it must return one per sample, in order")
    traj.rewards = torch.tensor([s.score for s in scores], dtype=torch.float32)
    traj.corrects = torch.tensor([bool(s.correct) for s in scores], dtype=torch.bool)
    return time.perf_counter() - start
