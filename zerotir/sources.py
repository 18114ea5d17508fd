"""The rollout source a run's config names, the one place that asks which mode runs and which transport carries
the engine hosts; the module holds the result as a ``rollout.source.RolloutSource``:

- ``model.hosts.max_staleness: null``: each step's batch is generated in line (``rollout.source.InlineSource``);
- a number and ``model.hosts.engines: 0``: one engine host in a thread of the trainer's process
  (``fleet.source.FleetSource`` over ``fleet.thread_host.ThreadTransport``), generating ahead under the capacity
  rule, streamed by ``model.hosts.max_in_flight`` as a Ray engine is;
- a number and ``model.hosts.engines`` >= 1: engine hosts as Ray actors, processes of their own
  (``fleet.source.FleetSource`` over ``fleet.transport.RayTransport``).

The cross-group checks of the mode chosen run here too, before anything is built.
"""

from __future__ import annotations

from zerotir.config import HostsConfig, RolloutBackend, SamplingConfig, SandboxConfig, ToolConfig
from zerotir.fleet.source import FleetSource
from zerotir.fleet.thread_host import ThreadTransport
from zerotir.fleet.transport import RayTransport
from zerotir.rewards.protocol import Reward
from zerotir.rollout.source import InlineSource, RolloutSource


def make_rollout_source(hosts: HostsConfig, backend: RolloutBackend, sandbox: SandboxConfig, tool: ToolConfig,
                        sampling: SamplingConfig, reward: Reward | None, model_path: str, seed: int,
                        dtype: str = "float32") -> RolloutSource:
    """The source ``model.hosts`` names, over the engine of ``model.rollout`` and the sandbox of
    ``model.tool.sandbox``.

    Args:
        hosts, backend, sandbox, tool, sampling: the ``model.*`` groups of those names (``backend`` with a
            LoRA run's adapter rank: ``RolloutBackend.for_lora``).
        reward: the ``model.reward`` plug-in (``zerotir.rewards``) scoring each batch.
        model_path: the HF folder a separate engine loads at start.
        seed: the run's seed (training batch b samples with seed + b + 1: ``rollout.source.batch_seed``).
        dtype: the run's ``model.base.dtype``: the dtype of an engine host's own transformers copy of the actor.

    Raises:
        ValueError: groups that cannot run together, naming both.
    """
    hosts.check_backend(backend)
    if not hosts.enabled:
        return InlineSource(backend, sandbox, tool, sampling, reward, model_path, seed)
    transport = RayTransport() if hosts.on_ray else ThreadTransport(hosts.device, hosts.threads)
    return FleetSource(hosts, backend, sandbox, tool, sampling, reward, model_path, seed, transport, dtype)
