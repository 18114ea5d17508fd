"""The training stream and what the steps consumed of it.

``PromptStream`` is the endless, seeded stream of training batches: batch ``b`` can be rebuilt from its index alone,
so a run's data position is a number. ``Consumption`` records that position: every batch below ``whole`` was
consumed, and, where a step took single prompts from several batches (the fleet's streaming, which trains prompt
groups in the order they end), the rows consumed of the batches after it. The rollout source reads the stream
(``PromptDataModule.train_batches`` / ``train_batch``); a resumed run's source starts at ``whole`` and generates only
the rows of those batches that no step consumed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np


def row_copy(row: dict[str, Any]) -> dict[str, Any]:
    """A copy of a prompt row that shares no list with it (its ``prompt_ids``)."""
    return {**row, "prompt_ids": list(row["prompt_ids"])}


class PromptStream:
    """The endless training stream: batch ``b`` holds items ``b*P .. b*P+P-1`` of the concatenation of per-epoch
    permutations (epoch ``e`` shuffled with seed ``(seed, e)``), so any batch can be rebuilt from its index alone.

    Args:
        rows: the prepared prompt rows.
        prompts_per_step: P, prompts per batch.
        seed: shuffling seed.
    """

    def __init__(self, rows: list[dict[str, Any]], prompts_per_step: int, seed: int) -> None:
        self.rows, self.prompts_per_step, self.seed = rows, prompts_per_step, seed
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            if len(self._perms) > 2:  # a batch spans at most two epochs; keep memory flat
                self._perms.clear()
            self._perms[epoch] = np.random.default_rng([self.seed, epoch]).permutation(len(self.rows))
        return self._perms[epoch]

    def batch(self, batch_index: int) -> list[dict[str, Any]]:
        """The rows of global batch ``batch_index``, each tagged with ``"batch_index"`` and its ``"position"`` in
        the batch."""
        n, size = len(self.rows), self.prompts_per_step
        out = []
        for position, k in enumerate(range(batch_index * size, (batch_index + 1) * size)):
            row = row_copy(self.rows[int(self._perm(k // n)[k % n])])
            row["batch_index"], row["position"] = batch_index, position
            out.append(row)
        return out

    def batches(self, first: int, leave_out: Callable[[int], set[int] | None]) -> Iterator[list[dict[str, Any]]]:
        """The batches from ``first`` on, each less the positions ``leave_out(batch index)`` names (None: whole),
        asked as each is yielded (the steps consume as they go); a batch with no row left is skipped."""
        batch_index = first
        while True:
            left_out = leave_out(batch_index) or ()
            left = [row for row in self.batch(batch_index) if row["position"] not in left_out]
            if left:
                yield left
            batch_index += 1


class Consumption:
    """Which prompts of the training stream the steps consumed (see the module doc).

    Args:
        prompts_per_step: P, the rows of a batch (a batch whose P rows were all consumed one by one is whole).
    """

    # How the steps take the stream (``RolloutSource.steps_take``): "batch", the next batch when the step asks (in
    # line); "ahead", the same, generated ahead by an engine host, by index and in order (``train_batch``); "rows",
    # single prompt groups of several batches (streaming), each step's batch index marking only its place.
    STEPS = ("batch", "ahead", "rows")

    def __init__(self, prompts_per_step: int):
        self.prompts_per_step = prompts_per_step
        self.whole = 0  # every batch below it is consumed: the first batch a resumed source reads
        self.rows: dict[int, set[int]] = {}  # batch index (>= whole) -> positions consumed in it

    def mark_batch(self, batch_index: int) -> None:
        """Batch ``batch_index`` was consumed whole (a step took the stream's batch); with it every later batch
        whose rows were all consumed one by one before.

        Raises:
            ValueError: it was consumed already (the position only moves forward).
        """
        if batch_index < self.whole:
            raise ValueError(f"mark_consumed({batch_index}): batches up to {self.whole - 1} are already consumed")
        self.whole = batch_index + 1
        self.rows = {b: rows for b, rows in self.rows.items() if b >= self.whole}
        self._fold()

    def mark_rows(self, positions: Iterable[tuple[int, int]]) -> None:
        """The rows ``(batch index, position)`` were consumed, one by one; a batch all of whose rows are consumed
        (and every one before it) becomes part of ``whole``.

        Raises:
            ValueError: a row was consumed already, or its position is outside a batch: a prompt would train twice.
        """
        for batch_index, position in positions:
            if not 0 <= position < self.prompts_per_step:
                raise ValueError(f"mark_rows: row ({batch_index}, {position}) is outside a batch of "
                                 f"{self.prompts_per_step} prompts")
            if batch_index < self.whole or position in self.rows.get(batch_index, ()):
                raise ValueError(f"mark_rows: row {position} of batch {batch_index} was already consumed; a prompt "
                                 "would train twice")
            self.rows.setdefault(batch_index, set()).add(position)
        self._fold()

    def _fold(self) -> None:
        """Batches at ``whole`` all of whose rows are consumed become part of it: a batch that would be read
        empty, or trained again where the steps take whole batches."""
        while len(self.rows.get(self.whole, ())) == self.prompts_per_step:
            del self.rows[self.whole]
            self.whole += 1

    def consumed(self, batch_index: int) -> set[int]:
        """The positions of batch ``batch_index`` consumed so far."""
        if batch_index < self.whole:
            return set(range(self.prompts_per_step))
        return set(self.rows.get(batch_index, ()))

    def leaves_out(self, steps: str, batch_index: int) -> set[int] | None:
        """The rows of batch ``batch_index`` left out where the steps take the stream as ``steps`` (``STEPS``):
        none where steps take single rows (every batch is read whole), else those consumed, so a run resumed
        with streaming off from a streaming run's record trains nothing twice (a batch with none left is skipped)."""
        return None if steps == "rows" else self.consumed(batch_index)

    def first_batch(self, steps: str) -> int:
        """The first batch the steps read, ``whole``, once the record suits how the steps take the stream (``STEPS``).

        Raises:
            ValueError: steps take batches generated ahead (``"ahead"``), which cannot skip a batch, and a batch
                after ``whole`` has all its rows consumed (a streaming run's straggler kept ``whole`` back).
        """
        done = [b for b in sorted(self.rows) if len(self.rows[b]) == self.prompts_per_step]
        if steps == "ahead" and done:
            raise ValueError(f"data: the checkpoint's record (of a streaming run, model.hosts.max_in_flight > 0) has "
                             f"every prompt of batch(es) {done} consumed after batch {self.whole}, the first not "
                             "consumed whole, and this run trains the batches its engine hosts generate in "
                             "order, which cannot leave one out; resume with model.hosts.max_in_flight > 0 as the "
                             "run that wrote it, or in line (model.hosts.max_staleness: null)")
        return self.whole

    def state(self) -> dict[str, Any]:
        """For a checkpoint: ``consumed`` (``whole``) and ``rows`` (batch index as text -> sorted positions)."""
        return {"consumed": self.whole, "rows": {str(b): sorted(rows) for b, rows in sorted(self.rows.items())}}

    def load(self, state: dict[str, Any]) -> None:
        """What ``state`` returned (a checkpoint without ``rows``: whole batches only)."""
        self.whole = int(state["consumed"])
        self.rows = {int(b): set(rows) for b, rows in state.get("rows", {}).items()}
        self._fold()  # a record saved before ``mark_batch`` folded may hold a whole batch at ``whole``
