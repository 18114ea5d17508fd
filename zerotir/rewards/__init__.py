"""Rewards as plug-ins (``model.reward``): the protocol and the built-ins (docs/rewards.md). The rollout applies
them (``zerotir.rollout.scoring``); nothing here imports the rollout."""

from zerotir.rewards.composite import ToolCallCost, WeightedReward, build_reward
from zerotir.rewards.judge import JudgeReward
from zerotir.rewards.math import MathReward
from zerotir.rewards.protocol import Reward, Sample, Score

__all__ = ["JudgeReward", "MathReward", "Reward", "Sample", "Score", "ToolCallCost", "WeightedReward",
           "build_reward"]
