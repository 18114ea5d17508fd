"""LoRA RL (``model.base.lora``, ``zerotir.lora``) with the scripted rollout of the module tests: the settings'
errors, the reference as the base with the adapters off, what trains (adapters and value head only), the merged
weights an engine of its own receives, the transformers engine's greedy output, resume and export."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from tests.scripted_source import Recorder, ScriptedSource, recorded
from tests.test_module import CopyingEngine
from zerotir import lora, models
from zerotir.config import (
    BaseModelConfig, FilterConfig, LoraConfig, OptimConfig, RLConfig, SamplingConfig)
from zerotir.data.datamodule import PromptDataModule
from zerotir.module import ZeroTIRModule
from zerotir.rl.update import sequence_logprobs

LORA = LoraConfig(rank=4, alpha=8.0)


def lora_run(tiny_dir, train_file, root, max_steps=3, engine=None, lora_cfg=LORA, checkpointing=False, **rl):
    pl.seed_everything(0)
    module = ZeroTIRModule(BaseModelConfig(str(tiny_dir), lora=lora_cfg, gradient_checkpointing=checkpointing),
                           rl=RLConfig(**{"micro_batch_size": 2, "algorithm": "grpo", "kl_coef": 0.05, "use_kl_loss": True, **rl}),
                           optim=OptimConfig(lr=1e-2), sampling=SamplingConfig(n=2, max_response_tokens=16),
                           filters=FilterConfig(pass_rate=True, pass_rate_low=0.2, pass_rate_high=0.8), seed=3)
    module.source = ScriptedSource(module, engine=engine)
    data = PromptDataModule(train_files=[str(train_file)], template="plain", tokenizer=str(tiny_dir),
                            prompts_per_step=2, test_files=[])
    ckpt = ModelCheckpoint(dirpath=root / "ckpt", every_n_train_steps=1, save_last=True, save_top_k=-1)
    trainer = pl.Trainer(accelerator="cpu", max_steps=max_steps, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=root, callbacks=[ckpt, Recorder()])
    return module, data, trainer


def _snapshot(module):
    return {n: p.detach().clone() for n, p in module.named_parameters()}


@pytest.mark.parametrize("field,value,words", [
    ("rank", 0, "model.base.lora.rank=0"), ("alpha", 0.0, "model.base.lora.alpha"),
    ("dropout", 1.0, "model.base.lora.dropout"), ("target_modules", [], "model.base.lora.target_modules"),
    ("target_modules", ["q_proj", "lm_head"], "LM head"), ("bias", "some", "model.base.lora.bias"),
    ("critic", "shared", "model.base.lora.critic")])
def test_bad_settings_name_the_field(field, value, words):
    with pytest.raises(ValueError, match=words):
        LoraConfig(**{field: value})


def test_a_target_that_matches_no_module_names_the_field(tiny_dir):
    with pytest.raises(ValueError, match="model.base.lora.target_modules"):
        lora.add_adapters(models.load_causal_lm(tiny_dir), LoraConfig(target_modules=["no_such_proj"]))


def test_the_actors_adapters_are_scaled_by_alpha_over_rank(tiny_dir):
    import peft

    module = ZeroTIRModule(BaseModelConfig(str(tiny_dir), lora=LORA))  # rank 4, alpha 8
    module.configure_model()
    layers = [m for m in module.actor.modules() if isinstance(m, peft.tuners.lora.LoraLayer)]
    assert layers and {layer.scaling[lora.ADAPTER] for layer in layers} == {2.0}  # 8 / 4
    assert {layer.lora_alpha[lora.ADAPTER] for layer in layers} == {8.0}


def test_three_steps_train_only_the_adapters_and_the_reference_is_the_base(tiny_dir, train_file, tmp_path):
    module, data, trainer = lora_run(tiny_dir, train_file, tmp_path)
    module.configure_model()
    assert module.ref_model is None and lora.is_adapted(module.actor)
    before = _snapshot(module)
    trainer.fit(module, datamodule=data)
    assert module.rl_steps_done == 3 and "kl" in recorded(trainer)[-1].stats
    after = _snapshot(module)
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    adapters = {n for n, p in module.named_parameters() if p.requires_grad}
    assert adapters and all(".lora_" in n for n in adapters)
    assert changed == {n for n in adapters if ".lora_B." in n or ".lora_A." in n}  # base weights bit-identical
    assert {id(p) for p in trainer.optimizers[0].param_groups[0]["params"]} == {
        id(p) for p in module.actor.parameters() if p.requires_grad}
    # The reference (the actor, adapters off) scores exactly as the base loaded on its own; the actor does not.
    ids = torch.randint(3, 250, (2, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    base = models.load_reference(tiny_dir)
    with torch.no_grad():
        ref = sequence_logprobs(module._reference, ids, mask, temperature=1.0)[0]
        chunked = sequence_logprobs(module._reference, ids, mask, temperature=1.0, chunk_tokens=5)[0]
        want = sequence_logprobs(base, ids, mask, temperature=1.0)[0]
        actor = sequence_logprobs(module.actor, ids, mask, temperature=1.0)[0]
    assert torch.equal(ref, want) and torch.allclose(chunked, want, atol=1e-6)
    assert not torch.allclose(actor, want)


def test_ppo_trains_the_critics_adapters_and_value_head_on_a_frozen_base(tiny_dir, train_file, tmp_path):
    module, data, trainer = lora_run(tiny_dir, train_file, tmp_path, max_steps=2, algorithm="ppo")
    module.configure_model()
    before = _snapshot(module)
    trainer.fit(module, datamodule=data)
    after = _snapshot(module)
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert {n for n in changed if n.startswith("critic.")} >= {"critic.value_head.weight", "critic.value_head.bias"}
    assert all(".lora_" in n or ".value_head." in n for n in changed)
    critic = [g for g in trainer.optimizers[0].param_groups if g["name"] == "critic"][0]
    assert sum(p.numel() for p in critic["params"]) < sum(p.numel() for p in module.critic.parameters()) / 2


def test_a_full_critic_trains_every_weight_of_the_value_model_beside_the_actors_adapters(tiny_dir, train_file,
                                                                                          tmp_path):
    module, data, trainer = lora_run(tiny_dir, train_file, tmp_path, max_steps=2, algorithm="ppo",
                                     lora_cfg=LoraConfig(rank=4, alpha=8.0, critic="full"))
    module.configure_model()
    assert not lora.is_adapted(module.critic.backbone) and lora.is_adapted(module.actor)
    before = _snapshot(module)
    trainer.fit(module, datamodule=data)
    after = _snapshot(module)
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    critic = {n for n, _ in module.named_parameters() if n.startswith("critic.")}
    assert {n for n in critic if n.endswith(".weight") and "norm" not in n} <= changed  # the value model in full
    assert all(".lora_" in n for n in changed - critic)  # the actor's base bit-identical


def test_gradient_checkpointing_recomputes_and_trains_the_adapters_as_without_it(tiny_dir, train_file, tmp_path):
    params, calls = {}, {}
    for checkpointing in (False, True):
        module, data, trainer = lora_run(tiny_dir, train_file, tmp_path / str(checkpointing), max_steps=2,
                                         checkpointing=checkpointing)
        module.configure_model()
        mlp = module.actor.get_base_model().model.layers[0].mlp
        count, forward = [], mlp.forward  # its forward, not a hook: torch's recomputation runs no module hooks

        def counted(*args, forward=forward, count=count, **kwargs):
            count.append(torch.is_grad_enabled())
            return forward(*args, **kwargs)

        mlp.forward = counted
        trainer.fit(module, datamodule=data)
        params[checkpointing], calls[checkpointing] = _snapshot(module), sum(count)  # forwards that build a graph
    assert calls[True] == 2 * calls[False] > 0  # the checkpointed layer ran again in each backward pass
    trained = [n for n in params[False] if ".lora_B." in n]
    assert trained and all(torch.allclose(params[True][n], params[False][n], atol=1e-6) for n in params[False])
    assert any(not torch.equal(params[True][n], torch.zeros_like(params[True][n])) for n in trained)


def test_an_engine_of_its_own_gets_the_merged_weights_and_greedy_output_matches(tiny_dir, train_file, tmp_path):
    from zerotir.rollout.engine import SamplingParams
    from zerotir.rollout.hf_engine import HFEngine

    engine = CopyingEngine()
    module, data, trainer = lora_run(tiny_dir, train_file, tmp_path, engine=engine)
    trainer.fit(module, datamodule=data)
    merged = lora.copy_merged(module.actor)
    want = dict(merged.named_parameters())
    assert set(engine.weights) == set(want)
    assert all(torch.allclose(engine.weights[n], p, atol=1e-6) for n, p in want.items())
    # the transformers engine: on the adapted actor in place, on a plain copy given the adapter push, on the merged model
    own = HFEngine(models.load_causal_lm(tiny_dir), module.tokenizer)
    own.load_weights_from(module.actor)
    outputs = []
    for target in (HFEngine(module.actor, module.tokenizer), own, HFEngine(merged, module.tokenizer)):
        target.eos_ids = set()  # a fixed length: the three decode the same number of tokens
        target.submit("a", [5, 6, 7, 8], SamplingParams(temperature=0.0, max_new_tokens=12, seed=0))
        done = []
        while not done:
            done = target.step()
        outputs.append(done[0][1].token_ids)
        target.close()
    assert outputs[0] == outputs[1] == outputs[2] and len(outputs[0]) == 12


def _greedy(model, tokenizer) -> list[int]:
    from zerotir.rollout.engine import SamplingParams
    from zerotir.rollout.hf_engine import HFEngine

    engine = HFEngine(model, tokenizer)
    engine.eos_ids = set()
    engine.submit("a", [5, 6, 7, 8], SamplingParams(temperature=0.0, max_new_tokens=12, seed=0))
    done = []
    while not done:
        done = engine.step()
    engine.close()
    return done[0][1].token_ids


def test_one_plus_one_steps_equal_two_and_the_export_loads_with_peft(tiny_dir, train_file, tmp_path):
    from peft import PeftModel

    straight, data, trainer = lora_run(tiny_dir, train_file, tmp_path / "s", max_steps=2)
    trainer.fit(straight, datamodule=data)
    first, data, trainer = lora_run(tiny_dir, train_file, tmp_path / "f", max_steps=1)
    trainer.fit(first, datamodule=data)
    last = tmp_path / "f" / "ckpt" / "last.ckpt"
    state = torch.load(last, weights_only=False)["state_dict"]
    assert any(".lora_A." in k for k in state) and not any(k.startswith("ref_model.") for k in state)
    resumed, data, trainer = lora_run(tiny_dir, train_file, tmp_path / "r", max_steps=2)
    trainer.fit(resumed, datamodule=data, ckpt_path=str(last))
    assert resumed.rl_steps_done == 2
    want = dict(straight.named_parameters())
    assert all(torch.equal(p, want[n]) for n, p in resumed.named_parameters())
    opt = [o.state_dict()["state"] for o in (straight.optimizers().optimizer, trainer.optimizers[0])]
    assert opt[0].keys() == opt[1].keys() and all(
        torch.equal(opt[0][k][s], opt[1][k][s]) for k in opt[0] for s in ("step", "exp_avg", "exp_avg_sq"))
    # export: the adapters as a peft folder and the merged HF folder, both greedy-decoding as the trainer's actor
    models.export_policy(tmp_path / "r" / "ckpt" / "last.ckpt", tmp_path / "adapters", merged_dir=str(tmp_path / "m"))
    adapted = PeftModel.from_pretrained(models.load_causal_lm(tiny_dir), str(tmp_path / "adapters"))
    tokens = _greedy(resumed.actor, resumed.tokenizer)
    assert _greedy(adapted, resumed.tokenizer) == tokens
    assert _greedy(models.load_causal_lm(tmp_path / "m"), models.load_tokenizer(tmp_path / "m")) == tokens


def test_a_merged_folder_of_a_full_fine_tuning_checkpoint_is_an_error(tiny_dir, tmp_path):
    ckpt = tmp_path / "full.ckpt"
    torch.save({"hyper_parameters": {"base": {"path": str(tiny_dir)}},
                "state_dict": {f"actor.{k}": v for k, v in models.load_causal_lm(tiny_dir).state_dict().items()}}, ckpt)
    with pytest.raises(ValueError, match="merged_dir=.*drop --merged_dir"):
        models.export_policy(ckpt, tmp_path / "x", merged_dir=str(tmp_path / "y"))


@pytest.mark.parametrize("critic,uses_critic,want", [("adapters", True, "float32"), ("full", False, "float32"),
                                                     ("full", True, "bfloat16")])
def test_a_bfloat16_base_trains_float32_adapters_and_value_head(tiny_dir, critic, uses_critic, want):
    cfg = LoraConfig(rank=4, critic=critic)
    assert lora.trained_dtype("bfloat16", cfg, uses_critic) == want
    assert lora.trained_dtype("bfloat16", None, False) == "bfloat16"
    actor = lora.add_adapters(models.load_causal_lm(tiny_dir, dtype="bfloat16"), cfg)
    assert {p.dtype for p in lora.trainable(actor)} == {torch.float32}
    critic_model = lora.add_critic_adapters(models.load_critic(tiny_dir, dtype="bfloat16"), LoraConfig(rank=4))
    assert {p.dtype for p in lora.trainable(critic_model)} == {torch.float32}

