"""The thread transport: one ``EngineHost`` in threads of the trainer's process (``model.hosts`` without
``model.hosts.engines``: one machine, no Ray), called as the fleet calls a Ray actor, so the fleet's source,
schedule and capacity rule serve it unchanged (``zerotir.fleet.transport``).

    host = ThreadHost(settings)               # the engine built now, with weights of its own from the folder
    host.roll_out.remote(calls)               # a Future per call; queued now, in call order; admitted by its stream
    host.load_weights.remote(actor, version)  # the actor's weights copied in between two engine steps
    host.close()                              # a rollout in flight ends at its next engine step

The host's engine has weights of its own (a frozen copy for transformers, the vLLM engine on its device), so it
generates while the trainer updates. Its threads are its own setting (``HostSettings.threads``: a transformers
engine's decode threads, ``model.hosts.threads``); nothing here sets torch's process-wide count. Each push copies
the whole actor (one process: no weight group, no ZeRO-3 gathers), so the thread host serves one training process
whose parameters are whole.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from torch import nn

from zerotir.config import HostsConfig, SandboxConfig, ToolConfig
from zerotir.fleet.engine_host import EngineHost, HostSettings, combine_occupancy
from zerotir.fleet.ranks import TrainerRanks
from zerotir.fleet.weight_push import PushStats
from zerotir.lora import push_size

ROLLOUT_CALLS = 64  # rollout calls side by side (more than the batches the capacity rule ever lets run at once)


class _Method:
    """``host.<method>.remote(...)``: the call on the host's executor, a Future."""

    def __init__(self, pool: cf.ThreadPoolExecutor, call: Callable[..., Any]):
        self._pool, self._call = pool, call

    def remote(self, *args: Any) -> cf.Future:
        return self._pool.submit(self._call, *args)


class _Queued(_Method):
    """``roll_out``: the calls' jobs queued on the host's stream now, together, in the caller's thread (so they start
    in the order the calls were made, as the schedule made them), then each call collected on the host's executor,
    a Future per call."""

    def __init__(self, pool: cf.ThreadPoolExecutor, queue: Callable[..., Any], collect: Callable[..., Any]):
        super().__init__(pool, collect)
        self._queue = queue

    def remote(self, calls: list[tuple]) -> list[cf.Future]:
        try:
            queued = self._queue(calls)
        except Exception as exc:  # noqa: BLE001 - raised by the transport's get, naming the engine
            failed: cf.Future = cf.Future()
            failed.set_exception(exc)
            return [failed] * len(calls)
        return [super(_Queued, self).remote(queued, i) for i in range(len(calls))]


class _Now(_Method):
    """A question (``describe``, ``occupancy``): answered at once, in the caller's thread."""

    def remote(self, *args: Any) -> cf.Future:
        done: cf.Future = cf.Future()
        try:
            done.set_result(self._call(*args))
        except Exception as exc:  # noqa: BLE001 - raised by the transport's get, naming the engine
            done.set_exception(exc)
        return done


class ThreadHost:
    """An ``EngineHost`` run by threads of this process (see the module doc): its rollout calls side by side (as a
    Ray actor's, ``cluster.spawn_hosts``), its weight copies one at a time in order, its questions answered at once.

    Args:
        settings: the host's settings (``own_process`` False: neither pinned nor torch's threads set).
    """

    def __init__(self, settings: HostSettings):
        self.host = EngineHost(settings)
        # every call's jobs reach the stream in the order the calls were made (queued in the caller's thread)
        self._calls = cf.ThreadPoolExecutor(ROLLOUT_CALLS, thread_name_prefix="zerotir-engine-host")
        self._weights = cf.ThreadPoolExecutor(1, thread_name_prefix="zerotir-engine-weights")
        self.roll_out = _Queued(self._calls, self.host.queue, self.host.collect)
        self.load_weights = _Method(self._weights, self.host.load_weights)
        self.describe = _Now(self._calls, self.host.describe)
        self.occupancy = _Now(self._calls, self.host.occupancy)

    def close(self) -> None:
        """Stop the rollouts in flight at their next engine step (the calls waiting for them raise), wait for the
        threads, close the host."""
        if self.host.stream is not None:
            self.host.stream.close()
        for pool in (self._calls, self._weights):
            pool.shutdown(wait=True, cancel_futures=True)
        self.host.close()


class ThreadTransport:
    """The transport of one thread host (``zerotir.fleet.transport.Transport``).

    Args:
        device: where the host's engine runs (``model.hosts.device``); None: the trainer's device.
        threads: the host's threads (``model.hosts.threads``); None: its engine's own default.
    """

    timeout_setting = "model.hosts.timeout_s"

    def __init__(self, device: str | None = None, threads: int | None = None):
        self.device, self.threads = device, threads

    def check_trainer(self, world_size: int, zero3: bool) -> None:
        """One training process with whole parameters: the host copies the actor in this process."""
        if world_size > 1:
            raise ValueError(f"model.hosts.max_staleness with {world_size} training processes: the engine host "
                             "in a thread serves one trainer process; run the pipeline on the rollout fleet "
                             "(model.hosts.engines >= 1), which serves every rank, set max_staleness: null, or train "
                             "on one device")
        if zero3:
            raise ValueError("model.hosts.max_staleness with DeepSpeed ZeRO-3: the engine host in a thread copies "
                             "whole parameters; run the pipeline on the rollout fleet (model.hosts.engines >= 1), use "
                             "ZeRO stage 1 / 2, or max_staleness: null")

    def settings(self, settings: HostSettings, trainer_device: Any) -> HostSettings:
        return replace(settings, device=str(self.device or trainer_device), threads=self.threads, own_process=False)

    def plan(self, fleet: HostsConfig, world: int) -> tuple[None, Callable[[], Callable[[], None]], str]:
        """No core budget: the host's threads are its setting, the trainer's stay torch's."""
        threads = self.threads if self.threads is not None else "its engine's default"
        return None, lambda: (lambda: None), f"one engine host in a thread of the trainer's process ({threads} threads)"

    trainer_sandbox = None  # the hosts reach the trainer's sandbox

    def up(self, fleet: HostsConfig, sandbox: SandboxConfig, tool: ToolConfig) -> None:
        pass

    def down(self) -> None:
        pass

    def spawn(self, fleet: HostsConfig, settings: HostSettings, cores: Any) -> list[ThreadHost]:
        return [ThreadHost(settings)]  # one host in a thread

    def roll_out(self, host: ThreadHost, calls: list[tuple]) -> list[cf.Future]:
        """The calls' jobs queued in this thread, each call collected on the host's executor
        (``ThreadHost.roll_out``)."""
        return host.roll_out.remote(calls)

    def get(self, refs: list[cf.Future], timeout_s: float, doing: str, engines: list[int] | None = None) -> list[Any]:
        """The results of the futures ``refs`` within ``timeout_s``, the first failure raised as it ends.

        Raises:
            TimeoutError: one had not ended within ``timeout_s`` (``model.hosts.timeout_s``).
            RuntimeError: a call raised (its error in the message).
        """
        names = engines if engines is not None else list(range(len(refs)))
        deadline, left = time.monotonic() + timeout_s, set(refs)
        while left:
            done, left = cf.wait(left, max(0.0, deadline - time.monotonic()), cf.FIRST_EXCEPTION)
            if not done and left:
                k = names[refs.index(next(iter(left)))]
                raise TimeoutError(f"the engine host {k} (a thread of the trainer) did not finish {doing} within "
                                   f"{timeout_s:g} s (model.hosts.timeout_s)")
            for ref in done:
                if ref.exception() is not None:
                    cause = ref.exception()
                    raise RuntimeError(f"the engine host {names[refs.index(ref)]} (a thread of the trainer) failed "
                                       f"while {doing}: {type(cause).__name__}: {cause}") from cause
        return [ref.result() for ref in refs]

    def ready(self, refs: list[cf.Future], timeout_s: float) -> list[int]:
        if not refs:
            return []
        cf.wait(refs, max(0.0, timeout_s), cf.FIRST_COMPLETED)
        return [k for k, ref in enumerate(refs) if ref.done()]

    def describe(self, hosts: list[ThreadHost], timeout_s: float, doing: str, wait: bool = False) -> list[dict]:
        return self.get([h.describe.remote() for h in hosts], timeout_s, doing)

    def occupancy(self, hosts: list[ThreadHost], timeout_s: float, before: dict[str, float]) -> dict[str, float]:
        each = self.get([h.occupancy.remote() for h in hosts], timeout_s, "reporting its occupancy")
        return combine_occupancy(each)

    def kill(self, hosts: list[ThreadHost]) -> None:
        for host in hosts:
            host.close()

    def weights(self, fleet: HostsConfig, ranks: TrainerRanks) -> ThreadWeights:
        return ThreadWeights(fleet, self)


class ThreadWeights:
    """The thread host's weights: each push copies the actor into its engine (``EngineHost.load_weights``)."""

    def __init__(self, fleet: HostsConfig, transport: ThreadTransport):
        self.fleet, self.transport = fleet, transport
        self.version: int | None = None
        self.pushes: list[PushStats] = []

    def form(self, hosts: Any) -> str:
        return "none (the host copies the actor in this process)"

    def push(self, hosts: Any, actor: nn.Module, version: int) -> PushStats:
        """``actor``'s weights into every host as ``version``, once each has ended the calls made before."""
        start = time.perf_counter()
        self.transport.get([h.load_weights.remote(actor, version) for h in hosts.handles], self.fleet.timeout_s,
                           f"copying the weights of version {version}")
        self.version = version
        nbytes, tensors = push_size(actor, hosts.adapter_paths[0])
        self.pushes.append(PushStats(version, time.perf_counter() - start, nbytes, 1, tensors))
        return self.pushes[-1]

    def last(self) -> PushStats | None:
        return self.pushes[-1] if self.pushes else None

    def close(self) -> None:
        pass
