"""The fleet's schedule (``zerotir.fleet.schedule``) on scripted engines: streaming at S = 1, a prompt group held in
its engine past the staleness bound is dropped when it ends, generated again with the newest weights (with its
row's seed) and trained by a later step; no step trains a token over the bound, and no row trains twice.

The engines are a scripted transport: a call's trajectories carry the weight version the engines had when it was
made, and a held row's call does not end until the test releases it. Everything runs in the test's thread."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from tests.callbacks.helpers import make_batch
from tests.scripted_source import FixedStream
from zerotir.config import HostsConfig, SamplingConfig
from zerotir.fleet.hosts import FleetHosts
from zerotir.fleet.schedule import FleetSchedule
from zerotir.fleet.shares import Share
from zerotir.rl.staleness import trainer_version
from zerotir.rollout.engine import SamplingParams

N = 2  # samples per prompt
S = 1  # max_staleness


def rows(index: int) -> list[dict]:
    """Batch ``index`` of the stream: two prompts, prompt ids naming their row."""
    return [{"id": f"{index}-{p}", "prompt_ids": [10 * index + p + 3], "answer": "0", "batch_index": index,
             "position": p} for p in range(2)]


def row_of(prompt: list[int]) -> tuple[int, int]:
    return divmod(prompt[0] - 3, 10)


@dataclass
class _Call:
    """One ``roll_out`` call: its prompts' rows, the version the engines had, the seed it sampled with."""

    rows: list[tuple[int, int]]
    version: int
    seed: int


@dataclass
class ScriptedEngines:
    """A ``Transport`` of engines that answer at once, but for the calls of ``held`` rows (until released)."""

    version: int = 0
    held: set[tuple[int, int]] = field(default_factory=set)
    calls: list[_Call] = field(default_factory=list)

    def roll_out(self, host: Any, calls: list[tuple]) -> list[_Call]:
        made = [_Call([row_of(p) for p in prompts], self.version, params.seed) for prompts, _, params in calls]
        self.calls.extend(made)
        return made

    def ready(self, refs: list[_Call], timeout_s: float) -> list[int]:
        done = [k for k, ref in enumerate(refs) if not set(ref.rows) & self.held]
        if not done:
            raise TimeoutError("ScriptedEngines: every call in flight is held; the test would wait forever")
        return done

    def get(self, refs: list[_Call], timeout_s: float, doing: str, engines: list[int] | None = None) -> list[Any]:
        out = []
        for ref in refs:
            traj = make_batch([0.0] * (N * len(ref.rows)), [g for g in range(len(ref.rows)) for _ in range(N)])
            traj.versions = torch.full_like(traj.input_ids, ref.version)
            out.append((traj, {"generation": 0.0, "sandbox": 0.0}))
        return out


def _no_death(cause: Exception, batches: list) -> None:
    raise AssertionError(f"no engine dies here: {cause}")


def test_a_group_over_the_staleness_bound_is_generated_again_and_trained_by_a_later_step():
    engines = ScriptedEngines(held={(1, 1)})  # batch 1's second prompt stays in its engine until released
    fleet = HostsConfig(max_staleness=0, engines=1, max_in_flight=4, timeout_s=5.0)
    hosts = FleetHosts(fleet, engines)
    hosts.handles = ["engine 0"]
    schedule = FleetSchedule(fleet, S, SamplingConfig(n=N), seed=0, hosts=hosts)
    trained: dict[int, list[tuple[int, int]]] = {}
    for step in range(1, 5):
        engines.version = version = step - 1  # the engines have every update before the step
        if step == 3:
            engines.held.clear()  # (1, 1) ends now, sampled with version 0: over the bound of step 3 (floor 1)
        if step == 1:
            schedule.begin(step, FixedStream(rows, 2), "rows")
        index = schedule.take(step)
        schedule.top_up(version)
        taken, traj, _ = schedule.ended_batch(step, index, 2, version, 0, _no_death)
        schedule.cursor.handed(step)
        schedule.top_up(version)
        trained[step] = [(r["batch_index"], r["position"]) for r in taken]
        assert traj.versions[traj.action_mask].min() >= trainer_version(step) - S  # never a token over the bound
        if (1, 1) in trained[step]:
            group = traj.select(traj.group_ids == trained[step].index((1, 1)))
            assert set(group.versions[group.action_mask].tolist()) == {2}  # generated again with version 2
    # Step 3 drops (1, 1) (version 0 < 1) and makes it again with version 2; step 4 trains it.
    assert trained == {1: [(0, 0), (0, 1)], 2: [(1, 0), (2, 0)], 3: [(2, 1), (3, 0)], 4: [(1, 1), (3, 1)]}
    assert schedule.regenerated == 1
    made = [call for call in engines.calls if call.rows == [(1, 1)]]
    assert [call.version for call in made] == [0, 2] and made[0].seed == made[1].seed  # its row's seed both times


class _RecordingTransport:
    """Records each ``roll_out``: the host and the calls' first prompts; a reference per call."""

    def __init__(self):
        self.made: list[tuple[str, list[int]]] = []

    def roll_out(self, host: Any, calls: list[tuple]) -> list[tuple[str, int]]:
        self.made.append((host, [prompts[0][0] for prompts, _, _ in calls]))
        return [(host, prompts[0][0]) for prompts, _, _ in calls]


def test_the_shares_of_each_engine_are_queued_together_in_their_order():
    transport = _RecordingTransport()
    hosts = FleetHosts(HostsConfig(max_staleness=1, engines=2, max_in_flight=4), transport)
    hosts.handles = ["engine 0", "engine 1"]
    shares = [Share(k, k % 2, ([[100 + k]], None, SamplingParams())) for k in range(5)]
    hosts.submit(shares)
    assert transport.made == [("engine 0", [100, 102, 104]), ("engine 1", [101, 103])]
    assert [share.ref for share in shares] == [(f"engine {k % 2}", 100 + k) for k in range(5)]
