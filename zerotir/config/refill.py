"""How a step's batch is assembled when its filters drop prompt groups: ``model.filters.refill`` (dynamic sampling, as
DAPO's)."""

from __future__ import annotations

from dataclasses import dataclass

from zerotir.config.checks import check_min


@dataclass(frozen=True)
class RefillConfig:
    """Dynamic sampling with refill (``model.filters.refill``, ``zerotir.rl.refill``): a step whose pass-rate rule
    drops prompt groups draws the next ``data.prompts_per_step`` prompts of the stream and generates again, until its
    batch holds ``data.prompts_per_step`` kept groups or ``max_rounds`` rounds ran; and a run whose steps keep
    training nothing stops instead of idling."""

    max_rounds: int = 1
    """Generation rounds one RL step may take to fill its batch with data.prompts_per_step kept prompt groups (DAPO's
    max_num_gen_batches); each round draws the next data.prompts_per_step prompts of the stream. 1 (the default): no
    refill, a step trains on what its one round kept. When the rounds run out the step trains on the groups it kept
    (a smaller batch, warned and counted in filter/exhausted_steps); none kept: no update. Needs the pass-rate rule
    (model.filters.pass_rate: true): without it no group is ever dropped."""
    max_empty_steps: int = 20
    """Consecutive RL steps without an update (the filters kept no prompt group) after which the run stops
    with an error; every such step logs a warning with the count."""

    def __post_init__(self) -> None:
        check_min("filters.refill", self, ("max_rounds",), 1, " (1: no refill)")
        check_min("filters.refill", self, ("max_empty_steps",), 1)

    @property
    def enabled(self) -> bool:
        """A step may draw more prompts than one batch."""
        return self.max_rounds > 1
