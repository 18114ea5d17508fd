"""Streaming rollouts in one engine process (``zerotir.fleet.stream``): several tool loops on one engine through
their own shares, groups admitted within ``max_in_flight`` and handed back as each ends, pushes between engine
steps with every later segment stamped, failures named. A tiny transformers model, greedy: a group's trajectories
then do not depend on what runs beside it, so each must equal its rollout alone."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.fleet.held_engine import HeldEngine, prompt
from tests.fleet.test_engine_host import NO_TOOL, sampled_ids
from zerotir.fleet.engine_host import stream_occupancy
from zerotir.fleet.hub import EngineHub
from zerotir.fleet.stream import GroupStream, Job
from zerotir.fleet.versioned import VersionedEngine
from zerotir.models import freeze, load_causal_lm, load_tokenizer
from zerotir.rollout.agent_loop import Schedule, rollout_sync
from zerotir.rollout.engine import Sample, SamplingParams
from zerotir.rollout.hf_engine import HFEngine
from zerotir.toy.tokenizer import build_byte_tokenizer
from zerotir.tools import Toolbox

PROMPTS = ["Hello", "2+3=", "The sum of 12 and 30 is", "x"]
TIMEOUT_S = 120.0


def greedy(n: int, tokens: int = 10) -> SamplingParams:
    return SamplingParams(n=n, temperature=0.0, max_new_tokens=tokens, seed=0)


@pytest.fixture(scope="module")
def world(tiny_dir):
    tokenizer = load_tokenizer(tiny_dir)
    model = freeze(load_causal_lm(tiny_dir))
    return tokenizer, model, [tokenizer.encode(p) for p in PROMPTS]


def _engine(world) -> HFEngine:
    tokenizer, model, _ = world
    return HFEngine(model, tokenizer, device="cpu", max_batch_size=8)


def _alone(world, prompt: list[int], params: SamplingParams) -> list[list[int]]:
    tokenizer, _, _ = world
    traj, _ = rollout_sync(_engine(world), tokenizer, None, [prompt], params, NO_TOOL)
    return sampled_ids(traj)


class _CountingEngine:
    """Ends every request after ``steps`` engine steps, and records the most requests it ever held at once."""

    context_length = 1 << 20

    def __init__(self, eos: int, steps: int = 3):
        self.eos, self.steps = eos, steps
        self.running: dict = {}
        self.peak = self.submitted = 0

    def steps_of(self, key) -> int:
        """How many engine steps request ``key`` runs for."""
        return self.steps

    def submit(self, key, ids, params):
        self.running[key] = self.steps_of(key)
        self.submitted += 1
        self.peak = max(self.peak, len(self.running))

    def step(self):
        done = []
        for key in list(self.running):
            self.running[key] -= 1
            if self.running[key] == 0:
                del self.running[key]
                done.append((key, Sample([self.eos], [0.0], "eos")))
        return done

    def release(self, key):
        self.running.pop(key, None)


class _ScriptedEngine(_CountingEngine):
    """Finishes request k after k + 1 steps (so keys of several shares end in different steps)."""

    def __init__(self):
        super().__init__(eos=7)

    def steps_of(self, key) -> int:
        return 1 + key[1]


def test_the_samples_of_a_shared_engine_go_to_the_share_that_submitted_them():
    hub = EngineHub(VersionedEngine(_ScriptedEngine(), 0, lambda: None, lambda: False, lambda: None))
    a, b = hub.share(), hub.share()
    a.submit(0, [1], greedy(1))
    b.submit(1, [1], greedy(1))
    assert (a.num_running, b.num_running) == (1, 1)
    assert [k for k, _ in a.step()] == [0]  # b's request 1 is still running
    assert [k for k, _ in a.step()] == [] and b.num_running == 1  # a's step finished b's: it waits in b
    assert [k for k, _ in b.step()] == [1] and b.num_running == 0


def test_the_room_is_counted_in_trajectories_prompts_times_n():
    tokenizer = build_byte_tokenizer()
    engine = _CountingEngine(tokenizer.eos_token_id)
    stream = GroupStream(engine, tokenizer, NO_TOOL, Schedule(), Toolbox.build(NO_TOOL), max_in_flight=4)
    two, one = [[65], [66]], [[67]]
    jobs = [Job(k, two, ["", ""], greedy(n=2)) for k in range(3)] + [Job(k, one, [""], greedy(n=2)) for k in (3, 4)]
    try:
        stream.submit(jobs)  # one call: the stream sees every job at once and admits what fits
        got = stream.take([job.key for job in jobs], TIMEOUT_S)
    finally:
        stream.close()
    assert [len(traj) for traj in got] == [4, 4, 4, 2, 2] and engine.submitted == 16
    assert engine.peak == 4  # a job of 2 prompts x 2 samples fills the room alone; two of 1 x 2 share it


class _LongSecondEngine(_CountingEngine):
    """Request 1 of the prompt ``[65]`` runs 5 steps, every other 1; records which prompts run at each submit."""

    def __init__(self, eos: int):
        super().__init__(eos)
        self.prompts: dict = {}
        self.beside: list[tuple[int, set[tuple[int, int]]]] = []  # (prompt's first id, {(first id, key)} running)

    def steps_of(self, key) -> int:
        return 5 if (self.prompts[key], key[1]) == (65, 1) else 1

    def submit(self, key, ids, params):
        self.prompts[key] = ids[0]
        self.beside.append((ids[0], {(self.prompts[k], k[1]) for k in self.running}))
        super().submit(key, ids, params)


def test_an_ended_trajectory_frees_its_room_for_a_waiting_group_at_once():
    """Group A (2 samples) fills the room of 2; its sample 0 ends after 1 step while sample 1 runs 5: group B starts
    beside A's sample 1 instead of waiting for A's last trajectory."""
    tokenizer = build_byte_tokenizer()
    engine = _LongSecondEngine(tokenizer.eos_token_id)
    stream = GroupStream(engine, tokenizer, NO_TOOL, Schedule(), Toolbox.build(NO_TOOL), max_in_flight=2)
    try:
        stream.submit([Job("A", [[65]], [""], greedy(n=2)), Job("B", [[67]], [""], greedy(n=1))])
        got = stream.take(["A", "B"], TIMEOUT_S)
    finally:
        stream.close()
    assert [len(traj) for traj in got] == [2, 1] and engine.peak == 2
    (started,) = [running for first, running in engine.beside if first == 67]
    assert started == {(65, 1)}  # B joined while A's last trajectory was still decoding


def test_no_engine_step_while_a_share_holds_finished_samples_not_taken():
    """A step that finished another share's sample waits for that share to take it (and resubmit) before the engine
    steps again, so every step decodes every request that can go on."""
    engine = _ScriptedEngine()
    hub = EngineHub(VersionedEngine(engine, 0, lambda: None, lambda: False, lambda: None))
    a, b = hub.share(), hub.share()
    a.submit(2, [1], greedy(1))  # 3 steps
    b.submit(0, [1], greedy(1))  # 1 step
    assert a.step() == [] and (engine.running, b.has_done) == ({(1, 2): 2}, True)
    assert a.step() == [] and engine.running == {(1, 2): 2}  # b's sample not taken yet: no step
    assert [k for k, _ in b.step()] == [0] and engine.running == {(1, 2): 2}  # b's own, without a step
    assert a.step() == [] and engine.running == {(1, 2): 1}


def test_groups_on_lockstep_rounds_share_the_engine_to_the_end():
    """The rounds schedules step a share until none of its requests runs, yielding after each step: the groups
    admitted beside it submit and decode in the same engine steps (4 requests at once, not one group's 2), and a
    share whose step waits for another to take its samples lets it."""
    tokenizer = build_byte_tokenizer()
    engine = _CountingEngine(tokenizer.eos_token_id, steps=2)
    stream = GroupStream(engine, tokenizer, NO_TOOL, Schedule("lockstep"), Toolbox.build(NO_TOOL), max_in_flight=4)
    try:
        stream.submit([Job(k, [[65 + k]], [""], greedy(n=2)) for k in range(3)])
        got = stream.take([0, 1, 2], 30.0)  # a hang guard: these end within a second
    finally:
        stream.close()
    assert [len(traj) for traj in got] == [2, 2, 2] and engine.submitted == 6 and engine.peak == 4


def test_streamed_groups_equal_their_rollouts_alone(world):
    tokenizer, _, prompts = world
    params = greedy(n=2)
    stream = GroupStream(_engine(world), tokenizer, NO_TOOL, Schedule(), Toolbox.build(NO_TOOL), max_in_flight=4)
    try:
        stream.submit([Job(("b", i), [p], [""], params) for i, p in enumerate(prompts)])
        got = stream.take([("b", i) for i in range(len(prompts))], TIMEOUT_S)
        stats = stream.stats()
    finally:
        stream.close()
    for prompt, traj in zip(prompts, got):
        assert len(traj) == 2 and traj.group_ids.tolist() == [0, 0]
        assert sampled_ids(traj) == _alone(world, prompt, params)
        assert traj.versions is None  # before any push nothing is stamped
    assert stats.groups == 4 and 0 < stats.busy <= stats.wall
    assert stats.trajectory_seconds <= 4 * stats.busy + 1e-9  # never more than max_in_flight in flight


def test_groups_that_sample_otherwise_run_side_by_side():
    """Each request brings its own sampling settings: a greedy (evaluation) group is admitted beside the sampled
    training groups in flight, and they beside it, whenever the room has space (5 requests at once in a room of 8)."""
    tokenizer = build_byte_tokenizer()
    engine = _CountingEngine(tokenizer.eos_token_id, steps=3)
    sampled = SamplingParams(n=2, temperature=1.0, max_new_tokens=10, seed=5)
    stream = GroupStream(engine, tokenizer, NO_TOOL, Schedule(), Toolbox.build(NO_TOOL), max_in_flight=8)
    try:
        stream.submit([Job("train0", [[65]], [""], sampled), Job("eval", [[66]], [""], greedy(n=1)),
                       Job("train1", [[67]], [""], sampled)])
        got = stream.take(["train0", "eval", "train1"], TIMEOUT_S)
    finally:
        stream.close()
    assert [len(t) for t in got] == [2, 1, 2] and engine.peak == 5


def test_a_greedy_group_beside_sampled_groups_decodes_as_it_would_alone(world):
    tokenizer, _, prompts = world
    sampled = SamplingParams(n=2, temperature=1.0, max_new_tokens=10, seed=5)
    stream = GroupStream(_engine(world), tokenizer, NO_TOOL, Schedule(), Toolbox.build(NO_TOOL), max_in_flight=8)
    try:
        stream.submit([Job("train0", [prompts[0]], [""], sampled), Job("eval", [prompts[1]], [""], greedy(n=1)),
                       Job("train1", [prompts[2]], [""], sampled)])
        got = stream.take(["train0", "eval", "train1"], TIMEOUT_S)
    finally:
        stream.close()
    assert [len(t) for t in got] == [2, 1, 2]
    assert sampled_ids(got[1]) == _alone(world, prompts[1], greedy(n=1))


def test_a_push_lands_between_engine_steps_and_stamps_what_follows(world):
    tokenizer, model, prompts = world
    stream = GroupStream(_engine(world), tokenizer, NO_TOOL, Schedule(), Toolbox.build(NO_TOOL), max_in_flight=2)
    loads = []

    def load(engine):
        loads.append(engine)
        return 3  # the push's version

    try:
        assert stream.push(load, TIMEOUT_S) == 3
        stream.submit([Job("after", [prompts[1]], [""], greedy(n=1))])
        (traj,) = stream.take(["after"], TIMEOUT_S)
    finally:
        stream.close()
    assert len(loads) == 1 and isinstance(loads[0], HFEngine)  # the engine itself, not a share
    assert set(traj.versions[traj.action_mask].tolist()) == {3}


def test_a_failed_group_is_named_and_the_stream_goes_on(world):
    tokenizer, _, prompts = world
    stream = GroupStream(_engine(world), tokenizer, NO_TOOL, Schedule(), Toolbox.build(NO_TOOL), max_in_flight=2)
    try:
        bad = SamplingParams(n=1, temperature=0.0, max_new_tokens=10, seed=0, stop=[""])  # refused by validate
        stream.submit([Job("bad", [prompts[0]], [""], bad), Job("good", [prompts[1]], [""], greedy(n=1))])
        with pytest.raises(RuntimeError, match=r"prompt group bad: ValueError: .*stop contains an empty string"):
            stream.take(["bad"], TIMEOUT_S)
        assert len(stream.take(["good"], TIMEOUT_S)) == 1
        with pytest.raises(TimeoutError, match=r"prompt groups \['never'\] had not ended within 0.2 s"):
            stream.take(["never"], 0.2)
    finally:
        stream.close()
    with pytest.raises(RuntimeError, match="the engine's rollout stream is closed"):
        stream.submit([Job("late", [prompts[0]], [""], greedy(n=1))])


def test_a_stream_refuses_a_negative_room(world):
    tokenizer, _, _ = world
    with pytest.raises(ValueError, match=r"max_in_flight=-1\): >= 1 to stream groups, or 0 for one job at a time"):
        GroupStream(_engine(world), tokenizer, NO_TOOL, Schedule(), Toolbox.build(NO_TOOL), max_in_flight=-1)


@contextmanager
def _held_stream(room: int, *held: tuple) -> Iterator[tuple[HeldEngine, GroupStream, list[float]]]:
    """A stream with ``room`` on a held engine (``held``: the requests it holds until let go) and a clock the test
    sets (``now[0]``, seconds); closed on leaving."""
    tokenizer = build_byte_tokenizer()
    engine = HeldEngine(tokenizer.eos_token_id)
    engine.hold(*held)
    now = [0.0]
    stream = GroupStream(engine, tokenizer, NO_TOOL, Schedule(), Toolbox.build(NO_TOOL), max_in_flight=room,
                         clock=lambda: now[0])
    try:
        yield engine, stream, now
    finally:
        stream.close()


def test_the_fill_while_work_waits_counts_only_the_time_a_group_waited():
    """Room for 2 on a clock the test sets, every request held until let go: 5 s with group A's 2 trajectories in
    flight and nothing waiting, 10 s with B waiting behind them (the room full: fill 1 while work waited), then A's
    sample 0 ends, B takes its room, and 5 s more with nothing waiting. Hand-worked: wall 20, 2 trajectories in
    flight throughout (40 trajectory-seconds), 10 s waiting (5 to 15) with 20 trajectory-seconds."""
    with _held_stream(2, (0, 0, 0), (0, 0, 1), (0, 1, 0)) as (engine, stream, now):
        stream.submit([Job("A", [prompt(0, 0)], [""], greedy(n=2))])
        engine.wait("group A admitted", lambda: engine.num_running == 2)
        now[0] = 5.0
        stream.submit([Job("B", [prompt(0, 1)], [""], greedy(n=1))])  # no room: it waits
        now[0] = 15.0
        behind = stream.stats()
        engine.let_go((0, 0, 0))
        engine.wait("B admitted in A's freed room", lambda: engine.num_running == 2 and (0, 0, 0) in engine.finished)
        now[0] = 20.0
        after = stream.stats()
        engine.let_go((0, 0, 1), (0, 1, 0))
        assert [len(traj) for traj in stream.take(["A", "B"], TIMEOUT_S)] == [2, 1]
    assert (behind.wall, behind.trajectory_seconds, behind.waiting, behind.trajectory_seconds_waiting) == \
        (15, 30, 10, 20)
    assert (after.wall, after.busy, after.trajectory_seconds, after.waiting, after.trajectory_seconds_waiting) == \
        (20, 20, 40, 10, 20)  # no job waited from 15 to 20: the waiting seconds stayed
    assert stream_occupancy(after, 2)["fill_waiting"] == 1.0


def test_with_no_job_waiting_no_second_counts_as_waiting():
    """Room for 2, group A's 2 trajectories held in flight 5 s and nothing else submitted: busy and full, never
    waiting."""
    with _held_stream(2, (0, 0, 0), (0, 0, 1)) as (engine, stream, now):
        stream.submit([Job("A", [prompt(0, 0)], [""], greedy(n=2))])
        engine.wait("group A admitted", lambda: engine.num_running == 2)
        now[0] = 5.0
        stats = stream.stats()
        engine.let_go((0, 0, 0), (0, 0, 1))
        assert len(stream.take(["A"], TIMEOUT_S)[0]) == 2
    assert (stats.wall, stats.busy, stats.trajectory_seconds, stats.waiting, stats.trajectory_seconds_waiting) == \
        (5, 5, 10, 0, 0)


def test_a_group_too_large_for_the_room_left_waits_beside_a_part_filled_room():
    """Room for 3 and group A's 2 trajectories held in flight: group B of 2 does not fit and waits 10 s, with 2 of
    3 running: fill 20 / (3 x 10) while work waited."""
    with _held_stream(3, (0, 0, 0), (0, 0, 1)) as (engine, stream, now):
        stream.submit([Job("A", [prompt(0, 0)], [""], greedy(n=2)), Job("B", [prompt(0, 1)], [""], greedy(n=2))])
        engine.wait("group A admitted", lambda: engine.num_running == 2)
        now[0] = 10.0
        stats = stream.stats()
        engine.let_go((0, 0, 0), (0, 0, 1))
        assert [len(traj) for traj in stream.take(["A", "B"], TIMEOUT_S)] == [2, 2]
    assert (stats.waiting, stats.trajectory_seconds_waiting) == (10, 20)
    assert stream_occupancy(stats, 3)["fill_waiting"] == pytest.approx(2 / 3)
