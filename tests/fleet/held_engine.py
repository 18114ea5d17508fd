"""A scripted engine for the abort tests: every request ends at its first step with two tokens, but for the
requests the test holds (a prompt's row and sample, ``hold``), which run until the test lets them go. It records the
requests released while still running (``aborted``): what an abort at a push does in the engine.

``HeldRollout`` is a ``model.rollout`` group (an ``HFRollout``); importing this module registers its engine with
``create_engine``. Its weights half is the transformers engine on the tiny model (the pushes copy into it); the
generation is scripted, so what runs across a push is the test's choice, not the machine's speed.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

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
    """The scripted held engine of this module, its weights those of the transformers engine."""


class HeldEngine:
    """Scripted generation (see the module doc); the weights half, when given, that of ``weights``.

    Args:
        eos: the tokenizer's end-of-sequence id.
        weights: an engine whose weights the pushes copy into (None: the test pushes nothing into it).
    """

    context_length = 1 << 20

    def __init__(self, eos: int, weights: Any = None):
        self.eos, self._weights = eos, weights
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
            done = [key for key, request in self._running.items() if request not in self.held]
            for key in done:
                self.finished.append(self._running.pop(key))
            self._cond.notify_all()
        return [(key, Sample([TOKEN, self.eos], [-0.5, -0.5], "eos")) for key in done]

    def release(self, key: Hashable) -> None:
        with self._cond:
            if key in self._running:
                self.aborted.append(self._running.pop(key))
                self._cond.notify_all()

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


@create_engine.register
def _held_engine(backend: HeldRollout, actor: Any, tokenizer: Any, *args: Any, **kwargs: Any) -> HeldEngine:
    return HeldEngine(tokenizer.eos_token_id, _hf_engine(backend, actor, tokenizer, *args, **kwargs))
