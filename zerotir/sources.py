"""The rollout source a run's config names, the one place that asks which mode runs and which transport carries
the engine hosts; the module holds the result as a ``rollout.source.RolloutSource``:

- ``model.pipeline.max_staleness: null``: each step's batch is generated in line (``rollout.source.InlineSource``);
- a number: one engine host in a thread of the trainer's process (``fleet.source.FleetSource`` over
  ``fleet.thread_host.ThreadTransport``), generating ahead under the capacity rule, streamed by
  ``model.fleet.max_in_flight`` as a fleet engine is;
- a number and ``model.fleet.engines`` >= 1: engine hosts as Ray actors, processes of their own
  (``fleet.source.FleetSource`` over ``fleet.transport.RayTransport``).

The cross-group checks of the mode chosen run here too, before anything is built.
"""

from __future__ import annotations

from zerotir.config import FleetConfig, PipelineConfig, RolloutBackend, SamplingConfig, SandboxConfig, ToolConfig
from zerotir.fleet.source import FleetSource
from zerotir.fleet.thread_host import ThreadTransport
from zerotir.fleet.transport import RayTransport
from zerotir.rewards.protocol import Reward
from zerotir.rollout.source import InlineSource, RolloutSource


def make_rollout_source(pipeline: PipelineConfig, fleet: FleetConfig, backend: RolloutBackend, sandbox: SandboxConfig,
                        tool: ToolConfig, sampling: SamplingConfig, reward: Reward | None, model_path: str,
                        seed: int, dtype: str = "float32") -> RolloutSource:
    """The source ``model.pipeline`` and ``model.fleet`` name, over the engine of ``model.rollout`` and the sandbox
    of ``model.tool.sandbox``.

    Args:
        pipeline, fleet, backend, sandbox, tool, sampling: the ``model.*`` groups of those names (``backend`` with a
            LoRA run's adapter rank: ``RolloutBackend.for_lora``).
        reward: the ``model.reward`` plug-in (``zerotir.rewards``) scoring each batch.
        model_path: the HF folder a separate engine loads at start.
        seed: the run's seed (training batch b samples with seed + b + 1: ``rollout.source.batch_seed``).
        dtype: the run's ``model.base.dtype``: the dtype of an engine host's own transformers copy of the actor.

    Raises:
        ValueError: groups that cannot run together, naming both.
    """
    if fleet.enabled:
        fleet.check_groups(pipeline, backend)
        return FleetSource(fleet, pipeline, backend, sandbox, tool, sampling, reward, model_path, seed, RayTransport(),
                           dtype)
    pipeline.check_backend(backend)
    if fleet.max_in_flight and not pipeline.enabled:
        raise ValueError(f"model.fleet.max_in_flight={fleet.max_in_flight} with model.pipeline.max_staleness: null: "
                         "it streams the rollouts of an engine host, and the in-line run starts none; set "
                         "model.pipeline.max_staleness (0: synchronous through the host in a thread) or drop it")
    if pipeline.enabled:  # the thread host streams as a fleet engine does: model.fleet.max_in_flight, its one setting
        host = FleetConfig(engines=1, pin_cores=False, timeout_s=pipeline.producer_timeout,
                           max_in_flight=fleet.max_in_flight)
        return FleetSource(host, pipeline, backend, sandbox, tool, sampling, reward, model_path, seed,
                           ThreadTransport(pipeline.producer_device, pipeline.threads), dtype)
    return InlineSource(backend, sandbox, tool, sampling, reward, model_path, seed)
