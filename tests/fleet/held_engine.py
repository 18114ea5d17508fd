"""A scripted engine for the abort tests: every request ends at its first step with two tokens, but for the
requests the test holds (a prompt's row and sample, ``hold``), which run until the test lets them go. It records the
requests released while still running (``aborted``): what an abort at a push does in the engine.

``HeldRollout`` is a ``model.rollout`` group (an ``HFRollout``) with a gate folder, through which a test drives an
engine in another process (a Ray actor): a request is held while ``<gate>/hold-<batch>-<position>-<sample>``
exists, and one released while running leaves ``<gate>/aborted-...``. Importing this module registers its engine
with ``create_engine`` (a Ray actor imports it when it unpickles its ``HostSettings``). Its weights half is the
transformers engine on the tiny model (the pushes copy into it); the generation is scripted, so what runs across a
push is the test's choice, not the machine's speed.

``abort_at_push_2`` is the fleet's scenario of an abort, for a source on any transport.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.fleet.gated_engine import wait_for

from zerotir.config import HFRollout
from zerotir.rollout.engine import Sample, SamplingParams
from zerotir.rollout.engines import _hf_engine, create_engine

WAIT_BOUND_S = 60.0  # a wait for the stream's thread gives up (fails the test) after this
TOKEN = 5  # every sample is (TOKEN, eos)


def prompt(batch: int, position: int) -> list[int]:
    """The prompt ids of stream row (``batch``, ``position``): they name the row."""
    return [10 * batch + position + 20]


def row_of(ids: list[int]) -> tuple[int, int]:
    return divmod(ids[0] - 20, 10)


@dataclass(frozen=True)
class HeldRollout(HFRollout):
    """The scripted held engine of this module, its weights those of the transformers engine, held and watched
    through ``gate``."""

    gate: str = ""


class HeldEngine:
    """Scripted generation (see the module doc); the weights half, when given, that of ``weights``.

    Args:
        eos: the tokenizer's end-of-sequence id.
        weights: an engine whose weights the pushes copy into (None: the test pushes nothing into it).
        gate: a folder whose files hold requests and record aborts (see the module doc); None: only ``hold``.
    """

    context_length = 1 << 20

    def __init__(self, eos: int, weights: Any = None, gate: Path | None = None):
        self.eos, self._weights, self._gate = eos, weights, gate
        self.held: set[tuple[int, int, int]] = set()  # (batch, position, sample) held until let go
        self.aborted: list[tuple[int, int, int]] = []  # requests released while running
        self.finished: list[tuple[int, int, int]] = []  # requests that ended, in order
        self.steps = 0
        self._running: dict[Hashable, tuple[int, int, int]] = {}
        self._cond = threading.Condition()

    def hold(self, *requests: tuple[int, int, int]) -> None:
        with self._cond:
            self.held.update(requests)

    def let_go(self, *requests: tuple[int, int, int]) -> None:
        with self._cond:
            self.held.difference_update(requests)

    def submit(self, key: Hashable, ids: list[int], params: SamplingParams) -> None:
        with self._cond:
            self._running[key] = (*row_of(ids), key[-1])  # the tool loop's row k: sample k of a one-prompt group

    def step(self) -> list[tuple[Hashable, Sample]]:
        with self._cond:
            self.steps += 1
            done = [key for key, request in self._running.items() if not self._held(request)]
            for key in done:
                self.finished.append(self._running.pop(key))
            self._cond.notify_all()
        return [(key, Sample([TOKEN, self.eos], [-0.5, -0.5], "eos")) for key in done]

    def release(self, key: Hashable) -> None:
        with self._cond:
            if key in self._running:
                self.aborted.append(self._running.pop(key))
                if self._gate is not None:
                    (self._gate / _name("aborted", self.aborted[-1])).touch()
                self._cond.notify_all()

    def _held(self, request: tuple[int, int, int]) -> bool:
        return request in self.held or self._gate is not None and (self._gate / _name("hold", request)).exists()

    @property
    def num_running(self) -> int:
        return len(self._running)

    def wait(self, what: str, until: Any) -> None:
        """Wait until ``until()`` holds (checked at each engine step and release); fail naming ``what``."""
        with self._cond:
            if not self._cond.wait_for(until, timeout=WAIT_BOUND_S):
                raise AssertionError(f"HeldEngine: {what} did not happen within {WAIT_BOUND_S:g} s")

    def __getattr__(self, name: str) -> Any:
        if self._weights is None:
            raise AttributeError(name)
        return getattr(self._weights, name)


def _name(what: str, request: tuple[int, int, int]) -> str:
    return "-".join(map(str, (what, *request)))


@create_engine.register
def _held_engine(backend: HeldRollout, actor: Any, tokenizer: Any, *args: Any, **kwargs: Any) -> HeldEngine:
    return HeldEngine(tokenizer.eos_token_id, _hf_engine(backend, actor, tokenizer, *args, **kwargs),
                      Path(backend.gate) if backend.gate else None)


def held_rows(index: int) -> list[dict]:
    """Batch ``index`` of the stream (``FixedStream(held_rows, 2)``): two prompts naming their rows."""
    return [{"id": f"{index}-{p}", "prompt_ids": prompt(index, p), "answer": "0", "batch_index": index,
             "position": p} for p in range(2)]


def abort_at_push_2(source: Any, gate: Path) -> None:
    """Streaming at S = 1 (``max_in_flight`` 4, n = 2), on a started source over ``HeldRollout(gate)`` reading
    ``held_rows``: row (1, 0) is held in the engine from version 0 (sample 0 ended, sample 1 held). Push 1 leaves it
    trainable; push 2 aborts it (the engine releases its request), the host generates it again with version 2, and
    step 3 trains it (stream batch 3 is held until then, so step 3 waits for it); step 4 trains batch 3. Checks
    that every step stays within the bound, that no row trains twice, that the aborted tokens reach no batch, and
    that the abort is counted in step 3's figures only (the aborts since the last step)."""
    batch_3 = [(3, p, j) for p in range(2) for j in range(2)]
    for request in [(1, 0, 1), *batch_3]:
        (gate / _name("hold", request)).touch()
    batches, figures = [], []
    for step in (1, 2, 3, 4):
        batches.append(source.batch(step))
        figures.append((source.stats()["fleet_aborted_groups"], source.stats()["fleet_aborted_tokens"]))
        source.after_update(source._actor, step)
        if step == 2:
            wait_for(gate / "aborted-1-0-1")  # bounded by the calling test's timeout
            (gate / "hold-1-0-1").unlink()
        if step == 3:
            for request in batch_3:
                (gate / _name("hold", request)).unlink()
    assert sorted(path.name for path in gate.glob("aborted-*")) == ["aborted-1-0-1"]
    assert figures == [(0, 0), (0, 0), (1, 2), (0, 0)]  # sample 0's 2 tokens wasted
    taken = [row for got in batches for row in got.taken]
    assert len(taken) == len(set(taken)) == 8 and (1, 0) in batches[2].taken
    for step, got in enumerate(batches, start=1):
        traj = got.trajectories
        assert int(traj.versions[traj.action_mask].min()) >= step - 1 - 1  # trainer_version(step) - S
    again, traj = batches[2].taken.index((1, 0)), batches[2].trajectories
    assert set(traj.versions[traj.action_mask & (traj.group_ids == again)[:, None]].tolist()) == {2}
