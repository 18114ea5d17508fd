"""The fleet's source (here over the thread host: ``ThreadTransport``) scores each prompt group on the trainer as it
comes back from an engine, while the others still generate (``EarlyScores`` fed by ``FleetSchedule.ended_batch``),
and its batch ends with the scores that scoring it after the rollout gives, in the same order.

The last group of the batch is held at the engine's gate (``tests.fleet.gated_engine``) until the reward's first
call opens it: scoring that waited for the whole batch would never open it, and the fleet's wait would time out.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tests.fleet.gated_engine import HOLD, GatedRollout
from tests.fleet.test_engine_host import NO_TOOL, sender_model
from tests.scripted_source import FixedStream

from zerotir.config import HostsConfig, SamplingConfig, SandboxConfig
from zerotir.fleet.source import FleetSource
from zerotir.fleet.thread_host import ThreadTransport
from zerotir.models import load_tokenizer
from zerotir.rewards.protocol import Reward, Score
from zerotir.rollout.scoring import score_trajectories

GROUPS = 3  # prompt groups of the batch; the last one is held at the gate
N = 2  # trajectories per group


def rows(index: int) -> list[dict]:
    """Batch ``index``: ``GROUPS`` prompts, the last one starting with ``HOLD``."""
    return [{"id": f"{index}-{p}", "problem": f"q{p}", "prompt_ids": (HOLD if p == GROUPS - 1 else []) + [40 + p],
             "answer": str(p), "batch_index": index, "position": p} for p in range(GROUPS)]


@dataclass(frozen=True, eq=False)
class Opening(Reward):
    """A score of its own for every trajectory (its row's position and a hash of its response, so that a score in
    the wrong place shows); every call opens the gate (the held group goes on once the reward was called)."""

    gate: Path
    calls: list = field(default_factory=list)  # per call: the samples' positions

    async def score(self, samples):
        self.calls.append([s.metadata["position"] for s in samples])
        (self.gate / "released").touch()
        return [Score(s.metadata["position"] + int(hashlib.sha256(s.response.encode()).hexdigest()[:4], 16) / 1e5,
                      s.metadata["position"] % 2 == 0) for s in samples]


@pytest.mark.timeout(120)
def test_the_fleet_scores_each_group_as_it_ends_with_the_scores_of_the_batch_path(tiny_dir: Path,
                                                                                  tmp_path: Path) -> None:
    reward = Opening(tmp_path)
    source = FleetSource(HostsConfig(max_staleness=0, timeout_s=30.0, max_in_flight=N),
                         GatedRollout(gate=str(tmp_path)), SandboxConfig(), NO_TOOL,
                         SamplingConfig(n=N, max_response_tokens=4), reward, str(tiny_dir), 0, ThreadTransport())
    source.start(sender_model(tiny_dir, seed=1), load_tokenizer(tiny_dir), "cpu", FixedStream(rows, GROUPS))
    try:
        batch = source.batch(1)  # a scoring that waited for the batch never opens the gate: a timeout here
    finally:
        source.close()
    assert GROUPS - 1 not in reward.calls[0]  # the first call came before the held group could end
    assert sorted(p for positions in reward.calls for p in positions) == sorted(list(range(GROUPS)) * N)
    traj = batch.trajectories
    early = (traj.rewards.tolist(), traj.corrects.tolist(), traj.reward_failed.tolist())
    score_trajectories(reward, traj, batch.rows)  # the whole batch again, after the rollout
    assert traj.group_ids.tolist() == [g for g in range(GROUPS) for _ in range(N)]
    assert early == (traj.rewards.tolist(), traj.corrects.tolist(), traj.reward_failed.tolist())
    assert len(set(early[0])) == GROUPS * N  # every trajectory's own score: one in the wrong place would show
