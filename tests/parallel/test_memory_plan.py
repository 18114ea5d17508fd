"""The memory plan: parameter counts against real transformers models, and a whole plan against hand-worked bytes."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from zerotir.parallel import architecture as arch_mod
from zerotir.parallel.architecture import KNOWN, Architecture, from_hf_config, resolve
from zerotir.parallel.memory_plan import PlanSettings, plan_rows, render_markdown, totals

# ----- parameter counts -----

# Hand-worked model: 2 layers, h = 8, i = 16, 2 heads of 4 dims (q = 8), 1 KV head (kv = 4), V = 32, untied,
# Qwen2 biases.
#   attention: h*q + 2*h*kv + q*h = 64 + 64 + 64 = 192, q/k/v biases 8 + 4 + 4 = 16           -> 208
#   MLP: 3 * 8 * 16 = 384;  norms: 2 * 8 = 16                                                   -> layer = 608
#   model: 2 * 608 + embedding 32 * 8 = 256 + final norm 8 + LM head 256                       -> 1736
#   critic: 2 * 608 + 256 + 8 + value head 8 + 1                                                -> 1489
#   KV cache per token: 2 (k, v) * 2 layers * 1 head * 4 dims * 2 bytes                         -> 32 bytes
HAND = Architecture("hand", num_layers=2, hidden_size=8, intermediate_size=16, num_heads=2, num_kv_heads=1,
                    vocab_size=32, tie_word_embeddings=False, qkv_bias=True)


def test_hand_worked_parameter_counts() -> None:
    assert HAND.layer_params == 608
    assert HAND.num_params == 1736
    assert HAND.critic_params == 1489
    assert HAND.kv_cache_bytes_per_token() == 32
    assert HAND.kv_cache_bytes_per_token(tensor_parallel=2) == 32  # one KV head: replicated on both GPUs


def test_known_qwen_counts() -> None:
    # 7B: layer = (3584*3584 + 3584) + 2*(3584*512 + 512) + 3584*3584 + 3*3584*18944 + 2*3584 = 233,057,792;
    #     28 layers + 2 * 152064*3584 (untied) + 3584 = 7,615,616,512.
    assert KNOWN["qwen2.5-7b"].num_params == 7_615_616_512
    # 32B: layer = (5120^2 + 5120) + 2*(5120*1024 + 1024) + 5120^2 + 3*5120*27648 + 2*5120 = 487,605,248;
    #      64 layers + 2 * 152064*5120 + 5120 = 32,763,876,352.
    assert KNOWN["qwen2.5-32b"].num_params == 32_763_876_352
    # 0.5B: layer = (896^2 + 896) + 2*(896*128 + 128) + 896^2 + 3*896*4864 + 2*896 = 14,912,384;
    #       24 layers + 151936*896 (tied, once) + 896 = 494,032,768.
    assert KNOWN["qwen2.5-0.5b"].num_params == 494_032_768
    assert arch_mod.known_name("Qwen/Qwen2.5-7B") == "qwen2.5-7b" and arch_mod.known_name("gpt2") is None


TINY_CONFIGS = [
    {"model_type": "qwen2", "tie_word_embeddings": False},
    {"model_type": "qwen2", "tie_word_embeddings": True},
    {"model_type": "llama", "attention_bias": True, "mlp_bias": True},
    {"model_type": "mistral", "head_dim": 12},
    {"model_type": "qwen3", "head_dim": 6, "attention_bias": True},
]


@pytest.mark.parametrize("extra", TINY_CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_counts_equal_real_transformers_models(extra: dict) -> None:
    values = {"hidden_size": 16, "intermediate_size": 40, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 50, **extra}
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    arch = from_hf_config(config)
    assert arch.num_params == sum(p.numel() for p in model.parameters())
    from zerotir.models import ValueModel

    critic = ValueModel(model.base_model, config.hidden_size)
    assert arch.critic_params == sum(p.numel() for p in critic.parameters())


def test_resolve_reads_a_model_folder_and_a_config_file(tmp_path: Path) -> None:
    config = AutoConfig.for_model("qwen2", hidden_size=8, intermediate_size=16, num_hidden_layers=2,
                                  num_attention_heads=2, num_key_value_heads=1, vocab_size=32)
    config.save_pretrained(tmp_path)
    from_folder = resolve(str(tmp_path))
    assert from_folder.num_params == HAND.num_params  # the same shape as the hand-worked model
    assert resolve(str(tmp_path / "config.json")).num_params == HAND.num_params
    (tmp_path / "bad.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 8}))
    with pytest.raises(ValueError, match="model_type='gpt2'"):
        resolve(str(tmp_path / "bad.json"))
    with pytest.raises(ValueError, match="not a known architecture"):
        resolve("no-such-model")


# ----- the plan -----

# gpu_mem_gib = 2^-14 GiB = 65536 bytes, so the vLLM budget at 0.5 is 32768 bytes; small fixed overheads in bytes.
HAND_SETTINGS = PlanSettings(gpus=2, nodes=1, zero=3, critic=True, reference=True, micro_batch_size=1, seq_len=4,
                             gradient_checkpointing=True, vllm_tp=1, gpu_memory_utilization=0.5, gpu_mem_gib=2**-14,
                             overhead_gib=2**-20, vllm_overhead_gib=2**-20, vllm_sleep_gib=2**-21,
                             sync_bucket_mb=2**-10, samples_per_step=8, prompt_tokens=1)

# Rows by hand (P = 1736, Pc = 1489, N = 2 GPUs, ZeRO-3, no offload):
#   actor params 2P/N = 1736 | grads 2P/N = 1736, during the update + fp32 4P/N = 3472 -> 5208 | Adam 12P/N = 10416
#   critic params 1489 | grads 1489, update 1489 + 2978 = 4467 | Adam 12 * 1489 / 2 = 8934
#   ZeRO-3 gathered: 2 bytes * max(2 layers * 608, embedding 256) = 2432 (update)
#   reference 2P/N = 1736
#   actor activations, 4 tokens, checkpointed: layer inputs 2 layers * 2h = 32 bytes/token -> 128;
#       one layer recomputed 2 * (8h + 2kv + 4i) = 2 * (64 + 8 + 64) = 272 bytes/token -> 1088;
#       -> 1216; logits (their own row) 4 tokens * 32 * 18 bytes = 2304
#   critic activations: 128 + 1088 = 1216
#   vLLM weights 2P = 3472; work 1024; KV = 32768 - 3472 - 1024 = 28272; asleep 512 (update); context 1024
#   weight-sync bucket: 1024-byte buckets, but a layer (2 * 608 = 1216 bytes) is never split -> 1216
#   rollout total: 1736+1736+10416 + 1489+1489+8934 + 1736 + 3472+1024+28272 + 1216 + 1024 = 62544
#   update total:  1736+5208+10416 + 1489+4467+8934 + 2432 + 1736 + 1216+2304+1216 + 512 + 1024 = 42690
#   KV capacity: 28272 // 32 = 883 tokens = 220 sequences of 4 tokens; 8 samples over 2 engines = 4 each.
#   longest: per token the update adds 304 (actor layers) + 576 (logits) + 304 (critic) = 1184 bytes to the
#       42690 - 4 * 1184 = 37954 that do not grow: 37954 + 1184 L <= 65536 -> L = 23 (rollout and KV fit at any L).
HAND_TABLE = """\
**hand** (0.00B params, critic 0.00B), 1 node(s) x 2 GPUs of 6.10352e-05 GiB, ZeRO-3, vLLM TP 1 at gpu_memory_utilization 0.5

| component | rollout (B/GPU) | update (B/GPU) | CPU (B/node) | note |
|---|---:|---:|---:|---|
| actor: params (bf16) | 1736 | 1736 | 0 | ZeRO-3 |
| actor: grads (bf16 + fp32 partition) | 1736 | 5208 | 0 | fp32 grads on GPU during the step |
| actor: optimizer (fp32 master, Adam m, v) | 10416 | 10416 | 0 | partitioned |
| critic: params (bf16) | 1489 | 1489 | 0 | ZeRO-3 |
| critic: grads (bf16 + fp32 partition) | 1489 | 4467 | 0 | fp32 grads on GPU during the step |
| critic: optimizer (fp32 master, Adam m, v) | 8934 | 8934 | 0 | partitioned |
| ZeRO-3 gathered params | 0 | 2432 | 0 | 2 layers or the LM head |
| reference (bf16) | 1736 | 1736 | 0 | frozen, no optimizer state |
| activations: actor | 0 | 1216 | 0 | 1 x 4 tokens, checkpointed |
| logits: actor (log-probs, entropy) | 0 | 2304 | 0 | 4 tokens x 32 x 18 bytes |
| activations: critic | 0 | 1216 | 0 |  |
| vLLM: weights (bf16) | 3472 | 0 | 0 | TP 1; dropped while asleep, re-synced |
| vLLM: activations + CUDA graphs | 1024 | 0 | 0 | assumed |
| vLLM: KV cache | 28272 | 0 | 0 | rest of the vLLM budget |
| vLLM: asleep (level 2) | 0 | 512 | 0 | assumed |
| weight-sync bucket | 1216 | 0 | 0 | largest of bucket, layer, embedding / LM head |
| CUDA context, NCCL, slack | 1024 | 1024 | 0 | assumed |
| **total** | 62544 | 42690 | 0 |  |

- KV cache: 0 KiB per token per GPU -> 883 tokens per engine = 220 sequences of 4 tokens at once
- each of the 2 engines generates 4 samples per step
- rollout: 62544 of 65536 B per GPU -> fits
- update: 42690 of 65536 B per GPU -> fits
- longest sequence that fits: 23 tokens = a response of 22 after a 1-token prompt"""


def test_hand_worked_plan_table() -> None:
    assert render_markdown(HAND, HAND_SETTINGS, unit="B") == HAND_TABLE


def test_sync_bucket_peak_is_the_largest_layer_when_that_exceeds_the_bucket() -> None:
    from dataclasses import replace

    from zerotir.parallel.memory_plan import sync_bucket_bytes

    assert sync_bucket_bytes(HAND, HAND_SETTINGS) == 1216  # a 1216-byte layer in 1024-byte buckets
    assert sync_bucket_bytes(HAND, replace(HAND_SETTINGS, sync_bucket_mb=2**-9)) == 2048  # the bucket is larger
    # Qwen2.5 at 256 MiB buckets: the embedding / LM head, 152064 x hidden in bf16.
    s = PlanSettings(sync_bucket_mb=256)
    assert sync_bucket_bytes(resolve("qwen2.5-7b"), s) == 2 * 152064 * 3584  # 1.015 GiB
    assert sync_bucket_bytes(resolve("qwen2.5-32b"), s) == 2 * 152064 * 5120  # 1.45 GiB
    assert sync_bucket_bytes(resolve("qwen2.5-0.5b"), s) == 2 * 151936 * 896  # 259.7 MiB, just above the bucket
    assert sync_bucket_bytes(resolve("qwen2.5-0.5b"), PlanSettings(sync_bucket_mb=512)) == 512 * 2**20


def test_offload_moves_states_to_the_cpu() -> None:
    # ZeRO-2 over 2 nodes x 4 GPUs (N = 8), optimizer offload, no critic / reference, vLLM level-1 sleep:
    #   params replicated 2P = 3472 on the GPU; bf16 grads 2P/N = 434 in both phases (fp32 grads go to the CPU);
    #   CPU per node: (12P/N + 4P/N) * 4 GPUs = 16 * 1736 / 8 * 4 = 13888;
    #   vLLM level 1 keeps each of the node's 4 engines' weights (2P = 3472) on the CPU: 13888.
    s = PlanSettings(gpus=4, nodes=2, zero=2, offload_optimizer=True, vllm_sleep_level=1, seq_len=4)
    rows = {r.component: r for r in plan_rows(HAND, s)}
    assert (rows["actor: params (bf16)"].rollout, rows["actor: params (bf16)"].cpu_per_node) == (3472, 0)
    grads = rows["actor: grads (bf16 + fp32 partition)"]
    assert (grads.rollout, grads.update) == (434, 434)
    opt = rows["actor: optimizer (fp32 master, Adam m, v)"]
    assert (opt.rollout, opt.update, opt.cpu_per_node) == (0, 0, 13888)
    assert rows["vLLM: weights (bf16)"].cpu_per_node == 13888
    assert rows["ZeRO-3 gathered params"].update == 0
    assert rows["critic: params + grads + optimizer"].update == 0
    assert totals(list(rows.values())).cpu_per_node == 13888 * 2
    # ZeRO-3 parameter offload: no bf16 partition on the GPU, 2P/N per GPU on the CPU (4 GPUs: 1736).
    s3 = PlanSettings(gpus=4, nodes=2, zero=3, offload_optimizer=True, offload_params=True, seq_len=4)
    p3 = {r.component: r for r in plan_rows(HAND, s3)}["actor: params (bf16)"]
    assert (p3.rollout, p3.cpu_per_node) == (0, 1736)


def test_too_small_vllm_budget_is_flagged() -> None:
    s = PlanSettings(gpus=8, zero=3, gpu_memory_utilization=0.1, gpu_mem_gib=80)  # 8 GiB < 14.2 GiB of 7B weights
    text = render_markdown(KNOWN["qwen2.5-7b"], s)
    assert "NEGATIVE: budget too small" in text and "DOES NOT FIT" in text


def test_token_budget_and_chunked_head_size_the_update() -> None:
    from dataclasses import replace

    rows = lambda **kw: {r.component: r.update for r in plan_rows(HAND, replace(HAND_SETTINGS, **kw))}
    base = rows()
    # A budget of 12 tokens: 304 bytes/token of layers (actor and critic alike), 32 x 18 of logits per token.
    budget = rows(max_tokens_per_micro_batch=12)
    assert budget["activations: actor"] == budget["activations: critic"] == 12 * 304
    assert budget["logits: actor (log-probs, entropy)"] == 12 * 32 * 18
    assert rows(max_tokens_per_micro_batch=2)["activations: actor"] == 4 * 304  # a longer sequence is alone
    # Chunks of 3 of the 4 tokens: only the logits row shrinks; a chunk wider than the micro-batch changes nothing.
    chunked = rows(logprob_chunk_tokens=3)
    assert chunked["logits: actor (log-probs, entropy)"] == 3 * 32 * 18
    assert chunked["activations: actor"] == base["activations: actor"]
    assert rows(logprob_chunk_tokens=100) == base
    both = rows(max_tokens_per_micro_batch=12, logprob_chunk_tokens=3)
    assert both["logits: actor (log-probs, entropy)"] == 3 * 32 * 18 and both["activations: actor"] == 12 * 304


def test_longest_seq_len_is_the_last_length_that_fits() -> None:
    from dataclasses import replace

    from zerotir.parallel.memory_plan import fits, longest_seq_len

    assert longest_seq_len(HAND, HAND_SETTINGS) == 23  # by hand above
    # Chunks of one token: 304 + 18 x 32 / L ... the logits stop growing, so 37954 + 608 L + 576 <= 65536 -> 44.
    assert longest_seq_len(HAND, replace(HAND_SETTINGS, logprob_chunk_tokens=1)) == 44
    seven = PlanSettings(critic=True)  # the shipped 7B PPO layout on 80 GiB GPUs
    for s in (seven, replace(seven, max_tokens_per_micro_batch=16384, logprob_chunk_tokens=1024),
              replace(seven, micro_batch_size=2)):
        longest = longest_seq_len(KNOWN["qwen2.5-7b"], s)
        assert fits(KNOWN["qwen2.5-7b"], replace(s, seq_len=longest))
        assert not fits(KNOWN["qwen2.5-7b"], replace(s, seq_len=longest + 1))
    assert longest_seq_len(KNOWN["qwen2.5-7b"], replace(seven, gpu_mem_gib=20)) == 0  # the states alone overflow


@pytest.mark.parametrize("kwargs,match", [
    ({"zero": 2, "offload_params": True}, "offload_params=True needs zero=3"),
    ({"gpus": 8, "vllm_tp": 3}, "vllm_tp=3 must divide gpus=8"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization=1.5"),
    ({"seq_len": 0}, "seq_len=0"),
    ({"max_tokens_per_micro_batch": 0}, "max_tokens_per_micro_batch=0"),
    ({"logprob_chunk_tokens": -1}, "logprob_chunk_tokens=-1"),
    ({"prompt_tokens": -1}, "prompt_tokens=-1"),
])
def test_bad_settings_name_the_field(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PlanSettings(**kwargs)


def test_sync_bucket_peak_bounds_the_real_buckets() -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from zerotir.parallel.memory_plan import sync_bucket_bytes
    from zerotir.parallel.weight_sync import param_nbytes, plan_buckets

    config = Qwen2Config(vocab_size=1024, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    arch = from_hf_config(config)
    for bucket_mb in (2**-6, 2**-4, 1.0):  # 16 KiB (below the 64 KiB embedding), 64 KiB, 1 MiB
        peak = max(sum(param_nbytes(p) for _, p in b) for b in plan_buckets(model, int(bucket_mb * 2**20)))
        planned = sync_bucket_bytes(arch, PlanSettings(sync_bucket_mb=bucket_mb))
        assert peak <= planned, (bucket_mb, peak, planned)
        if bucket_mb * 2**20 < 2 * arch.embedding_params:  # the embedding / LM head is a bucket of its own
            assert peak == planned == 2 * 1024 * 32


def test_the_plan_says_zero3_gathers_the_lm_head_once_per_pass():
    # 152064 x 3584 bf16 = 1.09 GB (1.0 GiB), gathered once per pass; 9216 / 1024 = 9 chunks
    seven = PlanSettings(gpus=8, zero=3, seq_len=9216, logprob_chunk_tokens=1024)
    text = render_markdown(KNOWN["qwen2.5-7b"], seven)
    assert ("- ZeRO-3 with the LM head in chunks: the head (1.0 GiB) is gathered once in the forward and once in "
            "backward, as without chunks, and held while all 9 chunks of 1024 tokens of a 9216-token sequence go "
            "through it (zerotir.rl.chunked_logprobs)") in text
    assert "LM head in chunks:" not in render_markdown(KNOWN["qwen2.5-7b"], replace(seven, zero=2))
    assert "LM head in chunks:" not in render_markdown(KNOWN["qwen2.5-7b"], replace(seven, logprob_chunk_tokens=None))


def test_lora_rows_count_the_adapters_peft_makes_and_the_frozen_base_once(tiny_dir):
    from zerotir import lora, models
    from zerotir.config import LoraConfig
    from zerotir.parallel.memory_plan import lora_params

    arch = resolve(str(tiny_dir))
    adapted = lora.add_adapters(models.load_causal_lm(tiny_dir), LoraConfig(rank=4))
    assert lora_params(arch, 4) == sum(p.numel() for p in lora.trainable(adapted))
    seven = KNOWN["qwen2.5-7b"]
    s = PlanSettings(gpus=1, zero=0, lora_rank=8, reference=True, seq_len=4)
    rows = {r.component: r for r in plan_rows(seven, s)}
    assert rows["actor: frozen base (bf16)"].update == 2 * seven.num_params
    assert rows["actor: adapters (fp32 + grads + Adam)"].update == 16 * lora_params(seven, 8)
    assert rows["reference (bf16)"].update == 0 and rows["critic: frozen base + adapters"].update == 0
    four = {r.component: r for r in plan_rows(seven, replace(s, gpus=4, zero=3, critic=True))}
    assert four["actor: frozen base (bf16)"].update == 2 * seven.num_params / 4
    assert four["critic: frozen base (bf16)"].update == 2 * seven.critic_params / 4
    with pytest.raises(ValueError, match="zero=0 .* LoRA runs only"):
        PlanSettings(zero=0)


def test_a_lora_engine_sleeps_at_level_one_with_its_base_in_cpu_memory_and_level_two_is_refused():
    # A LoRA push carries the adapter only, so vLLM must keep the base through sleep: level 1, one bf16 copy of the
    # weights (2P) per engine in CPU memory; full fine-tuning drops them (level 2, nothing on the CPU).
    seven = KNOWN["qwen2.5-7b"]
    s = PlanSettings(gpus=2, zero=0, lora_rank=64, seq_len=4)
    rows = {r.component: r for r in plan_rows(seven, s)}
    assert s.sleep_level == 1 and "vLLM: asleep (level 1)" in rows
    assert rows["vLLM: weights (bf16)"].cpu_per_node == 2 * 2 * seven.num_params  # 2 engines of TP 1
    assert rows["vLLM: weights (bf16)"].note == "TP 1; on CPU while asleep"
    full = {r.component: r for r in plan_rows(seven, PlanSettings(gpus=2, zero=3, seq_len=4))}
    assert "vLLM: asleep (level 2)" in full and full["vLLM: weights (bf16)"].cpu_per_node == 0
    with pytest.raises(ValueError, match="vllm_sleep_level=2 with lora_rank=64: .* Set vllm_sleep_level 1, or leave"):
        replace(s, vllm_sleep_level=2)
