"""The rollout fleet: ``model.fleet``, engines in processes of their own (Ray actors), and its checks against the
other groups."""

from __future__ import annotations

from dataclasses import dataclass

from zerotir.config.backends import RolloutBackend, VLLMRollout
from zerotir.config.checks import check_min
from zerotir.config.pipeline import PipelineConfig
from zerotir.config.rollout import SandboxConfig, ToolConfig

HEAD_RECIPE = ("start a Ray cluster whose nodes hold only the engines' GPUs (on the trainer's node: "
               "`CUDA_VISIBLE_DEVICES=<the engines' GPUs> ray start --head --num-gpus <their count>`) and set "
               "model.fleet.address to it (docs/fleet.md, \"Running it\")")


@dataclass(frozen=True)
class FleetConfig:
    """Rollout engines as Ray actors beside the trainer (``model.fleet``, ``zerotir.fleet``): each engine process
    loads the model folder and runs the tool loop with its own sandbox client; after every update the trainer
    broadcasts the new weights to all of them over a process group of their own (gloo on CPU, NCCL on GPU). The
    schedule is the pipeline's: ``model.pipeline.max_staleness`` S (0: each batch waits for the update before it;
    S >= 1: the fleet generates up to S batches ahead while the trainer updates). Needs the ``fleet`` extra (Ray)."""

    engines: int = 0
    """Engine processes (Ray actors). 0 (the default): no fleet, the rollouts run in the trainer's process. Each
    batch is split into one contiguous share of its prompts per engine."""
    cpus_per_engine: float = 1.0
    """CPUs Ray reserves for each engine process."""
    gpus_per_engine: float = 0.0
    """Whole GPUs Ray gives each engine process (> 0: the engine runs on "cuda" and the weights go over NCCL, which
    refuses two ranks on one GPU, so no fraction). A local cluster hands out GPUs 0..K-1, the trainer's too: with a
    trainer on CUDA, join a cluster started with `ray start --head` whose nodes hold only the engines' GPUs
    (address)."""
    threads: int | None = None
    """Torch intra-op threads in each engine process; None: cpus_per_engine rounded down (at least 1)."""
    trainer_threads: int | None = None
    """Torch intra-op threads of the trainer while the fleet runs (one training process). None: on a local
    cluster, the cores this process may use minus the engines' threads (at least 1), so that trainer and engines
    add up to the cores they have; with address set, every core this process may use. Logged when the fleet
    starts (zerotir.fleet.cores)."""
    pin_cores: bool | None = None
    """Pin the trainer and each engine process to cores of their own (os.sched_setaffinity, local cluster, one
    training process): the trainer the first trainer_threads cores, each engine the next threads ones. None (the
    default): where the budget fits the cores and the OS can pin; true: an error where it cannot; false: never."""
    address: str | None = None
    """A running Ray cluster to join ("10.0.0.1:6379", started with `ray start --head`); None: the trainer starts a
    local cluster of engines x cpus_per_engine CPUs and engines x gpus_per_engine GPUs."""
    weight_host: str = "127.0.0.1"
    """The trainer's address as the engine processes reach it: the weight group's store listens there. On a
    cluster of several nodes, the trainer node's IP."""
    weight_port: int = 0
    """The weight group's TCP port on weight_host; 0: a free one. A group formed again after an engine died takes
    the same port (the dead group's store gives it up first)."""
    max_restarts: int = 3
    """Engine processes that may die in a run (all engines together) before it stops: Ray restarts a dead one, it
    rejoins the weight group with the current weights, and the shares of batches it held are generated again
    (counted in pipeline/fleet_restarts). The next death past the bound stops the run, naming the engine, its node
    and the step."""
    max_in_flight: int = 0
    """Streaming rollouts: each engine keeps up to this many trajectories in flight, admitting the prompt groups of
    the batches the capacity rule lets start as room frees up (a group of the next batch starts while the slowest
    of this one still runs), hands each group back the moment its last sample ends, and takes each weight push
    between two of its steps, the trajectories in flight going on under the new weights (their tokens stamped with
    the version that sampled them). Each step then trains the first prompt groups in stream order among those that
    have ended, whatever their batch, so no step waits for a slow group; a group over the staleness bound is
    dropped and generated again (pipeline/fleet_regenerated), and the checkpoint records the single prompts
    consumed. 0 (the default): each engine rolls out one batch share at a time, and each step trains its own
    batch. At least model.sampling.n when set (a group runs whole). With engines 0 it sets the stream of the
    pipeline's thread host (model.pipeline.max_staleness) alike."""
    sandbox_per_node: bool = True
    """On a cluster joined at address, with tools and model.tool.sandbox.urls null: a sandbox server on every node
    that hosts engines and on the trainer's node, each started and watched by a Ray actor of its node (a server that
    dies is started again on the same address), bound to the node's IP with its own snippet uids; each engine sends
    its code to its own node's server, the trainer's validation to its node's. Set urls to use servers of your own
    instead. false: the embedded server on the trainer's node only (engines on other nodes cannot reach it). A
    local cluster (address null) is one node: the embedded server is its server."""
    timeout_s: float = 600.0
    """Bound on every wait for the fleet: an engine's start, the weight group forming, one push, one batch of
    rollouts (a batch generated ahead counts from when the trainer starts to wait for it)."""

    def __post_init__(self) -> None:
        check_min("fleet", self, ("engines",), 0, " (0: no fleet)")
        check_min("fleet", self, ("cpus_per_engine", "gpus_per_engine"), 0)
        check_min("fleet", self, ("threads", "trainer_threads"), 1)
        if self.gpus_per_engine != int(self.gpus_per_engine):
            raise ValueError(f"model.fleet.gpus_per_engine={self.gpus_per_engine}: the weights reach a GPU engine "
                             "over NCCL, which refuses two ranks on one GPU, so a fraction would put two engines on "
                             "one; give whole GPUs (1), or 0 for CPU engines")
        check_min("fleet", self, ("max_restarts", "max_in_flight"), 0)
        if not 0 <= self.weight_port < 65536:
            raise ValueError(f"model.fleet.weight_port={self.weight_port}: a TCP port 1..65535, or 0 for a free one")
        if not self.timeout_s > 0:
            raise ValueError(f"model.fleet.timeout_s={self.timeout_s}: must be > 0 seconds")

    @property
    def enabled(self) -> bool:
        """Rollouts run on the fleet's engine processes."""
        return self.engines > 0

    @property
    def device(self) -> str:
        """Where each engine runs and its end of the weight group lives."""
        return "cuda" if self.gpus_per_engine > 0 else "cpu"

    @property
    def engine_threads(self) -> int:
        """Torch threads of each engine process."""
        return self.threads or max(1, int(self.cpus_per_engine))

    def sandbox_on_each_node(self, sandbox: SandboxConfig, tool: ToolConfig) -> bool:
        """Whether the run starts a sandbox server on each node (``sandbox_per_node``): engines on a joined cluster,
        tools that include python, and no servers of the user's own (``model.tool.sandbox.urls``, which win).

        Raises:
            ValueError: it applies, but an engine asks for no resource, so nothing places it on a node.
        """
        from zerotir.tools.python import sandbox_needed  # the tools import no config

        applies = (self.enabled and self.sandbox_per_node and self.address is not None and sandbox_needed(tool)
                   and sandbox.urls is None)
        if applies and self.cpus_per_engine == 0 and self.gpus_per_engine == 0:
            raise ValueError("model.fleet.sandbox_per_node: true with model.fleet.cpus_per_engine=0 and "
                             "gpus_per_engine=0: an engine is placed on a node by the resources it asks for; give "
                             "cpus_per_engine > 0, set model.tool.sandbox.urls to servers the engines reach, or set "
                             "sandbox_per_node: false")
        return applies

    def check_trainer_device(self, device_type: str) -> None:
        """Before a local cluster starts: one on a GPU node would hand the engines GPUs 0..K-1, the trainer's
        among them (vLLM's free-memory check fails, NCCL refuses two ranks on one GPU)."""
        if self.address is None and self.gpus_per_engine > 0 and device_type == "cuda":
            raise ValueError(f"model.fleet.address: null with model.fleet.gpus_per_engine={self.gpus_per_engine:g} "
                             "and the trainer on CUDA: a local Ray cluster gives the engines GPUs 0.., the "
                             f"trainer's too; {HEAD_RECIPE}")

    def check_sandbox_reach(self, sandbox: SandboxConfig, tool: ToolConfig, other_nodes: list[str]) -> None:
        """Once the cluster is joined, before any engine starts: the embedded sandbox listens on 127.0.0.1 of the
        trainer's node, so it serves only engines on that node. ``other_nodes``: the addresses of the cluster's
        nodes other than the trainer's (``zerotir.fleet.cluster.other_nodes``)."""
        from zerotir.tools.python import sandbox_needed  # the tools import no config

        if sandbox_needed(tool) and sandbox.urls is None and other_nodes and not self.sandbox_per_node:
            raise ValueError(f"model.fleet.address={self.address!r} with model.tool.sandbox.urls: null: the cluster has "
                             f"nodes other than the trainer's ({', '.join(other_nodes)}), and the embedded sandbox "
                             "listens on 127.0.0.1 of the trainer's node, which their engines cannot reach; start "
                             "sandbox servers the engines reach (`python -m sandbox serve --host <an address the "
                             "engine nodes reach> --port 8080` on each) and set model.tool.sandbox.urls to them, or run "
                             "the engines on the trainer's node only, or set model.fleet.sandbox_per_node: true (a "
                             "server on each node, docs/fleet.md, \"Several nodes\")")

    def check_groups(self, pipeline: PipelineConfig, backend: RolloutBackend) -> None:
        """The cross-group checks with ``model.pipeline`` and ``model.rollout``, naming both sides."""
        if not self.enabled:
            return
        if not pipeline.enabled:
            raise ValueError(f"model.fleet.engines={self.engines} with model.pipeline.max_staleness: null: the fleet "
                             "runs the pipeline's schedule; set model.pipeline.max_staleness (0: each batch waits "
                             "for the update before it, 1: one batch generated ahead) or model.fleet.engines: 0")
        producer = [f"model.pipeline.{k}={v!r}" for k, v in (("threads", pipeline.threads),
                                                            ("producer_device", pipeline.producer_device)) if v]
        if producer:
            raise ValueError(f"{', '.join(producer)} with model.fleet.engines={self.engines}: settings of the "
                             "in-process producer, which the fleet replaces; use model.fleet.threads / "
                             "gpus_per_engine, or drop them")
        if backend.tensor_parallel_size > 1:
            raise ValueError(f"model.fleet.engines={self.engines} with model.rollout.init_args.tensor_parallel_size="
                             f"{backend.tensor_parallel_size}: a fleet engine is one process; set "
                             "tensor_parallel_size: 1 (tensor-parallel fleet engines are not built yet)")
        if isinstance(backend, VLLMRollout) and backend.enable_sleep_mode:
            raise ValueError(f"model.fleet.engines={self.engines} with model.rollout.init_args.enable_sleep_mode="
                             "true: a fleet engine has devices of its own and never gives them to the trainer; set "
                             "enable_sleep_mode: false")
