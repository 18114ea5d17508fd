"""The tool loop with ``format: hermes`` (JSON calls by tool name): one trajectory calls python, calculator and search
in turn, each observation comes back in a <tool_response> block the model did not sample; malformed, unknown and
off-schema calls come back as errors the model reads, and are counted. On a scripted engine over the byte tokenizer,
and on the transformers engine with a tiny model that memorised a three-call transcript (trained in the test, about
a second). The tools are the real ones (the python tool over a scripted sandbox client, as the other loop tests)."""

from __future__ import annotations

import json

import pytest

from tests.rollout.memorised import memorise
from tests.rollout.scripted import ScriptedEngine, ScriptedSandbox, ok
from zerotir.config import ToolConfig
from zerotir.rollout.agent_loop import Schedule, rollout_sync
from zerotir.rollout.engine import SamplingParams
from zerotir.rollout.hf_engine import HFEngine
from zerotir.tools import Toolbox
from zerotir.tools.calculator import CalculatorTool
from zerotir.toy.tokenizer import build_byte_tokenizer

TOK = build_byte_tokenizer()
PROMPT = "Q: how fast is light, times 2?\n"
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=4096)


def tool_call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def response(text: str) -> str:
    return f"\n<tool_response>\n{text}\n</tool_response>\n"


@pytest.fixture
def hermes(tmp_path):
    corpus = tmp_path / "facts.jsonl"
    corpus.write_text(json.dumps({"text": "The speed of light is 299792458 metres per second."}) + "\n"
                      + json.dumps({"text": "Cats purr."}) + "\n")
    return ToolConfig(format="hermes", max_tool_calls=5, max_output_chars=512, tools=[
        {"class_path": "python"}, {"class_path": "calculator"},
        {"class_path": "search", "init_args": {"corpus": str(corpus), "k": 1, "cache_dir": str(tmp_path / "idx")}}])


def run(turns: list[str], tool: ToolConfig, sandbox: ScriptedSandbox, schedule: Schedule = Schedule()):
    engine = ScriptedEngine(TOK, {PROMPT: [turns]})
    traj, _ = rollout_sync(engine, TOK, sandbox, [TOK.encode(PROMPT, add_special_tokens=False)], GREEDY, tool,
                           schedule=schedule)
    return traj, engine


@pytest.mark.parametrize("schedule", [Schedule(), Schedule("lockstep")], ids=["trajectory", "lockstep"])
def test_one_trajectory_calls_python_calculator_and_search_in_turn(hermes, schedule):
    turns = ["Let me look it up. " + tool_call("search", query="speed of light"),
             tool_call("calculator", expression="299792458 * 2"),
             tool_call("python", code="print(len(str(599584916)))"),
             "It is \\boxed{599584916} m/s, 9 digits."]
    sandbox = ScriptedSandbox({"print(len(str(599584916)))": ok("9\n")})
    traj, engine = run(turns, hermes, sandbox, schedule)
    observations = ["[1] The speed of light is 299792458 metres per second.", "599584916", "9"]
    want = "".join(t + response(o) for t, o in zip(turns, observations)) + turns[-1]
    assert traj.response_texts == [want]
    assert [(c.tool, c.status, c.output) for c in traj.tool_calls[0]] == [
        ("search", "ok", observations[0]), ("calculator", "ok", "599584916"), ("python", "ok", "9")]
    assert traj.tool_calls[0][0].code == json.dumps({"name": "search", "arguments": {"query": "speed of light"}})
    assert sandbox.codes == ["print(len(str(599584916)))"]
    assert traj.num_calls.tolist() == [3] and traj.num_exec_errors.tolist() == [0]
    # The format's own stops: the opening marker, then the closing one.
    assert [c.params.stop for c in engine.calls[:2]] == [["<tool_call>"], ["</tool_call>"]]
    # Environment tokens (the three responses) are masked; what the model wrote is not.
    p, n = int(traj.prompt_lens[0]), int(traj.response_lens[0])
    action = traj.action_mask[0, p : p + n].tolist()
    env = TOK.decode([t for t, a in zip(traj.input_ids[0, p : p + n].tolist(), action) if not a])
    assert env == "".join(response(o) for o in observations)
    assert not traj.logprobs[0, p : p + n][[not a for a in action]].any()


def test_malformed_unknown_and_off_schema_calls_are_errors_the_model_reads(hermes):
    turns = ['<tool_call>{"name": "calculator", "arguments": {</tool_call>',
             tool_call("shell", cmd="ls"),
             tool_call("calculator", expr="1+1"),
             tool_call("calculator", expression="1/0"),
             "I give up."]
    traj, _ = run(turns, hermes, ScriptedSandbox())
    calls = traj.tool_calls[0]
    assert [c.status for c in calls] == ["invalid", "invalid", "invalid", "error"]
    assert [c.tool for c in calls] == ["", "shell", "calculator", "calculator"]
    assert calls[0].output.startswith("Error: the tool call is not valid JSON")
    assert calls[1].output == "Error: there is no tool named 'shell'; the tools are: python, calculator, search"
    assert "'expression' is a required property" in calls[2].output
    assert calls[3].output == "Error: ZeroDivisionError: division by zero"
    for call in calls:  # what the model read is in its context, in the format's block
        assert response(call.output) in traj.response_texts[0]
    assert traj.num_calls.tolist() == [4] and traj.num_exec_errors.tolist() == [4]
    assert traj.num_sandbox_errors.tolist() == [0] and traj.finish_reasons == ["stop"]


HF_PROMPT = "Q: light x2?\n"
HF_TURNS = [tool_call("search", query="light"), tool_call("calculator", expression="3*2"),
            tool_call("python", code="print(6)"), "A: \\boxed{6}"]
HF_OBSERVATIONS = ["[1] light=3", "6", "6"]


@pytest.fixture(scope="module")
def memorised():
    """A tiny Llama that has memorised the three-call transcript, observations included."""
    text = HF_PROMPT + "".join(t + response(o) for t, o in zip(HF_TURNS, HF_OBSERVATIONS)) + HF_TURNS[-1]
    return memorise(TOK, [text]), text[len(HF_PROMPT):]


@pytest.mark.usefixtures("one_thread")
def test_a_real_tiny_model_calls_search_calculator_and_python_on_the_transformers_engine(memorised, tmp_path):
    model, transcript = memorised
    corpus = tmp_path / "facts.jsonl"
    corpus.write_text(json.dumps({"text": "light=3"}) + "\n" + json.dumps({"text": "sound=1"}) + "\n")
    tool = ToolConfig(format="hermes", max_tool_calls=4, tools=[
        {"class_path": "search", "init_args": {"corpus": str(corpus), "k": 1, "cache_dir": str(tmp_path / "idx")}},
        {"class_path": "calculator"}, {"class_path": "python"}])
    sandbox = ScriptedSandbox({"print(6)": ok("6\n")})
    traj, _ = rollout_sync(HFEngine(model, TOK), TOK, sandbox, [TOK.encode(HF_PROMPT)],
                           SamplingParams(temperature=0.0, max_new_tokens=400), tool, ["6"])
    assert traj.response_texts == [transcript]  # the real observations are what it memorised, so it answers
    assert [(c.tool, c.status, c.output) for c in traj.tool_calls[0]] == [
        ("search", "ok", "[1] light=3"), ("calculator", "ok", "6"), ("python", "ok", "6")]
    p, n = int(traj.prompt_lens[0]), int(traj.response_lens[0])
    action = traj.action_mask[0, p : p + n].tolist()
    env = TOK.decode([t for t, a in zip(traj.input_ids[0, p : p + n].tolist(), action) if not a])
    assert env == "".join(response(o) for o in HF_OBSERVATIONS) and traj.finish_reasons == ["stop"]


def test_a_toolbox_built_by_the_caller_is_used_as_given():
    """A caller that keeps its tools between rollouts (a source, an engine host) passes them started (``tools=``):
    they are used instead of building ``model.tool.tools`` (here python, which would start a sandbox), and the format
    still checks them."""
    box = Toolbox([CalculatorTool()], max_chars=512)
    box.start()
    engine = ScriptedEngine(TOK, {PROMPT: [[tool_call("calculator", expression="2*3"), "\\boxed{6}"]]})
    traj, _ = rollout_sync(engine, TOK, None, [TOK.encode(PROMPT, add_special_tokens=False)], GREEDY,
                           ToolConfig(format="hermes"), tools=box)
    assert [(c.tool, c.output) for c in traj.tool_calls[0]] == [("calculator", "6")]
    with pytest.raises(ValueError, match="fences calls the python tool only"):
        rollout_sync(engine, TOK, None, [TOK.encode(PROMPT, add_special_tokens=False)], GREEDY, ToolConfig(),
                     tools=box)
