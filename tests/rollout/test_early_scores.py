"""The in-line source's scoring overlaps generation (``EarlyScores``): a trajectory is scored the moment it finishes,
while the others still generate, through the reward's own ``score``, and the batch ends with the same scores as
scoring it after the rollout (``score_trajectories``, the one scoring path)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import ClassVar

import pytest
import torch

from tests.rollout.scripted import ScriptedEngine, ScriptedSandbox
from zerotir.config import ToolConfig
from zerotir.rollout.agent_loop import rollout_sync
from zerotir.rollout.engine import SamplingParams
from zerotir.rewards.protocol import Reward, Score
from zerotir.rollout.scoring import EarlyScores, score_trajectories
from zerotir.toy.tokenizer import build_byte_tokenizer
from zerotir.types import Trajectories

TOK = build_byte_tokenizer()
SCRIPTS = {"Q: 2+3?\n": [["\\boxed{5}"]], "Q: 2*3?\n": [["Let me check this once more, slowly. \\boxed{6}"]]}
ROWS = [{"problem": p, "answer": a, "prompt_ids": TOK.encode(p, add_special_tokens=False)}
        for p, a in zip(SCRIPTS, ["5", "7"])]


@dataclass(frozen=True, eq=False)
class Watched(Reward):
    """Correct when the response ends in the boxed answer; records each call's responses and the engine's step."""

    engine: ScriptedEngine
    calls: list = field(default_factory=list)

    async def score(self, samples):
        self.calls.append(([s.response[-3:] for s in samples], self.engine.steps))
        return [Score(float(s.response.endswith(f"{{{s.answer}}}")), s.response.endswith(f"{{{s.answer}}}"))
                for s in samples]


def roll_out(early: bool):
    engine = ScriptedEngine(TOK, SCRIPTS)
    reward = Watched(engine)
    scores = EarlyScores(reward, ROWS, TOK) if early else None
    traj, _ = rollout_sync(engine, TOK, ScriptedSandbox(), [r["prompt_ids"] for r in ROWS],
                           SamplingParams(temperature=0.0, max_new_tokens=256), ToolConfig(), None,
                           on_end=scores.finished if early else None)
    score_trajectories(reward, traj, ROWS, scores)
    return traj, reward.calls, engine.steps


def test_a_trajectory_is_scored_as_it_finishes_with_the_scores_of_the_batch_path():
    traj, calls, steps = roll_out(early=True)
    assert calls[0][0] == ["{5}"] and calls[0][1] < steps  # scored while the other still generated
    assert [c[0] for c in calls] == [["{5}"], ["{6}"]]
    after, once, _ = roll_out(early=False)
    assert once == [(["{5}", "{6}"], steps)]  # the batch path: one call after the rollout
    assert traj.rewards.tolist() == after.rewards.tolist() == [1.0, 0.0]
    assert traj.corrects.tolist() == after.corrects.tolist() == [True, False]


def test_a_trajectory_the_loop_did_not_report_is_scored_after_and_a_wrong_count_is_an_error():
    engine = ScriptedEngine(TOK, SCRIPTS)
    traj, _ = rollout_sync(engine, TOK, ScriptedSandbox(), [r["prompt_ids"] for r in ROWS],
                           SamplingParams(temperature=0.0, max_new_tokens=256), ToolConfig())
    reward = Watched(engine)
    score_trajectories(reward, traj, ROWS, EarlyScores(reward, ROWS, TOK))  # a rank that only replayed the loop
    assert reward.calls == [(["{5}", "{6}"], engine.steps)] and traj.rewards.tolist() == [1.0, 0.0]

    class Short(Watched):
        async def score(self, samples):
            return []

    short = Short(engine)
    with pytest.raises(RuntimeError, match="Short.score returned 0 scores for 2 samples"):
        score_trajectories(short, traj, ROWS, EarlyScores(short, ROWS, TOK))


def group(texts: list[str]) -> Trajectories:
    """One prompt group's trajectories (group id 0) with the responses ``texts``: only the text is scored."""
    n = len(texts)
    ones, counts = torch.ones(n, 1, dtype=torch.long), torch.zeros(n, dtype=torch.long)
    return Trajectories(ones, ones, ones.bool(), ones.float(), counts, counts + 1, counts, counts.float(), counts,
                        counts, counts, counts, counts.bool(), finish_reasons=["stop"] * n, response_texts=texts,
                        ground_truths=["5"] * n)


def test_stream_groups_are_scored_by_their_place_and_a_group_made_again_replaces_the_first():
    """The fleet's way: groups handed over as they come back, in any order; a group dropped over the staleness bound
    and generated again is handed over again, and its new trajectories' scores are the ones the batch gets."""
    reward = Watched(ScriptedEngine(TOK, SCRIPTS))
    early = EarlyScores(reward)
    rows = [{"problem": "Q: 2+3?\n", "answer": "5", "batch_index": 3, "position": p} for p in range(2)]
    early.ended(rows[1], group(["\\boxed{5}", "\\boxed{4}"]))
    early.ended(rows[0], group(["\\boxed{4}", "\\boxed{4}"]))  # stale: dropped, then generated again
    early.ended(rows[0], group(["\\boxed{4}", "\\boxed{5}"]))
    batch = Trajectories.cat([group(["\\boxed{4}", "\\boxed{5}"]), group(["\\boxed{5}", "\\boxed{4}"])], 0)
    batch.group_ids = torch.tensor([0, 0, 1, 1])
    score_trajectories(reward, batch, rows, early)
    assert batch.rewards.tolist() == [0.0, 1.0, 1.0, 0.0] and batch.corrects.tolist() == [False, True, True, False]
    assert [texts for texts, _ in reward.calls] == [["{5}", "{4}", "{4}", "{4}", "{4}", "{5}"]]  # none asked again
    assert early.scores == {}  # what a batch took is forgotten


@dataclass(frozen=True, eq=False)
class SideBySide(Reward):
    """Takes concurrent calls: a call whose first response starts with "slow" answers only once a later call has
    answered (scored one at a time, it never would: a TimeoutError)."""

    concurrent_calls: ClassVar[bool] = True
    answered: asyncio.Event = field(default_factory=asyncio.Event)
    calls: list = field(default_factory=list)

    async def score(self, samples):
        self.calls.append([s.response for s in samples])
        if samples[0].response.startswith("slow"):
            await asyncio.wait_for(self.answered.wait(), 10.0)
        self.answered.set()
        return [Score(float(s.response.endswith("{5}")), s.response.endswith("{5}")) for s in samples]


def test_a_reward_taking_concurrent_calls_gets_a_call_per_group_and_a_stale_answer_arriving_last_is_dropped():
    reward = SideBySide()
    early = EarlyScores(reward)
    row = {"problem": "Q: 2+3?\n", "answer": "5", "batch_index": 0, "position": 0}
    early.ended(row, group(["slow \\boxed{5}", "\\boxed{5}"]))  # stale: its call answers after the next one's
    early.ended(row, group(["\\boxed{4}", "\\boxed{5}"]))  # the group generated again
    batch = group(["\\boxed{4}", "\\boxed{5}"])
    score_trajectories(reward, batch, [row], early)
    assert reward.calls == [["slow \\boxed{5}", "\\boxed{5}"], ["\\boxed{4}", "\\boxed{5}"]]  # one call per group
    assert batch.rewards.tolist() == [0.0, 1.0]  # the group generated again, though the stale call answered last
