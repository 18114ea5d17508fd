"""The rollout source a run's config names: ``model.pipeline.max_staleness: null`` generates each step's batch in
line (``source.InlineSource``), a number runs the asynchronous pipeline (``pipeline_source.PipelineSource``). The one
place that asks which mode runs; the module holds the result as a ``source.RolloutSource``.
"""

from __future__ import annotations

from zerotir.config import PipelineConfig, RolloutBackend, SamplingConfig, SandboxConfig, ToolConfig
from zerotir.rollout.agent_loop import Reward
from zerotir.rollout.pipeline_source import PipelineSource
from zerotir.rollout.source import InlineSource, RolloutSource


def make_rollout_source(pipeline: PipelineConfig, backend: RolloutBackend, sandbox: SandboxConfig, tool: ToolConfig,
                        sampling: SamplingConfig, reward: Reward | None, model_path: str,
                        seed: int) -> RolloutSource:
    """The source ``model.pipeline`` names, over the engine of ``model.rollout`` and the sandbox of ``model.sandbox``.

    Args:
        pipeline, backend, sandbox, tool, sampling: the ``model.*`` groups of those names.
        reward: scores each trajectory as it ends (``zerotir.reward.score_batch``).
        model_path: the HF folder a separate engine loads at start.
        seed: the run's seed (training batch b samples with seed + b + 1: ``source.batch_seed``).
    """
    if pipeline.enabled:
        return PipelineSource(pipeline, backend, sandbox, tool, sampling, reward, model_path, seed)
    return InlineSource(backend, sandbox, tool, sampling, reward, model_path, seed)
