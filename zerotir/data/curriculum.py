"""Curricula over the training stream (``data.curriculum``): stages of kinds (or files) with weights, a switch rule
per stage, and an adaptive option that draws the kinds a run still fails more often.

A stage names the row kinds (the rows' ``kind`` field; ``by: file``: entries of ``data.train_files``) it draws and
their weights, and when it ends: after ``steps`` batches of the stream, or once the rolling pass rate of the stage
(correct trajectories / trajectories over its last ``window`` batches) reaches ``pass_rate``. The last stage never
ends. With ``adaptive: true`` the weight of kind ``k`` in a batch is ``w_k * max(1 - p_k, floor)``, normalized, where
``p_k`` is the pass rate of ``k`` over the stage's last ``window`` batches (a kind not seen yet counts as unsolved,
``p_k = 0``): a solved kind keeps ``floor`` of its weight, so it is still drawn and its rate stays measured.

Batch ``b`` is drawn from a generator seeded with ``(seed, b)``: how many rows of each kind (a multinomial over the
weights), then which rows (a permutation of the kind's rows, cycled if it asks more). It depends on ``b``, the
stage of ``b`` and the weights; nothing else. The stage of ``b`` follows from the state (the stage the results last
put the run in and the batch it began at) and the ``steps`` rules after it, so with step rules alone every batch can
be rebuilt from its index (an engine host reads batches ahead). Pass-rate rules and ``adaptive`` decide batch ``b``
on the results of the batches before it (``observe``, in order), which only a rollout in line gives: with batches
drawn ahead (``model.hosts`` / ``model.hosts``) they are an error at start (``check_steps_take``). The state
(stage, its first batch, the results of its window) is saved with the data position, so a resumed run draws the
same batches.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from zerotir.data.stream import PromptStream, row_copy


@dataclass(frozen=True)
class Stage:
    """One stage of ``data.curriculum``."""

    weights: dict[str, float]
    """Kind (``by: file``: an entry of ``data.train_files``) -> its weight (>= 0) in the stage's batches."""
    steps: int | None = None
    """End the stage after this many batches of the stream (= RL steps without refill)."""
    pass_rate: float | None = None
    """End the stage once its rolling pass rate over ``data.curriculum.window`` batches reaches this, in (0, 1]."""


@dataclass(frozen=True)
class CurriculumConfig:
    """``data.curriculum``: the stages in order and how the kinds of a stage are weighted."""

    stages: list[Stage] = field(default_factory=list)
    """The stages in order; each but the last sets ``steps`` or ``pass_rate``."""
    by: Literal["kind", "file"] = "kind"
    """What the stages' weights name: row kinds (the rows' ``kind`` field) or entries of ``data.train_files``."""
    window: int = 4
    """Batches of the rolling pass rates (the ``pass_rate`` rule's and ``adaptive``'s)."""
    adaptive: bool = False
    """Weight kind k by ``w_k * max(1 - p_k, floor)`` (``p_k``: its pass rate over the window): harder kinds
    more often."""
    floor: float = 0.1
    """``adaptive``: the least share of its weight a solved kind keeps, in (0, 1]."""

    def __post_init__(self) -> None:
        where = "data.curriculum"
        if not self.stages:
            raise ValueError(f"{where}.stages is empty: list one stage or more, or set data.curriculum: null")
        if self.by not in ("kind", "file"):
            raise ValueError(f"{where}.by={self.by!r}: one of 'kind', 'file'")
        if self.window < 1:
            raise ValueError(f"{where}.window={self.window}: the batches of a rolling pass rate, >= 1")
        if not 0 < self.floor <= 1:
            raise ValueError(f"{where}.floor={self.floor}: a share of a kind's weight, in (0, 1]")
        last = len(self.stages) - 1
        for i, stage in enumerate(self.stages):
            at = f"{where}.stages[{i}]"
            if any(w < 0 for w in stage.weights.values()) or sum(stage.weights.values()) <= 0:
                raise ValueError(f"{at}.weights={stage.weights}: weights >= 0, at least one > 0 (a stage with "
                                 "no rows)")
            if stage.steps is not None and stage.pass_rate is not None:
                raise ValueError(f"{at}: set one switch rule, steps or pass_rate, not both")
            if stage.steps is not None and stage.steps < 1:
                raise ValueError(f"{at}.steps={stage.steps}: the batches of the stage, >= 1")
            if stage.pass_rate is not None and not 0 < stage.pass_rate <= 1:
                raise ValueError(f"{at}.pass_rate={stage.pass_rate}: a pass rate in (0, 1]")
            if i < last and stage.steps is None and stage.pass_rate is None:
                raise ValueError(f"{at}: a stage before the last needs a switch rule: set steps or pass_rate")
            if i == last and (stage.steps is not None or stage.pass_rate is not None):
                raise ValueError(f"{at}: the last stage never ends; remove its steps / pass_rate (or add a stage)")

    @property
    def needs_results(self) -> bool:
        """Batches depend on the results of earlier ones (a pass-rate rule or ``adaptive``)."""
        return self.adaptive or any(stage.pass_rate is not None for stage in self.stages)

    def check_steps_take(self, steps_take: str) -> None:
        """Refuse batches drawn ahead of the results (``steps_take`` other than "batch") where batches depend on
        results: batch ``b`` would be drawn before the results it depends on are known, so no run could repeat it."""
        if steps_take != "batch" and self.needs_results:
            raise ValueError("data.curriculum with a pass_rate rule or adaptive: true decides each batch on the "
                             "results of the batches before it, and this run draws batches ahead of the trainer "
                             "(model.hosts); roll out in line (model.hosts.max_staleness: null) or use steps rules "
                             "alone")


# One trajectory's result as the curriculum reads it: (batch index, kind or None, source, correct).
Outcome = tuple[int, "str | None", str, bool]


def outcomes(rows: list[dict[str, Any]], group_ids: list[int], correct: list[bool]) -> list[Outcome]:
    """The ``Outcome`` of each trajectory of a rolled-out batch: ``group_ids[i]`` indexes its row in ``rows``,
    ``correct[i]`` says whether its answer counts as correct."""
    return [(int(rows[g]["batch_index"]), rows[g].get("kind"), rows[g]["source"], bool(c))
            for g, c in zip(group_ids, correct)]


def row_label(row: dict[str, Any], by: str) -> str | None:
    """What a curriculum calls ``row``: its kind (None without one), or its source (``by: file``)."""
    return row.get("kind") if by == "kind" else row["source"]


class Curriculum(PromptStream):
    """The training stream of a ``data.curriculum`` (see the module doc): ``PromptStream``'s, its batches drawn by
    stage and weight.

    Args:
        config: the ``data.curriculum`` group.
        rows: the prepared training rows (with ``source`` and, for ``by: kind``, ``kind``).
        sources: ``data.train_files`` entry -> its source name (``by: file`` weights name the entries).
        prompts_per_step: P, the rows of a batch.
        seed: the data seed.

    Raises:
        ValueError: a weight names a kind no row carries or a file not in ``data.train_files``; a stage has no rows.
    """

    def __init__(self, config: CurriculumConfig, rows: list[dict[str, Any]], sources: dict[str, str],
                 prompts_per_step: int, seed: int) -> None:
        super().__init__(rows, prompts_per_step, seed)
        self.config = config
        pools: dict[str, list[int]] = {}
        for i, row in enumerate(rows):
            pools.setdefault(row_label(row, config.by), []).append(i)
        self.stages: list[dict[str, tuple[float, list[int]]]] = []  # per stage: label -> (weight, row indices)
        for s, stage in enumerate(config.stages):
            self.stages.append({self._label(s, key, sources, pools): (w, pools[self._label(s, key, sources, pools)])
                                for key, w in stage.weights.items() if w > 0})
        # The stage the results put the run in and its first batch, one tuple: an engine host's thread reading a
        # batch ahead (steps rules only) sees both of one moment.
        self.anchor = (0, 0)
        self.results: deque[dict[str, list[int]]] = deque(maxlen=config.window)  # label -> [correct, total]
        self.last_rate: float | None = None  # the rolling pass rate the switch rule last read (for the logs)

    def _label(self, s: int, key: str, sources: dict[str, str], pools: dict[str, list[int]]) -> str:
        at = f"data.curriculum.stages[{s}].weights"
        if self.config.by == "file":
            if key not in sources:
                raise ValueError(f"{at} names {key!r}, not an entry of data.train_files {sorted(sources)}; name "
                                 "one of those (as written there) or add the file to data.train_files")
            return sources[key]
        if key not in pools:
            kinds = sorted(k for k in pools if k is not None)
            raise ValueError(f"{at} names the kind {key!r}, which no training row carries (kinds: {kinds}); name "
                             "one of those, or give the rows a 'kind' field")
        return key

    # ----- which stage, which weights -----
    @property
    def stage(self) -> int:
        """The stage the results put the run in (later batches may be in later stages by ``steps`` rules)."""
        return self.anchor[0]

    def stage_of(self, batch_index: int) -> int:
        """The stage of batch ``batch_index`` (>= the current stage's first): the current one, then the ``steps``
        rules after it."""
        stage, start = self.anchor
        while (steps := self.config.stages[stage].steps) is not None and batch_index >= start + steps:
            stage, start = stage + 1, start + steps
        return stage

    def pass_rates(self) -> dict[str, float]:
        """The pass rate of each label over the stage's window (labels with results only)."""
        totals: dict[str, list[int]] = {}
        for batch in self.results:
            for label, (correct, total) in batch.items():
                acc = totals.setdefault(label, [0, 0])
                acc[0], acc[1] = acc[0] + correct, acc[1] + total
        return {label: correct / total for label, (correct, total) in totals.items() if total}

    def rolling_pass_rate(self) -> float | None:
        """Correct / all trajectories of the stage's window; None before any result."""
        correct = sum(c for batch in self.results for c, _ in batch.values())
        total = sum(t for batch in self.results for _, t in batch.values())
        return correct / total if total else None

    def weights(self, stage: int) -> dict[str, float]:
        """The normalized weights of ``stage``'s labels; ``adaptive``: ``w * max(1 - p, floor)`` with the window's
        pass rates (the current stage's only: a stage not begun yet has none)."""
        raw = {label: w for label, (w, _) in self.stages[stage].items()}
        if self.config.adaptive and stage == self.stage:
            rates = self.pass_rates()
            raw = {label: w * max(1 - rates.get(label, 0.0), self.config.floor) for label, w in raw.items()}
        total = sum(raw.values())
        return {label: w / total for label, w in raw.items()}

    # ----- the stream -----
    def batch(self, batch_index: int) -> list[dict[str, Any]]:
        """The rows of batch ``batch_index``, tagged with ``batch_index`` and ``position`` (see the module doc)."""
        stage = self.stage_of(batch_index)
        weights = self.weights(stage)
        labels = sorted(weights)
        rng = np.random.default_rng([self.seed, batch_index])
        counts = rng.multinomial(self.prompts_per_step, [weights[label] for label in labels])
        picked: list[int] = []
        for label, count in zip(labels, counts):
            pool = self.stages[stage][label][1]
            picked += [pool[i] for i in np.resize(rng.permutation(len(pool)), count)]
        out = []
        for position, i in enumerate(rng.permutation(picked)):
            row = row_copy(self.rows[int(i)])
            row["batch_index"], row["position"] = batch_index, position
            out.append(row)
        return out

    def observe(self, outcomes: list[Outcome]) -> None:
        """The results of one rolled-out batch, every rank's (``outcomes``), in the order the batches were drawn.
        Moves to the batch's stage, adds its results to the window, and ends the stage where its ``pass_rate``
        rule is met (the next batch starts the next stage)."""
        if not outcomes:
            return
        last = max(o[0] for o in outcomes)
        stage = self.stage_of(last)
        if stage != self.stage:  # a steps rule ended the stage(s) before this batch
            self.anchor = (stage, self._start_of(stage))
            self.results.clear()
        batch: dict[str, list[int]] = {}
        for label, correct in self._labelled(outcomes):
            acc = batch.setdefault(label, [0, 0])
            acc[0], acc[1] = acc[0] + int(correct), acc[1] + 1
        self.results.append(batch)
        self.last_rate = self.rolling_pass_rate()
        threshold = self.config.stages[self.stage].pass_rate
        if threshold is not None and len(self.results) == self.config.window and self.last_rate >= threshold:
            self.anchor = (self.stage + 1, last + 1)
            self.results.clear()

    def _labelled(self, outcomes: list[Outcome]) -> list[tuple[str, bool]]:
        """``(label, correct)`` of each outcome: its kind (``by: kind``) or source."""
        return [(str(kind if self.config.by == "kind" else source), correct) for _, kind, source, correct in outcomes]

    def _start_of(self, stage: int) -> int:
        """The first batch of ``stage`` (after the current one, reached by ``steps`` rules)."""
        current, start = self.anchor
        for s in range(current, stage):
            start += self.config.stages[s].steps
        return start

    def metrics(self, outcomes: list[Outcome], stage: int) -> dict[str, float]:
        """A step's scalars from its ``outcomes`` (every batch it rolled out): ``data/stage`` (``stage``, its batches'),
        ``data/<by>_share/<label>`` (the share of its trajectories, so of its rows, per label of any stage: 0 where
        none was drawn, so each curve runs through every step) and ``data/pass_rate`` (the rolling pass rate the
        switch rule last read, once there is one)."""
        labels = [label for label, _ in self._labelled(outcomes)]
        out = {"data/stage": float(stage)}
        for label in sorted({label for weights in self.stages for label in weights} | set(labels)):
            out[f"data/{self.config.by}_share/{label}"] = labels.count(label) / max(len(labels), 1)
        if self.last_rate is not None:
            out["data/pass_rate"] = self.last_rate
        return out

    # ----- resume -----
    def state(self) -> dict[str, Any]:
        """For the checkpoint: the stage, its first batch and the window's results (all a batch depends on)."""
        return {"stage": self.anchor[0], "start": self.anchor[1], "results": [dict(b) for b in self.results],
                "needs_results": self.config.needs_results}

    def load(self, state: dict[str, Any]) -> None:
        """What ``state`` returned.

        Raises:
            ValueError: the saved stage is not one of this curriculum's.
        """
        if not 0 <= int(state["stage"]) < len(self.config.stages):
            raise ValueError(f"resumed curriculum state is at stage {state['stage']}, but data.curriculum has "
                             f"{len(self.config.stages)} stages; resume with the curriculum of the run that saved it")
        self.anchor = (int(state["stage"]), int(state["start"]))
        self.results = deque(({k: list(v) for k, v in b.items()} for b in state["results"]),
                             maxlen=self.config.window)
