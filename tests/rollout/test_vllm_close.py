"""``VLLMEngine.close``: the in-process engine's teardown runs when asked, keeps the caller's process group, and a
later engine of the same process runs after it (its own module: the other vLLM modules keep one engine alive)."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.distributed as dist

from tests.tiny_models import vllm_sized_model
from zerotir.rollout.engine import SamplingParams, generate
from zerotir.toy.tokenizer import build_byte_tokenizer

pytestmark = pytest.mark.vllm
MAX_LEN = 128


@pytest.fixture
def callers_group(tmp_path):
    """A one-rank gloo group made before any engine, as a multi-rank trainer's is (or the one-rank group an earlier
    DeepSpeed test of this process left: DeepSpeed keeps it for the process)."""
    if dist.is_initialized():
        assert dist.get_world_size() == 1, "a multi-rank process group is left from an earlier test"
        yield
        return
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_close_keeps_the_callers_group_and_a_new_engine_runs_after_it(tmp_path, callers_group, needs_vllm):
    from zerotir.rollout.vllm_engine import VLLMEngine

    tok = build_byte_tokenizer()
    torch.manual_seed(0)
    vllm_sized_model(tok, MAX_LEN, save_dir=tmp_path / "model")
    prompt, params = [tok("hello")["input_ids"]], SamplingParams(temperature=0.0, max_new_tokens=12)

    first = VLLMEngine(tmp_path / "model", dtype="float32", max_model_len=MAX_LEN, cpu_kv_cache_gib=0.125)
    expected = generate(first, prompt, params)[0][0].token_ids
    first.close()
    first.close()  # idempotent
    assert dist.is_initialized()  # vLLM's teardown destroys the default group; the caller's is kept
    with pytest.raises(RuntimeError, match="closed"):
        first.submit("k", prompt[0], params)

    second = VLLMEngine(tmp_path / "model", dtype="float32", max_model_len=MAX_LEN, cpu_kv_cache_gib=0.125)
    try:
        del first
        gc.collect()  # the closed engine's objects go now; they no longer tear anything down under the new one
        assert generate(second, prompt, params)[0][0].token_ids == expected
    finally:
        second.close()
