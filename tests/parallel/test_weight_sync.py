"""Bucketed weight sync: name mapping and bucket plans (hand-worked), plain modules into HFEngine, and a DeepSpeed
ZeRO-3 engine on CPU (gloo, world size 1) synced bucket by bucket into vLLM, which must then decode exactly like the
trained model."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn
from transformers import LlamaForCausalLM

from zerotir.rollout.engine import SamplingParams, generate
from zerotir.toy.tokenizer import build_byte_tokenizer
from zerotir.parallel.weight_sync import hf_name, iter_bucketed_params, layer_key, plan_buckets, sync_weights
from tests.gloo import one_deepspeed_rank
from tests.tiny_models import vllm_sized_model

MAX_LEN = 128


def tiny(seed=0, save_dir=None):
    tok = build_byte_tokenizer()
    return tok, vllm_sized_model(tok, MAX_LEN, save_dir=save_dir, seed=seed)


# Sizes of the tiny model (float32, vocab 259, hidden 64, MLP 256, 2 layers), worked by hand:
#   embed_tokens / lm_head: 259 * 64 * 4 = 66_304 bytes each; model.norm: 256 bytes;
#   one decoder layer: q, k, v, o 4 * 64*64*4 = 65_536 + gate, up, down 3 * 64*256*4 = 196_608 + 2 norms 512
#   = 262_656 bytes, 9 tensors.
EMBED, NORM, LAYER = 66_304, 256, 262_656


class Wrapped(nn.Module):
    """A LightningModule-like holder: actor + critic with a value head, seen through a DeepSpeed-like wrapper."""

    def __init__(self, actor: nn.Module):
        super().__init__()
        self.actor = actor
        self.critic = nn.ModuleDict({"value_head": nn.Linear(64, 1)})


def test_hf_name_strips_wrappers_and_selects_prefix():
    assert hf_name("model.layers.0.mlp.up_proj.weight") == "model.layers.0.mlp.up_proj.weight"
    assert hf_name("_forward_module.actor.model.norm.weight", "actor.") == "model.norm.weight"
    assert hf_name("module.module.actor.lm_head.weight", "actor.") == "lm_head.weight"
    assert hf_name("_orig_mod.model.layers.1._fsdp_wrapped_module.self_attn.q_proj.weight") == (
        "model.layers.1.self_attn.q_proj.weight")
    assert hf_name("module.critic.value_head.weight", "actor.") is None
    assert hf_name("pretrained_model.model.norm.weight", "pretrained_model.") == "model.norm.weight"
    with pytest.raises(ValueError, match="must end with '.'"):
        hf_name("actor.x", "actor")


def test_layer_key_groups_decoder_layers():
    assert layer_key("model.layers.12.self_attn.q_proj.weight") == "model.layers.12"
    assert layer_key("model.layers.3.mlp.experts.7.w1.weight") == "model.layers.3"
    assert layer_key("model.embed_tokens.weight") == "model.embed_tokens"
    assert layer_key("lm_head.weight") == "lm_head"


def test_plan_buckets_whole_layers_hand_worked():
    _, model = tiny()
    # 1 byte: every layer alone -> embed | layer 0 | layer 1 | norm | lm_head
    assert [len(b) for b in plan_buckets(model, 1)] == [1, 9, 9, 1, 1]
    # EMBED + LAYER = 328_960 fits in 330_000; layer 1 starts a new bucket and takes norm + lm_head
    # (262_656 + 256 + 66_304 = 329_216).
    plan = plan_buckets(model, 330_000)
    assert [len(b) for b in plan] == [10, 11]
    assert plan[0][0][0] == "model.embed_tokens.weight" and plan[1][-1][0] == "lm_head.weight"
    assert [len(b) for b in plan_buckets(model, 10**9)] == [21]
    with pytest.raises(ValueError, match="bucket_bytes"):
        plan_buckets(model, 0)


def test_prefix_selects_the_actor_only_and_bad_prefix_fails():
    _, actor = tiny()
    names = [n for b in plan_buckets(Wrapped(actor), 10**9, prefix="actor.") for n, _ in b]
    assert names == [n for n, _ in actor.named_parameters()]
    with pytest.raises(ValueError, match="prefix='policy.' selects no parameter"):
        plan_buckets(Wrapped(actor), prefix="policy.")


def test_plain_module_buckets_share_storage():
    _, model = tiny()
    params = dict(model.named_parameters())
    for bucket in iter_bucketed_params(model, 1):
        for name, tensor in bucket:
            assert tensor.data_ptr() == params[name].data_ptr() and not tensor.requires_grad


def test_sync_weights_into_hf_engine_bucket_by_bucket():
    from zerotir.rollout.hf_engine import HFEngine

    tok, source = tiny(seed=0)
    _, target = tiny(seed=1)
    engine = HFEngine(target, tok)
    calls = []
    update = engine.update_weights
    engine.update_weights = lambda bucket: (calls.append([n for n, _ in bucket]), update(bucket))
    stats = sync_weights(Wrapped(source), engine, bucket_bytes=330_000, prefix="actor.")
    assert (stats["buckets"], stats["tensors"], stats["bytes"]) == (2, 21, 2 * EMBED + NORM + 2 * LAYER)
    assert [len(c) for c in calls] == [10, 11] and stats["seconds"] > 0
    for (name, a), b in zip(source.state_dict().items(), target.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


# ---------------------------------------------------------------- DeepSpeed ZeRO-3 on CPU

@pytest.fixture(scope="module")
def zero3(tmp_path_factory):
    """A tiny Llama (saved as the vLLM start folder) trained one AdamW step under ZeRO-3 on CPU (gloo, 1 rank)."""
    deepspeed = pytest.importorskip("deepspeed")
    folder = tmp_path_factory.mktemp("zero3_start")
    tok, model = tiny(save_dir=folder)
    config = {"train_micro_batch_size_per_gpu": 1,
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with one_deepspeed_rank(model, optimizer, config) as engine:
        ids = torch.tensor([tok("12345678 12345678")["input_ids"]])
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        yield SimpleNamespace(deepspeed=deepspeed, engine=engine, folder=folder, tok=tok)


def _full_state(zero3) -> dict[str, torch.Tensor]:
    """Every parameter gathered and copied (fine for a tiny model; the sync itself never does this)."""
    params = dict(zero3.engine.module.named_parameters())
    with zero3.deepspeed.zero.GatheredParameters(list(params.values())):
        return {name: p.detach().clone() for name, p in params.items()}


def _partitioned(zero3) -> bool:
    return all(p.ds_numel > 0 and p.numel() == 0 for p in zero3.engine.module.parameters())


def test_zero3_params_stay_partitioned_and_buckets_gather_one_at_a_time(zero3):
    assert _partitioned(zero3)
    full = _full_state(zero3)
    assert _partitioned(zero3)
    params = dict(zero3.engine.module.named_parameters())
    seen, sizes = [], []
    for bucket in iter_bucketed_params(zero3.engine, bucket_bytes=1):  # names come out without "module."
        names = {n for n, _ in bucket}
        for name, tensor in bucket:
            assert torch.equal(tensor, full[name]), name
        # Only this bucket is materialized; every other parameter is still a shard.
        assert all(p.numel() == 0 for n, p in params.items() if n not in names)
        seen += names
        sizes.append(len(bucket))
    assert sorted(seen) == sorted(full) and _partitioned(zero3)
    # Planned by the full (gathered) sizes, as the plain module is: one bucket per layer at 1 byte, and at 300_000
    # bytes EMBED | LAYER | LAYER + NORM | EMBED (the lm_head), the count the vLLM sync below asserts too.
    assert sizes == [1, 9, 9, 1, 1]
    planned = plan_buckets(zero3.engine, 300_000)
    assert [len(b) for b in planned] == [1, 9, 10, 1] and _partitioned(zero3)
    assert [len(b) for b in iter_bucketed_params(zero3.engine, bucket_bytes=300_000)] == [1, 9, 10, 1]


def test_parameters_the_prefetch_left_in_flight_are_released_before_a_push(zero3):
    """Inside ``DeepSpeedEngine.forward`` (a fleet's first push, its recovery push) ZeRO-3's prefetch
    leaves parameters in flight, which a push's ``GatheredParameters`` cannot partition again ("Cannot partition a
    param in flight"); ``release_for_push`` waits for them first. The state is the prefetch's: an async gather
    registered with the engine's coordinator."""
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    from zerotir.parallel.deepspeed_setup import release_for_push

    full = _full_state(zero3)
    engine = zero3.engine
    name, w = next(iter(engine.module.named_parameters()))
    registry = engine.module.ds_inflight_param_registry
    registry[w] = w.all_gather_coalesced([w])  # what the coordinator's prefetch does
    assert w.ds_status == ZeroParamStatus.INFLIGHT
    strategy = type("DeepSpeedStrategy", (), {"zero_stage_3": True})()
    release_for_push(SimpleNamespace(strategy=strategy, model=engine))
    assert w.ds_status == ZeroParamStatus.NOT_AVAILABLE and w not in registry
    pushed = {n: t.clone() for bucket in iter_bucketed_params(engine, bucket_bytes=1) for n, t in bucket}
    assert pushed.keys() == full.keys() and all(torch.equal(pushed[n], full[n]) for n in full), name
    assert _partitioned(zero3)


@torch.no_grad()
def reference_greedy(model, prompt, steps):
    ids = torch.tensor([prompt])
    for _ in range(steps):
        ids = torch.cat([ids, model(ids).logits[0, -1].argmax().view(1, 1)], dim=1)
    return ids[0, len(prompt):].tolist()


@pytest.mark.vllm
def test_zero3_sync_into_vllm_matches_trained_model(needs_vllm, zero3):  # skips before the DeepSpeed setup
    from zerotir.rollout.vllm_engine import VLLMEngine
    trained = LlamaForCausalLM.from_pretrained(zero3.folder, dtype=torch.float32).eval()
    start = {k: v.clone() for k, v in trained.state_dict().items()}
    trained.load_state_dict(_full_state(zero3))
    initial = LlamaForCausalLM.from_pretrained(zero3.folder, dtype=torch.float32).eval()
    prompts = [zero3.tok(t)["input_ids"] for t in ("1234", "hello")]
    params = SamplingParams(temperature=0, max_new_tokens=20)

    engine = VLLMEngine(zero3.folder, dtype="float32", max_model_len=MAX_LEN, cpu_kv_cache_gib=0.25)
    try:
        _sync_and_compare(engine, zero3, trained, initial, start, prompts, params)
    finally:
        engine.close()


def _sync_and_compare(engine, zero3, trained, initial, start, prompts, params) -> None:
    """The engine decodes as the initial model, then (after the ZeRO-3 sync) exactly as the trained one."""
    before = [row[0].token_ids for row in generate(engine, prompts, params)]
    assert before == [reference_greedy(initial, p, 20) for p in prompts]

    calls = []
    update = engine.update_weights
    engine.update_weights = lambda bucket: (calls.append(len(bucket)), update(bucket))
    stats = sync_weights(zero3.engine, engine, bucket_bytes=300_000)
    # embed (66_304) | layer 0 (262_656) | layer 1 + norm (262_912) | lm_head: each next layer would pass 300_000
    assert calls == [1, 9, 10, 1] and stats["buckets"] == 4 and _partitioned(zero3)
    after = [row[0].token_ids for row in generate(engine, prompts, params)]
    expected = [reference_greedy(trained, p, 20) for p in prompts]
    assert after == expected
    assert after != before  # the step changed the model, and the engine followed
    assert any(not torch.equal(start[k], v) for k, v in trained.state_dict().items())
    print(f"\nZeRO-3 -> vLLM sync: {stats}")
