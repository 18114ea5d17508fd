"""Composed rewards on hand-worked trajectories: the weighted sum with a cost per tool call (and per tool name),
the one scoring path filling ``rewards`` and ``corrects``, the filters and the evaluation reading ``correct`` (the
reward's verdict) rather than the score, and a 1-step fit that trains on a weighted reward."""

from __future__ import annotations

import asyncio

import lightning.pytorch as pl
import pytest
import torch

from callbacks import PassRateFilter
from tests.callbacks.helpers import make_batch
from tests.scripted_source import Recorder, ScriptedSource, recorded
from zerotir.config import BaseModelConfig, FilterConfig, OptimConfig, RLConfig, SamplingConfig
from zerotir.data.datamodule import PromptDataModule
from zerotir.eval.report import records_from_trajectories
from zerotir.filters.pass_rate import pass_rate
from zerotir.module import ZeroTIRModule
from zerotir.rewards import MathReward, Sample, ToolCallCost, WeightedReward
from zerotir.rollout.scoring import score_trajectories
from zerotir.types import ToolCall

MATH = {"class_path": "zerotir.rewards.MathReward"}
COST = {"class_path": "zerotir.rewards.ToolCallCost", "init_args": {"cost": 0.1, "per_tool": {"search": 0.3}}}


def calls(*tools: str) -> tuple[ToolCall, ...]:
    return tuple(ToolCall("x", "success", "", tool) for tool in tools)


def test_the_weighted_sum_prices_each_call_by_its_tool_and_keeps_the_correctness_terms_verdict():
    reward = WeightedReward(terms=[MATH, {**COST, "weight": 2.0}])
    samples = [Sample("q", "4", "\\boxed{4}", tool_calls=calls("python", "python")),  # 1 - 2 x (0.1 + 0.1)
               Sample("q", "4", "no answer", tool_calls=calls("search")),             # 0 - 2 x 0.3
               Sample("q", "4", "\\boxed{4}", tool_calls=calls(*["python"] * 6)),     # 1 - 2 x 0.6: correct, < 0
               Sample("q", "4", "\\boxed{4}", truncated=True)]                        # cut: 0, not correct
    got = asyncio.run(reward.score(samples))
    assert [round(s.score, 6) for s in got] == [0.6, -0.6, -0.2, 0.0]
    assert [s.correct for s in got] == [True, False, True, False]
    cost_only = WeightedReward(terms=[COST, MATH], correct_from=1)  # the verdict is the named term's
    assert [s.correct for s in asyncio.run(cost_only.score(samples))] == [True, False, True, False]


def test_a_tool_priced_zero_costs_nothing_whatever_the_default():
    free = ToolCallCost(cost=0.5, per_tool={"calculator": 0.0})
    samples = [Sample("q", "4", "x", tool_calls=calls("calculator", "calculator")),  # 0 + 0
               Sample("q", "4", "x", tool_calls=calls("calculator", "search"))]      # 0 + 0.5 (the default)
    assert [s.score for s in asyncio.run(free.score(samples))] == [0.0, -0.5]


def test_bad_terms_are_errors_naming_the_setting():
    with pytest.raises(ValueError, match=r"terms\[1\].class_path='nowhere.Reward' does not import"):
        WeightedReward(terms=[MATH, {"class_path": "nowhere.Reward"}])
    with pytest.raises(ValueError, match="correct_from=2: must index terms"):
        WeightedReward(terms=[MATH, COST], correct_from=2)
    with pytest.raises(ValueError, match=r"terms\[0\]=.*only those keys"):
        WeightedReward(terms=[{"class_path": "zerotir.rewards.MathReward", "weigth": 2}])
    with pytest.raises(ValueError, match="a cost must be >= 0"):
        ToolCallCost(per_tool={"python": -1.0})


ROWS = [{"id": f"p{i}", "problem": f"{i} + {i}", "answer": str(2 * i), "prompt_text": "", "prompt_ids": [1],
         "source": "s"} for i in range(2)]


def scored_batch(reward) -> torch.Tensor:
    """Prompt 0: right with 2 python calls, wrong (no answer) with none; prompt 1: right with 11 calls, wrong."""
    traj = make_batch([0.0] * 4, [0, 0, 1, 1], num_calls=[2, 0, 11, 0],
                      texts=["\\boxed{0}", "I give up", "\\boxed{2}", "nothing"])
    traj.tool_calls = [list(calls("python", "python")), [], list(calls(*["python"] * 11)), []]
    score_trajectories(reward, traj, ROWS)
    return traj


def test_filters_and_evaluation_read_the_rewards_verdict_not_its_score():
    traj = scored_batch(WeightedReward(terms=[MATH, COST]))
    assert [round(r, 6) for r in traj.rewards.tolist()] == [0.8, 0.0, -0.1, 0.0]
    assert traj.correct.tolist() == [True, False, True, False]  # the right answer with 11 calls scores < 0
    assert [r.correct for r in records_from_trajectories(traj, ["p0", "p1"])] == [True, False, True, False]
    # pass rate 0.5 in both groups (mean rewards 0.4 and -0.05): both kept between 0.3 and 0.7
    decision = pass_rate(FilterConfig(pass_rate=True, pass_rate_low=0.3, pass_rate_high=0.7), traj)
    assert decision.keep.tolist() == [True] * 4
    plain = scored_batch(MathReward())  # the default: 0 / 1, correct exactly where the score is 1
    assert plain.rewards.tolist() == [1.0, 0.0, 1.0, 0.0] and plain.correct.tolist() == [True, False, True, False]


class ScoredSource(ScriptedSource):
    """The scripted source's trajectories, given texts and tool calls and scored by the module's reward on the
    one scoring path: sample 0 of each prompt answers right with one call, sample 1 gives no answer and calls twice."""

    def roll_out(self, rows, params):
        traj, timings = super().roll_out(rows, params)
        right = [s % 2 == 0 for s in range(len(traj))]
        traj.response_texts = [f"\\boxed{{{rows[int(g)]['answer']}}}" if r else "no idea"
                               for g, r in zip(traj.group_ids.tolist(), right)]
        traj.tool_calls = [list(calls("python")) if r else list(calls("python", "search")) for r in right]
        timings["reward"] = score_trajectories(self.reward, traj, rows)
        return traj, timings


def test_a_fit_step_trains_on_a_weighted_reward(tiny_dir, train_file, tmp_path):
    pl.seed_everything(0)
    reward = WeightedReward(terms=[MATH, {"class_path": "zerotir.rewards.ToolCallCost",
                                          "init_args": {"cost": 0.25}}])
    module = ZeroTIRModule(BaseModelConfig(str(tiny_dir)), rl=RLConfig(micro_batch_size=2), optim=OptimConfig(lr=1e-2),
                           sampling=SamplingConfig(n=2, max_response_tokens=16), reward=reward,
                           filters=FilterConfig(pass_rate=True, pass_rate_low=0.2, pass_rate_high=0.8), seed=3)
    module.source = source = ScoredSource(module)
    source.reward = module.reward
    data = PromptDataModule(train_files=[str(train_file)], template="plain", tokenizer=str(tiny_dir),
                            prompts_per_step=2, test_files=[])
    trainer = pl.Trainer(accelerator="cpu", max_steps=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path,
                         callbacks=[PassRateFilter(), Recorder()], limit_val_batches=0, num_sanity_val_steps=0)
    trainer.fit(module, datamodule=data)
    (step,) = recorded(trainer)
    assert step.rollout.rewards.tolist() == [0.75, -0.5] * 2  # 1 - 0.25 x 1 call; 0 - 0.25 x 2 calls
    assert step.rollout.correct.tolist() == [True, False] * 2
    # group mean reward 0.125 < 0.2 would drop both groups; their pass rate (0.5) keeps them: the step trains
    assert not step.skipped and step.kept.all()
