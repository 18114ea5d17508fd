"""LoRA RL (``model.base.lora``) through the engines of a run, each started from the run's config: after 3 RL steps
the engine decodes greedily as the trainer's actor with its adapters merged, and it got there by adapter pushes
(``EngineWeights.adapter_path``). Here the engine host of ``model.hosts`` (the thread host, the fleet's cheapest
setup), whose transformers copy takes the adapters; the in-line vLLM engine's fit, started with the group's
``lora_rank`` (``VLLMRollout.for_lora``), is ``tests/rollout/test_vllm_lora.py``'s (its one vLLM engine serves that
file's other tests too), with the helpers here (``lora_fit``, ``EngineScriptedSource``)."""

from __future__ import annotations

import dataclasses

import lightning.pytorch as pl
import pytest
import torch

from tests.rollout.test_hf_engine import reference_greedy
from tests.scripted_source import Recorder, ScriptedSource, recorded
from zerotir import lora, models
from zerotir.config import (
    BaseModelConfig, HFRollout, LoraConfig, HostsConfig, OptimConfig, RLConfig, SamplingConfig, SandboxConfig,
    ToolConfig)
from zerotir.data.datamodule import PromptDataModule
from zerotir.module import ZeroTIRModule
from zerotir.rollout.engine import SamplingParams
from zerotir.rewards.protocol import Reward, Score
from zerotir.rollout.source import InlineSource

NO_TOOL = ToolConfig(max_tool_calls=0)
LORA = LoraConfig(rank=4, alpha=8.0)
PROMPTS = [[5, 6, 7, 8], [40, 41, 42]]
NEW_TOKENS = 8


@dataclasses.dataclass
class EvenLength(Reward):
    """1 for a response of an even number of characters: rewards that differ within a group, so the adapters train."""

    async def score(self, samples):
        return [Score(float(len(s.response) % 2 == 0), len(s.response) % 2 == 0) for s in samples]


def lora_module(folder, **groups) -> ZeroTIRModule:
    pl.seed_everything(0)
    return ZeroTIRModule(BaseModelConfig(str(folder), lora=LORA),
                         rl=RLConfig(micro_batch_size=2, algorithm="grpo", kl_coef=0.0),
                         optim=OptimConfig(lr=5e-2), sampling=SamplingConfig(n=2, max_response_tokens=NEW_TOKENS),
                         tool=NO_TOOL, seed=3, **groups)


def lora_fit(module, folder, train_file, root, callbacks=()) -> pl.Trainer:
    data = PromptDataModule(train_files=[str(train_file)], template="plain", tokenizer=str(folder),
                            prompts_per_step=2, test_files=[])
    trainer = pl.Trainer(accelerator="cpu", max_steps=3, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, default_root_dir=root,
                         callbacks=[Recorder(), *callbacks])
    trainer.fit(module, datamodule=data)
    assert module.rl_steps_done == 3 and any(r.stats for r in recorded(trainer))
    return trainer


def merged_greedy(actor, prompts) -> list[list[int]]:
    merged = lora.copy_merged(actor).eval()
    return [reference_greedy(merged, prompt, NEW_TOKENS)[0] for prompt in prompts]


def trained_adapters(actor) -> bool:
    return any(".lora_B." in n and p.abs().sum() > 0 for n, p in actor.named_parameters())


class EngineScriptedSource(ScriptedSource):
    """The scripted rollout with the real in-line start: the run's engine built from ``model.rollout`` and
    ``model.base.lora`` (``create_engine``: the module's group carries the adapter rank), fed every update's weights; no sandbox (no tool). Left open at the end
    for the test to decode with (the test closes it)."""

    def __init__(self, module: ZeroTIRModule):
        super().__init__(module)
        self.backend, self.engine = module.backend, None
        self.model_path = module.model_path
        self.tool = NO_TOOL  # start builds its toolbox: no tool, no sandbox

    start = InlineSource.start


class HostDecodes(pl.Callback):
    """At the end of training, before the source closes: the engine host's greedy output, through its stream (its
    engine may be rolling out the next batch meanwhile), and the last push's figures."""

    def on_train_end(self, trainer, pl_module) -> None:
        source = pl_module.source
        host = source.hosts[0].host
        traj, _ = host.roll_out(PROMPTS, None, SamplingParams(temperature=0, max_new_tokens=NEW_TOKENS, seed=0))
        self.outputs = [traj.input_ids[i, p:p + r].tolist()
                        for i, (p, r) in enumerate(zip(traj.prompt_lens.tolist(), traj.response_lens.tolist()))]
        self.push, self.paths = source.weights.last(), source.pool.adapter_paths
        self.weights = {name: p.detach().clone() for name, p in host.engine.model.named_parameters()}


def test_the_thread_hosts_engine_takes_the_adapters_and_decodes_as_the_merged_actor(tiny_dir, train_file, tmp_path):
    module = lora_module(tiny_dir, rollout=HFRollout(), reward=EvenLength(), hosts=HostsConfig(max_staleness=0))
    seen = HostDecodes()
    lora_fit(module, tiny_dir, train_file, tmp_path, [seen])
    assert seen.paths == ["adapter"] and trained_adapters(module.actor)
    # the host's copy got the adapters: lora layers on the folder's base weights, which no push changed
    base = dict(models.load_causal_lm(tiny_dir).named_parameters())
    adapters = {n for n in seen.weights if ".lora_" in n}
    assert adapters and all(torch.equal(t, base[n.replace(".base_layer", "")]) for n, t in seen.weights.items()
                            if n not in adapters)
    assert seen.outputs == merged_greedy(module.actor, PROMPTS)
    adapter_bytes = lora.push_size(module.actor, "adapter")[0]
    assert seen.push.version == 3 and seen.push.bytes == adapter_bytes
    assert adapter_bytes * 4 < lora.push_size(module.actor, "merged")[0]


def test_fleet_engines_that_take_no_adapters_refuse_a_lora_actor_at_start(tiny_dir):
    from zerotir.config import HostsConfig
    from zerotir.fleet.source import FleetSource
    from zerotir.fleet.thread_host import ThreadTransport

    source = FleetSource(HostsConfig(max_staleness=0), HFRollout(), SandboxConfig(),
                         NO_TOOL, SamplingConfig(), None, str(tiny_dir), 0, ThreadTransport())
    source.pool._where = [{"adapter_path": "merged"}]  # what the hosts' describe() declared at start
    actor = lora.add_adapters(models.load_causal_lm(tiny_dir), LORA)
    with pytest.raises(ValueError, match=r"model.base.lora: the fleet's engines \(HFRollout\) take no adapters"):
        source._check_adapters(actor)
    source._check_adapters(models.load_causal_lm(tiny_dir))  # full fine-tuning: any engine


def test_the_run_sets_its_vllm_groups_adapter_rank_from_model_base_lora(tiny_dir):
    """The one place the rank is derived: the module's engine group and its source's carry ``model.base.lora.rank``
    (``create_engine`` starts the vLLM engine for it); the saved hyperparameters keep the config as given."""
    from zerotir.config import VLLMRollout

    module = lora_module(tiny_dir, rollout=VLLMRollout())
    assert module.backend.lora_rank == LORA.rank and module.source.backend.lora_rank == LORA.rank
    assert module.hparams["rollout"]["init_args"]["lora_rank"] is None
