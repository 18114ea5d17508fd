"""The reward protocol (``model.reward``): what a reward sees of a finished trajectory and what it answers.

A reward sees what a person judging the answer would: the prompt row (question, reference answer, metadata), the
response and its tool trace, whether it was cut at the budget. It returns a ``Score``: the number the RL update
trains on AND whether the answer counts as correct. The two are kept apart on purpose: the filters (pass rate, the
overlong and correct-with-errors rules, GRPO-RoC) and the evaluation (avg@k, pass@k) read ``correct``, so a graded
or composed reward (a tool-call cost, a judge's partial credit) never silently changes what "correct" means.

The rollout applies a reward (``zerotir.rollout.scoring.score_trajectories``); nothing here knows of an engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:  # zerotir.types imports torch, which `zerotir rollouts` (reading extract_boxed here) never loads
    from zerotir.types import ToolCall


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
    count). ``infra_failed``: the reward could not judge the sample for a reason that is not the model's (a judge that
    did not answer, answered without a verdict, or could not take the request): the score is a stand-in, and the
    trajectory leaves the loss and its group's baseline (``model.filters.infra_failed``)."""

    score: float
    correct: bool
    infra_failed: bool = False


class Reward:
    """Base of the ``model.reward`` choices: ``zerotir.rewards.MathReward`` (the default), ``JudgeReward``,
    ``WeightedReward``, ``ToolCallCost``, or a subclass of your own (docs/extending.md).

    A subclass is a dataclass of its settings (the CLI builds it from ``class_path`` / ``init_args``) and implements
    ``score``. ``start`` runs once before step 1 (reach a service here: an unreachable one is an error then, not at
    the first batch); ``close`` at teardown.
    """

    concurrent_calls: ClassVar[bool] = False
    """Whether ``score`` may be called again before an earlier call returned (``EarlyScores`` then calls it for each
    trajectory or group as it ends, side by side); a reward that says so bounds its work across all its calls."""

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
