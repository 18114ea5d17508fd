"""A scripted slow engine for the fleet's tests: the transformers engine on the tiny model, whose requests from a
prompt that starts with ``HOLD`` wait until the test releases them (a file), so a test holds one batch's rollout
inside an engine process for as long as it likes and observes what the trainer does meanwhile.

``GatedRollout`` is a ``model.rollout`` group (an ``HFRollout`` with the gate's folder); importing this module
registers its engine with ``create_engine``, and a Ray actor imports it when it unpickles its ``HostSettings``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tests.scripted_source import FixedStream
from zerotir.config import HFRollout
from zerotir.rollout.engines import _hf_engine, create_engine

HOLD = [7, 7, 7]  # a prompt starting with these ids is held at the gate
GATE_BOUND_S = 150.0  # a held request gives up (raises) after this: longer than the tests' pytest timeout (120 s)


@dataclass(frozen=True)
class GatedRollout(HFRollout):
    """The transformers engine whose held requests (prompt ids starting with ``HOLD``) first write
    ``<gate>/held`` and then wait for ``<gate>/released``; its pushes likewise while ``<gate>/hold-push`` exists."""

    gate: str = ""


class GatedEngine:
    """``engine``'s calls, with ``submit`` of a held prompt waiting at the gate (in the caller's thread: the engine
    process's rollout is busy meanwhile, as with a slow one)."""

    def __init__(self, engine: Any, gate: Path):
        self._engine, self._gate = engine, gate

    def submit(self, key: Any, ids: list[int], params: Any) -> None:
        if list(ids[:len(HOLD)]) == HOLD:
            self._hold("held", "released")
        self._engine.submit(key, ids, params)

    def update_weights(self, named_tensors: Any) -> None:
        """A bucket of a push; while ``<gate>/hold-push`` exists, held (``push-held``, then ``released-push``)."""
        if (self._gate / "hold-push").exists():
            self._hold("push-held", "released-push")
        self._engine.update_weights(named_tensors)

    def _hold(self, held: str, released: str) -> None:
        (self._gate / held).touch()
        deadline = time.monotonic() + GATE_BOUND_S
        while not (self._gate / released).exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"GatedEngine: {self._gate / released} did not appear")
            time.sleep(0.05)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


@create_engine.register
def _gated_engine(backend: GatedRollout, *args: Any, **kwargs: Any) -> GatedEngine:
    return GatedEngine(_hf_engine(backend, *args, **kwargs), Path(backend.gate))


def rows(index: int) -> list[dict]:
    """Batch ``index`` of the stream: two prompts; batch 1's start with ``HOLD`` (held at the engine's gate)."""
    return [{"id": f"{index}-{p}", "prompt_ids": (HOLD if index == 1 else []) + [40 + p], "answer": "0",
             "batch_index": index, "position": p} for p in range(2)]


STREAM = FixedStream(rows, 2)  # the training stream of ``rows``


def wait_for(path: Path) -> None:
    while not path.exists():  # bounded by the calling test's timeout
        time.sleep(0.02)


def s1_with_batch_2_held(source: Any, gate: Path) -> Any:
    """At S = 1 with batch shares, on a started source whose engine is gated at ``gate``: step 1 takes stream batch 0
    while batch 1 (step 2's) is held in the engine, step 1's update lands in the actor meanwhile, the gate opens and
    the update is pushed (after batch 1's rollout: one call at a time), then step 2 takes batch 1. Checks what each
    batch holds and that batch 1 sampled before the push; returns the actor."""
    actor = source._actor
    first = source.batch(1)  # stream batch 0; batch 1 went to the engine with it (S = 1)
    wait_for(gate / "held")  # the engine is in batch 1's rollout, which cannot end before "released"
    assert [r["id"] for r in first.rows] == ["0-0", "0-1"] and first.trajectories.versions.max() == 0
    with torch.no_grad():
        actor.lm_head.weight.add_(1.0)  # step 1's update, while batch 1 is still being generated
    (gate / "released").touch()
    source.after_update(actor, 1)
    second = source.batch(2)  # stream batch 1
    mask = second.trajectories.action_mask
    assert mask.any() and set(second.trajectories.versions[mask].tolist()) == {0}  # sampled before push 1
    assert source.version == 1
    return actor
