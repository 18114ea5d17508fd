"""Rewards as plug-ins (``model.reward``): the protocol, the one scoring path, and the built-ins (docs/rewards.md)."""

from zerotir.rollout.scoring import Reward, Sample, Score, samples_of, score_trajectories
from zerotir.rewards.composite import ToolCallCost, WeightedReward, build_reward
from zerotir.rewards.judge import JudgeReward
from zerotir.rewards.math import MathReward

__all__ = ["JudgeReward", "MathReward", "Reward", "Sample", "Score", "ToolCallCost", "WeightedReward",
           "build_reward", "samples_of", "score_trajectories"]
