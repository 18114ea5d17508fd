"""The engine hosts of asynchronous rollouts: ``model.hosts``, one group for the one design (an engine host in a
thread of the trainer's process, or K of them as Ray actors), and its checks against the other groups."""

from __future__ import annotations

from dataclasses import dataclass

from zerotir.config.backends import HFRollout, RolloutBackend, VLLMRollout
from zerotir.config.checks import check_min
from zerotir.config.rollout import SandboxConfig, ToolConfig

HEAD_RECIPE = ("start a Ray cluster whose nodes hold only the engines' GPUs (on the trainer's node: "
               "`CUDA_VISIBLE_DEVICES=<the engines' GPUs> ray start --head --num-gpus <their count>`) and set "
               "model.hosts.address to it (docs/fleet.md, \"Running it\")")


@dataclass(frozen=True)
class HostsConfig:
    """Asynchronous rollouts (``model.hosts``): engine hosts, each with its own engine and its own copy of the
    weights, generate the next batches while the trainer updates on this one. ``engines: 0``: one host in a thread
    of the trainer's process (``zerotir.fleet.thread_host``, docs/pipeline.md); ``engines`` K >= 1: K hosts as Ray
    actors, processes of their own (the fleet, ``zerotir.fleet``, docs/fleet.md), each loading the model folder and
    running the tool loop with its own sandbox client, fed every update's weights over a process group of their
    own (gloo on CPU, NCCL on GPU; needs the ``fleet`` extra, Ray).

    Bounded staleness (AReaL's capacity rule): the batch of RL step k may start generating once the hosts' weights
    have seen ``k - 1 - max_staleness`` updates, so every token the trainer sees at step k (weights k - 1) is at most
    ``max_staleness`` versions old. Off-policy correction: ``model.rl.off_policy_correction``."""

    max_staleness: int | None = None
    """S. None (the default): no engine host, each step generates its batch in line with the trainer's engine. 0:
    hosts that wait for every update: the synchronous schedule, the same rollouts and parameters for the same seed.
    S >= 1: the hosts run up to S batches ahead of the trainer."""
    engines: int = 0
    """Where the engine hosts run. 0 (the default): one host in a thread of the trainer's process (one machine, no
    Ray). K >= 1: K engine processes (Ray actors, the fleet); each batch is split into one contiguous share of its
    prompts per engine."""
    threads: int | None = None
    """Threads of each engine host. In a thread (engines 0): a transformers engine's decode threads where
    model.rollout.init_args.num_threads is unset (a vLLM engine keeps its serving_threads), the trainer keeping
    torch's own count; None: the engine's default (one thread for a model under its size threshold). On Ray: torch
    intra-op threads of each engine process; None: cpus_per_engine rounded down (at least 1)."""
    device: str | None = None
    """Where the engine host in a thread (engines 0) runs: the transformers copy of the weights, or the vLLM engine
    ("cuda:1": a GPU of its own, the trainer keeping its device); None: the trainer's device. Ray engines take
    gpus_per_engine instead."""
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
    have ended, whatever their batch, so no step waits for a slow group; a group still in flight that a push
    leaves over the staleness bound is aborted in the engine and generated again (pipeline/fleet_aborted_groups),
    one that ended over it is dropped and generated again (pipeline/fleet_regenerated), and the checkpoint records
    the single prompts consumed. 0 (the default): each engine rolls out one batch share at a time, and each step trains its own
    batch. At least model.sampling.n when set (a group runs whole). With engines 0 it streams the thread host's
    rollouts alike."""
    sandbox_per_node: bool = True
    """On a cluster joined at address, with tools and model.tool.sandbox.urls null: a sandbox server on every node
    that hosts engines and on the trainer's node, each started and watched by a Ray actor of its node (a server that
    dies is started again on the same address), bound to the node's IP with its own snippet uids; each engine sends
    its code to its own node's server, the trainer's validation to its node's. Set urls to use servers of your own
    instead. false: the embedded server on the trainer's node only (engines on other nodes cannot reach it). A
    local cluster (address null) is one node: the embedded server is its server."""
    timeout_s: float = 600.0
    """Bound on every wait for the engine hosts (in a thread or on Ray): a host's start, the weight group forming,
    one push or weight copy, one batch of rollouts (a batch generated ahead counts from when the trainer starts to
    wait for it); past it the run stops with an error naming what it waited for."""

    def __post_init__(self) -> None:
        check_min("hosts", self, ("max_staleness",), 0, " (null: in line; 0: synchronous through an engine host)")
        check_min("hosts", self, ("engines",), 0, " (0: one engine host in a thread of the trainer's process)")
        check_min("hosts", self, ("cpus_per_engine", "gpus_per_engine"), 0)
        check_min("hosts", self, ("threads", "trainer_threads"), 1)
        if self.gpus_per_engine != int(self.gpus_per_engine):
            raise ValueError(f"model.hosts.gpus_per_engine={self.gpus_per_engine}: the weights reach a GPU engine "
                             "over NCCL, which refuses two ranks on one GPU, so a fraction would put two engines on "
                             "one; give whole GPUs (1), or 0 for CPU engines")
        check_min("hosts", self, ("max_restarts", "max_in_flight"), 0)
        if not 0 <= self.weight_port < 65536:
            raise ValueError(f"model.hosts.weight_port={self.weight_port}: a TCP port 1..65535, or 0 for a free one")
        if not self.timeout_s > 0:
            raise ValueError(f"model.hosts.timeout_s={self.timeout_s}: must be > 0 seconds")
        self._check_mode()

    def _check_mode(self) -> None:
        """Settings of an engine host where the schedule starts none, or of the other kind of host."""
        given = [f"{k}={v!r}" for k, v in (("engines", self.engines), ("threads", self.threads),
                                             ("device", self.device), ("max_in_flight", self.max_in_flight)) if v]
        if given and not self.enabled:
            raise ValueError(f"model.hosts.{', '.join(given)} with model.hosts.max_staleness: null: engine host "
                             "settings, and the in-line run starts no engine host; set model.hosts.max_staleness "
                             "(0: each batch waits for the update before it, 1: one batch generated ahead) or drop "
                             "them")
        if self.on_ray and self.device is not None:
            raise ValueError(f"model.hosts.device={self.device!r} with model.hosts.engines={self.engines}: the device "
                             "of the engine host in a thread; Ray engines take model.hosts.gpus_per_engine; drop it "
                             "or set engines: 0")

    @property
    def enabled(self) -> bool:
        """Engine hosts generate the batches (max_staleness is set)."""
        return self.max_staleness is not None

    @property
    def on_ray(self) -> bool:
        """The hosts are the fleet's engine processes (Ray actors), not one thread of the trainer's process."""
        return self.engines > 0

    @property
    def engine_device(self) -> str:
        """Where each Ray engine runs and its end of the weight group lives."""
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

        applies = (self.on_ray and self.sandbox_per_node and self.address is not None and sandbox_needed(tool)
                   and sandbox.urls is None)
        if applies and self.cpus_per_engine == 0 and self.gpus_per_engine == 0:
            raise ValueError("model.hosts.sandbox_per_node: true with model.hosts.cpus_per_engine=0 and "
                             "gpus_per_engine=0: an engine is placed on a node by the resources it asks for; give "
                             "cpus_per_engine > 0, set model.tool.sandbox.urls to servers the engines reach, or set "
                             "sandbox_per_node: false")
        return applies

    def check_trainer_device(self, device_type: str) -> None:
        """Before a local cluster starts: one on a GPU node would hand the engines GPUs 0..K-1, the trainer's
        among them (vLLM's free-memory check fails, NCCL refuses two ranks on one GPU)."""
        if self.address is None and self.gpus_per_engine > 0 and device_type == "cuda":
            raise ValueError(f"model.hosts.address: null with model.hosts.gpus_per_engine={self.gpus_per_engine:g} "
                             "and the trainer on CUDA: a local Ray cluster gives the engines GPUs 0.., the "
                             f"trainer's too; {HEAD_RECIPE}")

    def check_sandbox_reach(self, sandbox: SandboxConfig, tool: ToolConfig, other_nodes: list[str]) -> None:
        """Once the cluster is joined, before any engine starts: the embedded sandbox listens on 127.0.0.1 of the
        trainer's node, so it serves only engines on that node. ``other_nodes``: the addresses of the cluster's
        nodes other than the trainer's (``zerotir.fleet.cluster.other_nodes``)."""
        from zerotir.tools.python import sandbox_needed  # the tools import no config

        if sandbox_needed(tool) and sandbox.urls is None and other_nodes and not self.sandbox_per_node:
            raise ValueError(f"model.hosts.address={self.address!r} with model.tool.sandbox.urls: null: the cluster has "
                             f"nodes other than the trainer's ({', '.join(other_nodes)}), and the embedded sandbox "
                             "listens on 127.0.0.1 of the trainer's node, which their engines cannot reach; start "
                             "sandbox servers the engines reach (`python -m sandbox serve --host <an address the "
                             "engine nodes reach> --port 8080` on each) and set model.tool.sandbox.urls to them, or run "
                             "the engines on the trainer's node only, or set model.hosts.sandbox_per_node: true (a "
                             "server on each node, docs/fleet.md, \"Several nodes\")")

    def check_backend(self, backend: RolloutBackend) -> None:
        """The cross-group checks with ``model.rollout``: what the engine hosts cannot run with fails here, naming
        both sides."""
        if not self.enabled:
            return
        where = (f"model.hosts.engines={self.engines}" if self.on_ray
                 else f"model.hosts.max_staleness={self.max_staleness}")
        if isinstance(backend, VLLMRollout) and backend.enable_sleep_mode:
            why = ("a fleet engine has devices of its own and never gives them to the trainer; set enable_sleep_mode: "
                   "false" if self.on_ray else "a colocated engine that sleeps while the trainer updates cannot "
                   "generate meanwhile. Set max_staleness: null (synchronous) or enable_sleep_mode: false with the "
                   "engine on GPUs of its own")
            raise ValueError(f"{where} with model.rollout.init_args.enable_sleep_mode=true: {why}")
        if backend.tensor_parallel_size > 1:
            why = ("a fleet engine is one process; set tensor_parallel_size: 1 (tensor-parallel fleet engines are not "
                   "built yet)" if self.on_ray else "the engine host drives one engine of one process; set "
                   "max_staleness: null or tensor_parallel_size: 1")
            raise ValueError(f"{where} with model.rollout.init_args.tensor_parallel_size="
                             f"{backend.tensor_parallel_size}: {why}")
        if (not self.on_ray and isinstance(backend, HFRollout) and backend.num_threads is not None
                and self.threads is not None):
            raise ValueError(f"model.rollout.init_args.num_threads={backend.num_threads} with model.hosts.threads="
                             f"{self.threads}: both set the engine host's decode threads; keep one of them")
