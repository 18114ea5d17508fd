"""``VersionedEngine`` (``zerotir.fleet.versioned``), the engine of a streaming host, on a scripted engine: a push
lands between two engine steps and synchronizes the devices in use around its copy, inside the engine's lock; a
sample keeps the version it was submitted with, though a push lands while it runs; a closed host's next step raises
``RolloutsStopped``."""

from __future__ import annotations

import pytest
import torch

from tests.rollout.scripted import ScriptedEngine
from zerotir.fleet.versioned import RolloutsStopped, VersionedEngine, synchronize_devices
from zerotir.rollout.engine import EngineWeights, GenerationEngine, SamplingParams
from zerotir.toy.tokenizer import build_byte_tokenizer

TOK = build_byte_tokenizer()


def _engine(version: int | None = 0, stopped: bool = False, calls: list | None = None) -> VersionedEngine:
    scripted = ScriptedEngine(TOK, {"Q:": [["\\boxed{" + "1" * 30 + "}"]]}, n=1, tokens_per_step=1)
    engine = VersionedEngine(scripted, version, beat=lambda: None, stopped=lambda: stopped,
                             synchronize=lambda: calls.append(("sync", engine.lock.locked())) if calls is not None
                             else None)
    return engine


def test_a_push_waits_for_the_devices_before_and_after_the_copy_inside_the_lock():
    # On a GPU the engine's last forward can still be queued on its thread's stream when step() returns, and the
    # copy on the pushing thread's stream: the push synchronises around the load, inside the engine's lock.
    calls: list = []
    engine = _engine(0, calls=calls)
    engine.push(lambda e: calls.append(("load", engine.version)), 1, timeout_s=5.0)
    assert calls == [("sync", True), ("load", 0), ("sync", True)]
    assert engine.version == 1
    engine.push(lambda e: 7, None, timeout_s=5.0)  # a fleet push carries its version: the one load returns
    assert engine.version == 7
    engine.push(lambda e: None, None, timeout_s=5.0)  # the sender stopped: the version stays
    assert engine.version == 7


def test_a_push_synchronizes_only_the_devices_in_use(monkeypatch):
    """Synchronizing a CUDA device opens a context on it: only the trainer's and the engine's."""
    seen = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: seen.append(str(device)))
    synchronize_devices(["cpu", "cuda:1", torch.device("cuda:1"), "cuda:0"])
    assert sorted(seen) == ["cuda:0", "cuda:1"]
    seen.clear()
    synchronize_devices(["cpu"])
    assert seen == []


def test_a_push_during_a_segment_leaves_its_samples_at_the_submitted_version():
    engine = _engine(0)
    engine.submit("a", TOK.encode("Q:", add_special_tokens=False), SamplingParams(n=1, temperature=0.0,
                                                                                  max_new_tokens=64))
    out = engine.step()  # a step of the segment with version 0
    engine.push(lambda e: None, 1, timeout_s=5.0)  # lands between two steps, the segment still running
    while not out:
        out = engine.step()
    assert [(key, sample.version) for key, sample in out] == [("a", 0)]  # the oldest version behind its tokens
    engine.submit("b", TOK.encode("Q:", add_special_tokens=False), SamplingParams(n=1, temperature=0.0,
                                                                                  max_new_tokens=64))
    while not (out := engine.step()):
        pass
    assert [(key, sample.version) for key, sample in out] == [("b", 1)]


def test_a_stopped_hosts_next_step_raises_and_weights_go_only_through_push():
    with pytest.raises(RolloutsStopped):
        _engine(stopped=True).step()
    engine = _engine()  # a generation engine only: weights reach its engine through push, which stamps the version
    assert isinstance(engine, GenerationEngine) and not isinstance(engine, EngineWeights)
    assert not {"update_weights", "update_adapter", "load_weights_from", "reset_cache", "rest"} & set(dir(engine))
