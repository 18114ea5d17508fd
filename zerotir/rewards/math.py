"""``math``: the paper's outcome reward (its engine: ``zerotir.rewards.verify``) behind the reward protocol, the
default ``model.reward``.

1 when the last ``\\boxed{}`` answer equals the reference (math-verify, in worker processes), else 0, and 0 when the
response was truncated; correct exactly when the score is 1. Scores are those of ``zerotir.rewards.verify.score_batch``,
bit for bit: the same scorer with the same settings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from zerotir.rewards.protocol import Reward, Sample, Score


@dataclass(frozen=True, eq=False)
class MathReward(Reward):
    """The last boxed answer judged against the reference by math-verify (``model.reward``'s default)."""

    require_single_boxed: bool = False
    """Score 0 unless the response has exactly one box (a format rule; the paper has none)."""
    timeout_s: float = 5.0
    """math-verify's limit for one parse or comparison, seconds (whole seconds, rounded up)."""
    max_workers: int | None = None
    """Worker processes of the verification pool (None: min(4, cores))."""

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError(f"model.reward.init_args.timeout_s={self.timeout_s}: must be > 0 seconds")
        if self.max_workers is not None and self.max_workers < 1:
            raise ValueError(f"model.reward.init_args.max_workers={self.max_workers}: must be >= 1 (or null)")

    async def score(self, samples: Sequence[Sample]) -> list[Score]:
        from zerotir.rewards.verify import score_batch

        scores = await score_batch([s.response for s in samples], [s.answer for s in samples],
                                   [s.truncated for s in samples], self.max_workers, self.timeout_s,
                                   self.require_single_boxed)
        return [Score(value, value > 0) for value in scores]

    async def parses(self, samples: Sequence[Sample]) -> list[bool]:
        """Whether each sample's final answer is one math-verify reads (a boxed answer that parses): where it is
        not, the ``judge`` reward's ``fallback`` mode asks the judge."""
        from zerotir.rewards.verify import answer_or_none, default_scorer

        answers = [answer_or_none(s.response, False, self.require_single_boxed) for s in samples]
        scorer = default_scorer(self.max_workers, self.timeout_s, self.require_single_boxed)
        read = iter(await scorer.parses([a for a in answers if a is not None]))
        return [answer is not None and next(read) for answer in answers]
