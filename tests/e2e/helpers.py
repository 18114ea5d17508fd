"""Test-only callbacks the e2e runs add through the command line (``--trainer.callbacks+=...``)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback


class SnapshotParams(Callback):
    """Save every parameter of the module (name -> tensor, and whether it is trainable) when fitting starts.

    Args:
        path: the file to write (``torch.save``).
    """

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def on_fit_start(self, trainer, pl_module) -> None:
        snapshot = {name: (p.detach().clone(), p.requires_grad) for name, p in pl_module.named_parameters()}
        torch.save(snapshot, self.path)


class RecordSteps(Callback):
    """Append one JSON line per RL step to ``path``: the RL step, the index and prompt ids of the last stream batch it
    took (the step's place in the stream: the fleet's cursor, or in line the last batch consumed), the prompt ids
    the step trained (the fleet's streaming takes prompt groups of several batches); and, when training starts, the
    pass-rate filter's state as restored from a checkpoint (``{"start": ...}``).

    Args:
        path: a JSONL file, appended to (a resumed run continues the same file).
    """

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def _write(self, record: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def on_train_start(self, trainer, pl_module) -> None:
        filters = [cb.state_dict() for cb in trainer.callbacks if type(cb).__name__ == "PassRateFilter"]
        self._write({"start": filters[0] if filters else None, "rl_step": pl_module.rl_steps_done})

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        from zerotir.data.stream import PromptStream

        data, cursor = trainer.datamodule, getattr(getattr(pl_module.source, "schedule", None), "cursor", None)
        index = cursor.next_take - 1 if cursor is not None else data.consumed - 1
        stream = PromptStream(data.train_rows, data.prompts_per_step, data.seed)
        self._write({"rl_step": outputs["step"].rl_step, "batch_index": index,
                     "ids": [row["id"] for row in stream.batch(index)],
                     "trained": list(outputs["step"].batch.problem_ids)})


class CompareEngineWithActor(Callback):
    """When training ends (the engine still running), greedy-decode a few prompts with the rollout engine and with a
    transformers copy of the trained actor, and write both to ``path`` (JSON): equal ids mean the weights were
    synced into the engine.

    Args:
        path: the JSON file to write.
        max_new_tokens: tokens decoded per prompt.
    """

    def __init__(self, path: str, max_new_tokens: int = 24) -> None:
        self.path = Path(path)
        self.max_new_tokens = max_new_tokens
        self.last_ids: list[list[int]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.last_ids = outputs["step"].rollout.input_ids[:4, :3].tolist()

    def on_train_end(self, trainer, pl_module) -> None:
        import copy

        from zerotir.rollout.engine import SamplingParams, generate
        from zerotir.rollout.hf_engine import HFEngine

        prompts = [list(ids) for ids in self.last_ids]
        params = SamplingParams(n=1, temperature=0.0, max_new_tokens=self.max_new_tokens)
        engine_ids = [s[0].token_ids for s in generate(pl_module.source.engine, prompts, params)]
        actor = HFEngine(copy.deepcopy(pl_module.actor).float().eval(), pl_module.tokenizer)
        actor_ids = [s[0].token_ids for s in generate(actor, prompts, params)]
        self.path.write_text(json.dumps({"engine": engine_ids, "actor": actor_ids}))


class HangAfterStep(Callback):
    """After RL step ``step`` is logged (and flushed to disk), write ``marker`` and hang: the test then kills the
    process at a known point, after the checkpoint of an earlier step and before any later one.

    Args:
        step: the RL step after which to hang.
        marker: a file written (atomically) once the step's logs are on disk.
    """

    def __init__(self, step: int, marker: str) -> None:
        self.step = step
        self.marker = Path(marker)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if outputs["step"].rl_step != self.step:
            return
        import time

        for logger in trainer.loggers:
            logger.save()
        tmp = self.marker.with_name(self.marker.name + ".tmp")
        tmp.write_text(str(self.step))
        tmp.replace(self.marker)
        while True:  # until killed
            time.sleep(60)


class SaveFinalParams(Callback):
    """When training ends, save every trainable parameter (name -> fp32 tensor) from rank 0 to ``path``; under
    DeepSpeed ZeRO-3 the partitions are gathered first (``deepspeed.zero.GatheredParameters``, on every rank).

    Args:
        path: the file to write (``torch.save``).
    """

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def on_train_end(self, trainer, pl_module) -> None:
        save_trainable(trainer, pl_module, self.path)


def save_trainable(trainer, pl_module, path: Path) -> None:
    """Every trainable parameter (name -> fp32 tensor) saved from rank 0 to ``path``; under ZeRO-3 gathered first,
    a collective every rank joins."""
    from contextlib import nullcontext

    from zerotir.parallel.deepspeed_setup import is_zero3

    named = [(n, p) for n, p in pl_module.named_parameters() if p.requires_grad]
    if is_zero3(trainer):
        import deepspeed

        trainer.model.empty_partition_cache()  # nothing left in flight by the step (release_gathered_params)
        gather = deepspeed.zero.GatheredParameters([p for _, p in named], modifier_rank=None)
    else:
        gather = nullcontext()
    with gather:
        params = {n: p.detach().float().clone() for n, p in named}
    if trainer.global_rank == 0:
        torch.save(params, path)


class SaveParamsAtStep(Callback):
    """At the end of RL step ``step``, save every trainable parameter from rank 0 to ``path`` (``save_trainable``).

    Args:
        path: the file to write (``torch.save``).
        step: the RL step after which to save.
    """

    def __init__(self, path: str, step: int) -> None:
        self.path, self.step = Path(path), step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if outputs["step"].rl_step == self.step:
            save_trainable(trainer, pl_module, self.path)


class SandboxUnreachableOnRank(Callback):
    """On global rank ``rank`` only, point ``model.tool.sandbox.urls`` at a loopback port where nothing listens, before the
    module starts its rollout source (``ZeroTIRModule.on_fit_start``; callbacks' hooks run first): that rank's sandbox is
    unreachable, as with a wrong URL in one node's configuration. The port is bound (so no other process can take it)
    but never listened on, so a connection is refused at once.

    Args:
        rank: the global rank whose sandbox is unreachable.
    """

    def __init__(self, rank: int = 1) -> None:
        self.rank = rank
        self._socket = None

    def on_fit_start(self, trainer, pl_module) -> None:
        import dataclasses
        import socket

        if trainer.global_rank != self.rank:
            return
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        source = pl_module.source  # its python tool reaches model.tool.sandbox when the source starts its tools
        sandbox = dataclasses.replace(source.tool.sandbox, urls=[url], workers=None, server_options={})
        source.tool = dataclasses.replace(source.tool, sandbox=sandbox)


class EngineKVCacheOnRank(Callback):
    """On global rank ``rank`` only, give the vLLM engine ``model.rollout.init_args.cpu_kv_cache_gib`` =
    ``gib`` before the module builds it: a cache too small for one request of ``max_model_len`` tokens makes that
    rank's engine fail to start (vLLM's own check, after the weights are loaded), as an engine short of memory on
    one GPU does.

    Args:
        gib: the KV-cache size of that rank's engine, GiB.
        rank: the global rank whose engine gets it.
    """

    def __init__(self, gib: float, rank: int = 1) -> None:
        self.gib, self.rank = gib, rank

    def on_fit_start(self, trainer, pl_module) -> None:
        import dataclasses

        if trainer.global_rank == self.rank:
            source = pl_module.source
            source.backend = dataclasses.replace(source.backend, cpu_kv_cache_gib=self.gib)


class KillFleetEngine(Callback):
    """Kills engine process ``engine`` of the rollout fleet (Ray restarts it) at the end of RL step ``step``, while
    the engines hold the next step's batch (submitted by the step's weight push): a crash mid-rollout."""

    def __init__(self, step: int, engine: int = 0):
        self.step, self.engine = step, engine

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if outputs["step"].rl_step == self.step and pl_module.source.hosts:  # the rank that drives the fleet
            import ray

            ray.kill(pl_module.source.hosts[self.engine], no_restart=False)


class KillFleetEngineBeforePush(Callback):
    """Kills engine process ``engine`` of the rollout fleet (Ray restarts it) just before the optimizer step of RL
    step ``step``, and waits until its process is gone: the weight push that follows the update meets a dead engine
    (its group's connection is gone), whenever Ray brings the new one up."""

    def __init__(self, step: int, engine: int = 0):
        self.step, self.engine, self.done = step, engine, False

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if pl_module.rl_steps_done + 1 == self.step and not self.done:
            import os
            import time

            import ray

            self.done = True
            host = pl_module.source.hosts[self.engine]
            pid = ray.get(host.describe.remote(), timeout=120)["pid"]
            ray.kill(host, no_restart=False)
            deadline = time.monotonic() + 60  # ray.kill returns at once: wait until the process is gone (a local
            while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:  # cluster: same machine)
                time.sleep(0.05)
            assert not os.path.exists(f"/proc/{pid}"), f"engine process {pid} still runs 60 s after ray.kill"


class SaveEngineWeights(Callback):
    """When training ends (the fleet still up, the last push received), save the parameters of fleet engine
    ``engine``'s model (a transformers engine: HF name -> fp32 tensor) to ``path``, from rank 0, which drives the
    fleet. Read through Ray's ``__ray_call__`` (a function run on the actor's own ``EngineHost``), so the product needs
    no accessor for a test.

    Args:
        path: the file to write (``torch.save``).
        engine: the engine process's index.
    """

    def __init__(self, path: str, engine: int = 0) -> None:
        self.path, self.engine = Path(path), engine

    def on_train_end(self, trainer, pl_module) -> None:
        if trainer.global_rank != 0:
            return
        import ray

        def weights(host):
            return {n: p.detach().float().clone() for n, p in host.engine.model.named_parameters()}

        host = pl_module.source.hosts[self.engine]
        torch.save(ray.get(host.__ray_call__.remote(weights), timeout=120), self.path)


class PauseBeforeStep(Callback):
    """Before RL step ``step`` starts, print ``paused before RL step <step>`` on stdout and sleep until the process is
    signalled: a Ctrl-C (SIGINT) sent after that line lands at a known point, between two steps, never in an update.

    Args:
        step: the RL step before which to pause.
    """

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if pl_module.rl_steps_done + 1 != self.step:
            return
        import time

        print(f"paused before RL step {self.step}", flush=True)
        while True:  # until signalled
            time.sleep(60)


class KillNodeSandbox(Callback):
    """Record the fleet's sandbox servers (one per node: ``zerotir.fleet.sandboxes``) with the code requests each
    answered (``/metrics``) just before the optimizer step of RL step ``step``, then SIGKILL the server of engine
    ``engine``'s node: the next batch, submitted after the update, runs on the server started again. Record them
    again when training ends (before the fleet closes), and after every step its infrastructure-failed trajectories
    and how many of them were trained. One JSON line per record in ``path``.

    Args:
        path: the JSONL file written.
        step: the RL step before whose optimizer step the server is killed.
        engine: whose node's server is killed.
    """

    def __init__(self, path: str, step: int = 1, engine: int = 0) -> None:
        self.path, self.step, self.engine, self.done = Path(path), step, engine, False

    def _write(self, record: dict) -> dict:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        return record

    def _servers(self, pl_module, when: str) -> dict:
        import httpx

        placed = pl_module.source.transport.sandboxes
        servers = placed.describe(60.0)
        for server in servers:
            counts = httpx.get(server["url"] + "/metrics", timeout=10, trust_env=False).json()["requests"]
            server["code_requests"] = counts.get("run_code", 0) + counts.get("run_batch", 0)
        return self._write({"when": when, "servers": servers, "trainer": placed.trainer_urls[0],
                            "engines": [placed.urls_of(k)[0] for k in range(len(placed.engine_nodes))],
                            "engine_nodes": placed.engine_nodes, "trainer_node": placed.trainer_node})

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if pl_module.rl_steps_done + 1 != self.step or self.done:
            return
        import os
        import signal

        self.done = True
        record = self._servers(pl_module, "killed")
        target = next(s for s in record["servers"] if s["url"] == record["engines"][self.engine])
        os.killpg(target["pid"], signal.SIGKILL)  # the server leads its process group: its workers go with it

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        result = outputs["step"]
        failed = result.rollout.infra_failed.bool().cpu()
        self._write({"when": "step", "step": result.rl_step, "rows": int(failed.numel()),
                     "infra_failed": int(failed.sum()), "infra_trained": int((failed & result.kept.bool().cpu()).sum())})

    def on_train_end(self, trainer, pl_module) -> None:
        self._servers(pl_module, "end")
