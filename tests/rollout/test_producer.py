"""The rollout producer of the asynchronous pipeline, against a scripted engine whose steps take time and a trainer
whose update takes time: the overlap, the capacity rule, version stamps, evaluation through the producer, and loud
failures (an error, a hang, a close)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import pytest

from tests.rollout.scripted import ScriptedEngine
from zerotir.config import ToolConfig
from zerotir.rl.staleness import staleness_stats
from zerotir.rollout.agent_loop import Schedule
from zerotir.rollout.engine import SamplingParams
from zerotir.rollout.producer import RolloutProducer, VersionedEngine
from zerotir.toy.tokenizer import build_byte_tokenizer

TOK = build_byte_tokenizer()
NO_TOOLS = ToolConfig(max_tool_calls=0)
PROMPTS = ["Q1:", "Q2:"]


@dataclass
class SlowEngine(ScriptedEngine):
    """A scripted engine whose every step takes ``step_seconds``, that counts weight loads and can fail or hang."""

    step_seconds: float = 0.0
    fail_at_step: int | None = None  # raise in this step (1-based, over the engine's life)
    hang: threading.Event | None = None  # while set, a step blocks (and sets ``hanging``) until it is cleared
    hanging: threading.Event = field(default_factory=threading.Event)
    loads: list[int] = field(default_factory=list)

    def step(self):
        if self.hang is not None and self.hang.is_set():
            self.hanging.set()
            while self.hang.is_set():
                time.sleep(0.01)
        time.sleep(self.step_seconds)
        if self.fail_at_step is not None and self.steps + 1 == self.fail_at_step:
            raise RuntimeError("the engine broke")
        return super().step()

    def update_weights(self, named_tensors) -> None:  # the pushes of these tests call load(engine) directly
        raise AssertionError("not used")


def make_engine(answer_len: int = 10, **kwargs) -> SlowEngine:
    answer = "\\boxed{" + "1" * max(1, answer_len - 8) + "}"
    return SlowEngine(TOK, {p: [[answer]] for p in PROMPTS}, n=1, tokens_per_step=1, **kwargs)


def batches(index: int) -> list[dict]:
    return [{"id": f"b{index}-{i}", "prompt_ids": TOK.encode(p, add_special_tokens=False), "answer": "1"}
            for i, p in enumerate(PROMPTS)]


def make_producer(engine, max_staleness: int, producer_timeout: float = 30.0, first_step: int = 1,
                  version: int = 0) -> RolloutProducer:
    return RolloutProducer(engine, TOK, NO_TOOLS, Schedule("trajectory"), None, None, batches,
                           lambda k: SamplingParams(n=1, temperature=0.0, max_new_tokens=64, seed=k),
                           max_staleness, producer_timeout, first_step, first_batch=10 * first_step, version=version)


def train(producer: RolloutProducer, steps: int, update_seconds: float, first_step: int = 1):
    """The trainer's loop: take, 'update' (sleep), push the next version; returns per-step staleness and times."""
    out = []
    for step in range(first_step, first_step + steps):
        produced = producer.take(step)
        stats = staleness_stats(produced.rollout.versions, produced.rollout.action_mask, step)
        time.sleep(update_seconds)
        producer.push(lambda engine, v=step: engine.loads.append(v), step)
        out.append((produced, stats))
    return out


def test_s1_overlaps_a_slow_engine_with_a_slow_update_and_never_trains_a_batch_older_than_s():
    engine = make_engine(step_seconds=0.02)  # ~10 steps per batch: ~0.2 s of generation
    producer = make_producer(engine, max_staleness=1)
    start = time.perf_counter()
    producer.start()
    try:
        results = train(producer, steps=6, update_seconds=0.2)
    finally:
        producer.close()
    wall = time.perf_counter() - start
    generation = sum(p.timings["generation"] for p, _ in results)
    update = 6 * 0.2
    assert wall < 0.8 * (generation + update), (wall, generation, update)  # strictly in turn would be their sum
    staleness = [s["staleness_max"] for _, s in results]
    assert max(staleness) <= 1 and staleness.count(1.0) >= 3  # batches 2.. were generated during an update
    assert [p.step for p, _ in results] == list(range(1, 7))
    assert [p.batch_index for p, _ in results] == list(range(10, 16))  # first_batch + (step - first_step)
    assert engine.loads == [1, 2, 3, 4, 5, 6]


def test_s0_starts_each_batch_after_the_update_before_it():
    engine = make_engine(step_seconds=0.005)
    producer = make_producer(engine, max_staleness=0)
    producer.start()
    try:
        results = train(producer, steps=4, update_seconds=0.05)
    finally:
        producer.close()
    for step, (produced, stats) in enumerate(results, start=1):
        versions = produced.rollout.versions[produced.rollout.action_mask]
        assert set(versions.tolist()) == {step - 1} and stats["staleness_max"] == 0
    assert all(p.timings["wait_for_trainer"] > 0 for p, _ in results[1:])  # it waited for each push


def test_a_resumed_producer_starts_at_its_step_and_version():
    producer = make_producer(make_engine(), max_staleness=2, first_step=5, version=4)
    producer.start()
    try:
        with pytest.raises(ValueError, match="next one is 5"):
            producer.take(6)
        results = train(producer, steps=2, update_seconds=0.0, first_step=5)
    finally:
        producer.close()
    assert [p.batch_index for p, _ in results] == [50, 51]
    assert results[0][0].rollout.versions.max() == 4


@pytest.mark.parametrize("max_staleness", [0, 1])
def test_refill_batches_come_next_in_the_stream_and_keep_the_capacity_rule(max_staleness):
    # Steps 1, 2, 3 take 2, 1 and 3 batches (refill: take(k) again). A refill batch trains at step k, not k + 1, so
    # asking for it must open the capacity gate; with S = 0 the producer would otherwise wait for the update of step
    # k, which comes only after that batch: the trainer's wait would end at producer_timeout.
    engine = make_engine(step_seconds=0.002)
    producer = make_producer(engine, max_staleness=max_staleness, producer_timeout=5.0)
    producer.start()
    taken = []
    try:
        for step, rounds in ((1, 2), (2, 1), (3, 3)):
            for _ in range(rounds):
                produced = producer.take(step)
                stats = staleness_stats(produced.rollout.versions, produced.rollout.action_mask, step)
                versions = set(produced.rollout.versions[produced.rollout.action_mask].tolist())
                taken.append((produced.step, produced.batch_index, versions, stats["staleness_max"]))
            producer.push(lambda engine, v=step: engine.loads.append(v), step)
        with pytest.raises(ValueError, match=r"next one is 4 \(or 3 again, a refill batch\)"):
            producer.take(2)
    finally:
        producer.close()
    assert [(s, b) for s, b, _, _ in taken] == [(1, 10), (1, 11), (2, 12), (3, 13), (3, 14), (3, 15)]
    assert max(worst for _, _, _, worst in taken) <= max_staleness
    if max_staleness == 0:  # every batch from the weights of the step that trains on it: version step - 1
        assert [v for _, _, v, _ in taken] == [{0}, {0}, {1}, {2}, {2}, {2}]


def test_a_push_during_a_segment_leaves_its_tokens_at_the_submitted_version():
    engine = make_engine(answer_len=40, step_seconds=0.01)
    producer = make_producer(engine, max_staleness=1)
    producer.start()
    try:
        time.sleep(0.05)  # batch 1 is being generated with version 0
        producer.push(lambda e: None, 1)
        produced = producer.take(1)
    finally:
        producer.close()
    assert produced.rollout.versions[produced.rollout.action_mask].unique().tolist() == [0]


def test_an_engine_error_ends_the_trainer_wait_with_it_and_the_step():
    producer = make_producer(make_engine(step_seconds=0.001, fail_at_step=15), max_staleness=1)
    producer.start()
    try:
        with pytest.raises(RuntimeError, match=r"batch of step 2.*the engine broke"):
            train(producer, steps=3, update_seconds=0.0)
    finally:
        producer.close()


def test_a_hung_producer_is_a_timeout_naming_what_the_trainer_waits_for():
    hang = threading.Event()
    engine = make_engine(step_seconds=0.001, hang=hang)
    producer = make_producer(engine, max_staleness=1, producer_timeout=0.5)
    hang.set()
    producer.start()
    try:
        assert engine.hanging.wait(10)
        with pytest.raises(TimeoutError, match=r"no progress .* batch of step 1 .*producer_timeout=0.5"):
            producer.take(1)
    finally:
        hang.clear()
        producer.close()
    assert not producer.running


def test_evaluation_goes_through_the_producer_between_batches():
    engine = make_engine(step_seconds=0.002)
    producer = make_producer(engine, max_staleness=1)
    producer.start()
    try:
        train(producer, steps=2, update_seconds=0.0)
        prompts = [b["prompt_ids"] for b in batches(0)]
        traj, timings = producer.evaluate(prompts, ["1", "1"], SamplingParams(n=1, temperature=0.0, max_new_tokens=64))
        assert len(traj) == 2 and "generation" in timings
        train(producer, steps=1, update_seconds=0.0, first_step=3)  # training goes on after it
    finally:
        producer.close()


def test_close_stops_a_rollout_in_flight_quietly_and_later_waits_fail():
    engine = make_engine(answer_len=200, step_seconds=0.01)
    producer = make_producer(engine, max_staleness=1)
    producer.start()
    time.sleep(0.05)
    producer.close()
    assert not producer.running
    with pytest.raises(RuntimeError, match="closed"):
        producer.take(1)


def test_a_push_waits_for_the_devices_before_and_after_the_copy():
    # On a GPU the engine's last forward can still be queued on its thread's stream when step() returns, and the
    # copy on the pushing thread's stream: the push synchronises around the load, inside the engine's lock.
    calls = []
    engine = VersionedEngine(make_engine(), 0, beat=lambda: None, stopped=lambda: False,
                             synchronize=lambda: calls.append(("sync", engine.lock.locked())))
    engine.push(lambda e: calls.append(("load", engine.version)), 1, producer_timeout=5.0)
    assert calls == [("sync", True), ("load", 0), ("sync", True)]
    assert engine.version == 1


def test_a_push_synchronizes_only_the_devices_in_use(monkeypatch):
    """Synchronizing a CUDA device opens a context on it: only the trainer's and the engine's (issue 46, A9)."""
    import torch

    from zerotir.rollout.producer import synchronize_devices

    seen = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: seen.append(str(device)))
    synchronize_devices(["cpu", "cuda:1", torch.device("cuda:1"), "cuda:0"])
    assert sorted(seen) == ["cuda:0", "cuda:1"]
    seen.clear()
    synchronize_devices(["cpu"])
    assert seen == []
    producer = RolloutProducer(make_engine(), TOK, NO_TOOLS, Schedule("trajectory"), None, None, batches,
                               lambda b: SamplingParams(n=1), 1, 30.0, 1, 0, 0, devices=("cuda:3", "cpu"))
    producer.engine._synchronize()  # what a push runs around its copy
    assert seen == ["cuda:3"]
