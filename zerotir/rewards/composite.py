"""Composed rewards: ``weighted`` (a weighted sum of rewards) and ``tool_cost`` (a cost per tool call).

``WeightedReward`` scores each sample with every term and sums ``weight x score``; whether the answer counts as
correct is the verdict of one term (``correct_from``, the first by default), so adding a cost or a bonus never
changes what the filters and the evaluation count. ``ToolCallCost`` scores ``-(cost x calls)``, with a cost per
tool name where one is given: correctness minus a price per call is

    model:
      reward:
        class_path: zerotir.rewards.WeightedReward
        init_args:
          terms:
            - {class_path: zerotir.rewards.MathReward}
            - {class_path: zerotir.rewards.ToolCallCost, init_args: {cost: 0.05, per_tool: {search: 0.1}}}
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from zerotir.rewards.protocol import Reward, Sample, Score

_TERM_KEYS = {"class_path", "init_args", "weight"}


def build_reward(class_path: str, init_args: dict[str, Any] | None = None, where: str = "model.reward") -> Reward:
    """The ``Reward`` subclass at ``class_path`` (``module.Class``; a bare name is looked up in
    ``zerotir.rewards``) built with ``init_args``; a path that names no Reward is an error naming ``where``."""
    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module or "zerotir.rewards"), name)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"{where}.class_path={class_path!r} does not import ({error}): write module.Class, e.g. "
                         "zerotir.rewards.MathReward") from error
    if not (isinstance(cls, type) and issubclass(cls, Reward)):
        raise ValueError(f"{where}.class_path={class_path!r} is not a zerotir.rewards.Reward subclass")
    return cls(**(init_args or {}))


@dataclass(frozen=True, eq=False)
class ToolCallCost(Reward):
    """``-(cost x calls)`` of a trajectory, each call priced ``per_tool.get(its tool, cost)``; always "correct"
    (a cost has no verdict: in a ``WeightedReward`` the correctness term gives it)."""

    cost: float = 0.0
    """The price of one call of a tool that ``per_tool`` does not name."""
    per_tool: dict[str, float] = field(default_factory=dict)
    """The price of one call by tool name (``python``, ``search``, an MCP tool's name)."""

    def __post_init__(self) -> None:
        bad = {k: v for k, v in {"cost": self.cost, **self.per_tool}.items() if v < 0}
        if bad:
            raise ValueError(f"model.reward ToolCallCost {bad}: a cost must be >= 0 (it is subtracted)")

    async def score(self, samples: Sequence[Sample]) -> list[Score]:
        return [Score(-sum(self.per_tool.get(call.tool, self.cost) for call in s.tool_calls), True) for s in samples]


@dataclass(frozen=True, eq=False)
class WeightedReward(Reward):
    """``sum(weight x score)`` over ``terms``; correct as the ``correct_from`` term says."""

    terms: list[dict[str, Any]] = field(default_factory=lambda: [{"class_path": "zerotir.rewards.MathReward"}])
    """The rewards summed: ``{class_path, init_args, weight}`` each (``weight`` 1.0 when omitted)."""
    correct_from: int = 0
    """The index in ``terms`` of the reward whose verdict is "correct"."""

    def __post_init__(self) -> None:
        if not self.terms:
            raise ValueError("model.reward.init_args.terms is empty: list at least one reward")
        built = []
        for i, term in enumerate(self.terms):
            where = f"model.reward.init_args.terms[{i}]"
            if not isinstance(term, dict) or not isinstance(term.get("class_path"), str) or set(term) - _TERM_KEYS:
                raise ValueError(f"{where}={term!r}: write {{class_path: module.Class, init_args: {{...}}, "
                                 "weight: 1.0}} (only those keys)")
            built.append((float(term.get("weight", 1.0)), build_reward(term["class_path"], term.get("init_args"),
                                                                        where)))
        if not 0 <= self.correct_from < len(built):
            raise ValueError(f"model.reward.init_args.correct_from={self.correct_from}: must index terms "
                             f"(0..{len(built) - 1})")
        object.__setattr__(self, "_built", built)

    def start(self) -> None:
        for _, reward in self._built:
            reward.start()

    def close(self) -> None:
        for _, reward in self._built:
            reward.close()

    def stats(self) -> dict[str, float]:
        return {k: v for _, reward in self._built for k, v in reward.stats().items()}

    async def score(self, samples: Sequence[Sample]) -> list[Score]:
        each = await asyncio.gather(*(reward.score(samples) for _, reward in self._built))
        weights = [weight for weight, _ in self._built]
        return [Score(sum(w * scores[i].score for w, scores in zip(weights, each)), each[self.correct_from][i].correct,
                      any(scores[i].infra_failed for scores in each))  # one term that could not judge: no score
                for i in range(len(samples))]
