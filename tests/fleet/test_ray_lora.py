"""LoRA RL through the Ray fleet (one engine process): a run with
``model.base.lora`` and ``model.hosts.engines: 1`` rolls out on one ``EngineHost`` Ray actor, a process of its own
that loads the model folder and takes the actor's adapters over the weight group. After 3 RL steps the actor's
greedy output must equal the trainer's actor with its adapters merged, and every push must have moved the adapter's
bytes only. The same fit on the thread host (in the trainer's process) and on the in-line vLLM engine are
``tests/test_lora_engines.py``'s and ``tests/rollout/test_vllm_lora.py``'s; this file's helpers are theirs."""

from __future__ import annotations

import logging
import os

import lightning.pytorch as pl
import pytest

from tests.test_lora_engines import NEW_TOKENS, PROMPTS, EvenLength, lora_fit, lora_module, merged_greedy, \
    trained_adapters
from zerotir import lora
from zerotir.config import HostsConfig, HFRollout
from zerotir.rollout.engine import SamplingParams

pytest.importorskip("ray", reason='the fleet tests need Ray: pip install -e ".[fleet]"')
pytest.importorskip("peft", reason="LoRA needs peft: pip install -e '.[lora]'")

CALL_TIMEOUT_S = 120.0


class RayHostDecodes(pl.Callback):
    """At the end of training, before the source closes the fleet: the engine process's greedy output, its pid,
    the adapter paths its hosts declared and the last push's figures."""

    def on_train_end(self, trainer, pl_module) -> None:
        import ray

        source = pl_module.source
        host = source.hosts[0]  # the Ray actor handle
        params = SamplingParams(temperature=0, max_new_tokens=NEW_TOKENS, seed=0)
        traj, _ = ray.get(host.roll_out.remote(PROMPTS, None, params), timeout=CALL_TIMEOUT_S)
        self.outputs = [traj.input_ids[i, p:p + r].tolist()
                        for i, (p, r) in enumerate(zip(traj.prompt_lens.tolist(), traj.response_lens.tolist()))]
        self.pid = ray.get(host.describe.remote(), timeout=CALL_TIMEOUT_S)["pid"]
        self.push, self.paths = source.weights.last(), source.pool.adapter_paths


@pytest.mark.e2e
@pytest.mark.timeout(600)  # a hang guard: the engine process imports torch and transformers and builds its engine
def test_one_ray_engine_takes_the_adapters_and_decodes_as_the_merged_actor(tiny_dir, train_file, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="zerotir.lora")
    module = lora_module(tiny_dir, rollout=HFRollout(), reward=EvenLength(),
                         hosts=HostsConfig(max_staleness=0, engines=1, timeout_s=300))
    seen = RayHostDecodes()
    lora_fit(module, tiny_dir, train_file, tmp_path, [seen])
    assert seen.pid != os.getpid() and seen.paths == ["adapter"] and trained_adapters(module.actor)
    assert seen.outputs == merged_greedy(module.actor, PROMPTS)
    assert "model.base.lora: the 1 engine host(s) of the fleet: every update pushes the adapter tensors only" in \
        caplog.text  # said at start
    adapter_bytes = lora.push_size(module.actor, "adapter")[0]
    assert seen.push.version == 3 and seen.push.bytes == adapter_bytes  # the adapter only, over the weight group
    assert adapter_bytes * 4 < lora.push_size(module.actor, "merged")[0]
    assert module.source.hosts == []  # closed at the end of fit: the engine process and the cluster are gone
