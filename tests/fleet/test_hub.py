"""The abort at a push (``zerotir.fleet.hub``) in one engine host's stream, on a scripted engine whose held requests
run until the test lets them go (``tests.fleet.held_engine``): a group in flight that a push leaves more than S
versions behind is aborted in the engine, queued again and generated anew, and none of the tokens it had sampled
comes back; a group within the bound runs on across the push, its tokens keeping the version of their submission.

Each test holds sample 1 of its group in the engine while sample 0 ends: the push then lands in the middle of the
group, with sampled tokens already in it. Nothing is timed: the tests wait for the engine's steps and releases."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.fleet.held_engine import TOKEN, HeldEngine, prompt
from tests.fleet.test_engine_host import NO_TOOL, sampled_ids
from zerotir.fleet.hub import EngineHub, GroupAborted
from zerotir.fleet.stream import GroupStream, Job
from zerotir.fleet.versioned import VersionedEngine
from zerotir.rollout.agent_loop import Schedule
from zerotir.rollout.engine import SamplingParams
from zerotir.toy.tokenizer import build_byte_tokenizer
from zerotir.tools import Toolbox

TOK = build_byte_tokenizer()
S = 1  # max_staleness
TIMEOUT_S = 60.0
PARAMS = SamplingParams(n=2, temperature=1.0, max_new_tokens=8, seed=3)


def _stream(engine: HeldEngine, max_staleness: int | None = S) -> GroupStream:
    return GroupStream(engine, TOK, NO_TOOL, Schedule(), Toolbox.build(NO_TOOL), max_in_flight=2,
                       max_staleness=max_staleness)


def _push(stream: GroupStream, engine: HeldEngine, version: int) -> None:
    """Push ``version``, then wait for two engine steps after it: the hub has checked its groups against it."""
    stream.push(lambda _: version, TIMEOUT_S)
    after = engine.steps
    engine.wait(f"two engine steps after the push of version {version}", lambda: engine.steps >= after + 2)


def _group_in_flight(stream: GroupStream, engine: HeldEngine) -> None:
    """Row (0, 0) submitted at version 0: sample 0 ends at once, sample 1 is held in the engine."""
    engine.hold((0, 0, 1))
    stream.push(lambda _: 0, TIMEOUT_S)
    stream.submit([Job("g", [prompt(0, 0)], [""], PARAMS)])
    engine.wait("sample 0 ending while sample 1 is held", lambda: (0, 0, 0) in engine.finished)


@contextmanager
def _group_pushed(version: int, max_staleness: int | None = S) -> Iterator[tuple[HeldEngine, GroupStream]]:
    """A stream whose group went in at version 0 (``_group_in_flight``) and saw the push of ``version`` land while
    its sample 1 was held; closed on leaving."""
    engine = HeldEngine(TOK.eos_token_id)
    stream = _stream(engine, max_staleness)
    try:
        _group_in_flight(stream, engine)
        _push(stream, engine, version)
        yield engine, stream
    finally:
        stream.close()


@pytest.mark.timeout(120)
def test_a_group_a_push_leaves_over_the_bound_is_aborted_and_generated_again_with_fresh_weights():
    with _group_pushed(1) as (engine, stream):  # floor 1 - S = 0: the group's oldest segment (version 0) can train
        assert engine.aborted == []
        stream.push(lambda _: 2, TIMEOUT_S)  # floor 1: no later step can train a token of version 0
        engine.wait("the abort of the held request", lambda: engine.aborted)
        assert engine.aborted == [(0, 0, 1)]  # released in the engine while it ran
        engine.let_go((0, 0, 1))
        (traj,) = stream.take(["g"], TIMEOUT_S)
        stats = stream.stats()
    assert set(traj.versions[traj.action_mask].tolist()) == {2}  # nothing of the aborted group came back
    assert len(traj) == 2 and sampled_ids(traj) == [[TOKEN, TOK.eos_token_id]] * 2
    assert engine.finished.count((0, 0, 0)) == 2  # sample 0 generated again
    assert (stats.aborted_groups, stats.aborted_tokens, stats.groups) == (1, 2, 1)  # sample 0's 2 tokens wasted


@pytest.mark.timeout(120)
def test_a_group_within_the_bound_runs_on_across_a_push_with_the_version_of_its_submission():
    with _group_pushed(1) as (engine, stream):  # in the middle of sample 1's request
        engine.let_go((0, 0, 1))
        (traj,) = stream.take(["g"], TIMEOUT_S)
        stats = stream.stats()
    assert engine.aborted == [] and engine.finished.count((0, 0, 0)) == 1
    assert set(traj.versions[traj.action_mask].tolist()) == {0}  # the oldest weights that may have sampled them
    assert (stats.aborted_groups, stats.aborted_tokens) == (0, 0)


@pytest.mark.timeout(120)
def test_without_a_bound_a_group_is_never_aborted():
    with _group_pushed(5, max_staleness=None) as (engine, stream):
        engine.let_go((0, 0, 1))
        (traj,) = stream.take(["g"], TIMEOUT_S)
    assert engine.aborted == [] and set(traj.versions[traj.action_mask].tolist()) == {0}


def test_an_aborted_share_gives_nothing_back_and_refuses_further_calls():
    engine = HeldEngine(TOK.eos_token_id)
    versioned = VersionedEngine(engine, 0, lambda: None, lambda: False, lambda: None)
    hub = EngineHub(versioned, max_staleness=S)
    old, new = hub.share(), hub.share()
    old.submit(0, prompt(0, 0), PARAMS)
    versioned.push(lambda _: None, 2, timeout_s=5.0)
    new.submit(0, prompt(1, 0), PARAMS)
    assert [k for k, _ in new.step()] == [0]  # the first step after the push aborted the old share first
    assert old.aborted and not new.aborted and engine.aborted == [(0, 0, 0)] and old.num_running == 0
    with pytest.raises(GroupAborted, match=r"aborted at the push of version 2 .*max_staleness=1"):
        old.step()
    with pytest.raises(ValueError, match=r"max_staleness=-1\): >= 0"):
        EngineHub(versioned, max_staleness=-1)
