"""The memory plan's command line (zerotir.parallel.memory_plan_cli): settings read from a run config (the token
budget and the chunked head included), flags overriding them, the plan printed."""

from __future__ import annotations

from pathlib import Path

import pytest

from zerotir.parallel import memory_plan_cli as cli
from zerotir.parallel.architecture import KNOWN
from zerotir.parallel.memory_plan import GIB, PlanSettings, render_markdown

RUN_CONFIG = """\
trainer:
  devices: 4
  num_nodes: 2
  strategy:
    class_path: lightning.pytorch.strategies.DeepSpeedStrategy
    init_args:
      config:
        zero_optimization: {stage: 3, offload_optimizer: {device: cpu}}
model:
  base: {path: Qwen/Qwen2.5-7B, gradient_checkpointing: true}
  rl: {algorithm: ppo, kl_coef: 0.0, max_tokens_per_micro_batch: 16384, logprob_chunk_tokens: 2048}
  sampling: {max_response_tokens: 8192, n: 16}
  rollout:
    class_path: zerotir.config.VLLMRollout
    init_args: {gpu_memory_utilization: 0.4, tensor_parallel_size: 2}
data:
  max_prompt_tokens: 1024
  prompts_per_step: 128
"""


def test_settings_from_run_config(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(RUN_CONFIG)
    model, values = cli.settings_from_run_config(path)
    assert model == "Qwen/Qwen2.5-7B"
    assert values == {"gpus": 4, "nodes": 2, "zero": 3, "offload_optimizer": True, "offload_params": False,
                      "critic": True, "reference": False, "micro_batch_size": 8, "max_tokens_per_micro_batch": 16384,
                      "logprob_chunk_tokens": 2048, "seq_len": 9216, "prompt_tokens": 1024,
                      "gradient_checkpointing": True, "lora_rank": None, "vllm_tp": 2, "gpu_memory_utilization": 0.4,
                      "samples_per_step": 2048, "sync_bucket_mb": 256.0}
    path.write_text("trainer: {devices: 8, strategy: ddp}\nmodel: {base: {path: Qwen/Qwen2.5-7B}}\n")
    with pytest.raises(ValueError, match="strategy='ddp' is not DeepSpeed"):
        cli.settings_from_run_config(path)


def test_command_line_with_run_config_and_overrides(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(RUN_CONFIG)
    text = cli.main(["--run_config", str(path), "--nodes", "4", "--plan.gpu_mem_gib", "141"])
    assert text == capsys.readouterr().out.strip()
    assert text.startswith("**Qwen2.5-7B** (7.62B params, critic 7.07B), 4 node(s) x 4 GPUs of 141 GiB, ZeRO-3, "
                           "optimizer offload, vLLM TP 2 at gpu_memory_utilization 0.4")
    assert "each of the 8 engines generates 256 samples per step" in text  # 2048 samples / (16 GPUs / TP 2)
    expected = render_markdown(KNOWN["qwen2.5-7b"], PlanSettings(
        gpus=4, nodes=4, zero=3, offload_optimizer=True, critic=True, max_tokens_per_micro_batch=16384,
        logprob_chunk_tokens=2048, seq_len=9216, prompt_tokens=1024, vllm_tp=2, gpu_memory_utilization=0.4,
        gpu_mem_gib=141, samples_per_step=2048))
    assert text == expected
    assert "| 16384 tokens (budget 16384), checkpointed |" in text
    assert "| 2048 tokens x 152064 x 18 bytes (LM head in chunks) |" in text
    assert cli.main(["--model", "qwen2.5-0.5b", "--gpus", "1", "--unit", "MiB"]).count("MiB/GPU") == 2
    assert GIB == 1 << 30




def test_a_lora_run_config_without_deepspeed_plans_its_rank_on_one_gpu() -> None:
    model, settings = cli.settings_from_run_config(Path(__file__).resolve().parents[2] / "configs"
                                                   / "qwen2.5-7b_reinforce_lora.yaml")
    assert model == "Qwen/Qwen2.5-7B"
    assert (settings["gpus"], settings["zero"], settings["lora_rank"]) == (1, 0, 64)
    assert "no DeepSpeed, LoRA rank 64" in render_markdown(KNOWN["qwen2.5-7b"], PlanSettings(**settings))
