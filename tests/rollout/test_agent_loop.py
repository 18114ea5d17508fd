"""The tool loop with a scripted engine over the byte tokenizer (one token per character): every count below is
worked by hand from the transcript strings."""

from __future__ import annotations

import asyncio

import pytest
import torch

from sandbox import ExecResult, ExecStatus, format_for_model
from tests.rollout.scripted import ScriptedEngine, ScriptedSandbox, fake_logprob, ok
from zerotir.config import ToolConfig
from zerotir.rollout.agent_loop import Schedule, rollout, rollout_sync
from zerotir.rollout.engine import SamplingParams
from zerotir.toy.tokenizer import build_byte_tokenizer
from zerotir.types import ToolCall

TOK = build_byte_tokenizer()
PROMPT = "Q: 2+3?\n"  # 8 tokens
STEP1 = "Let me compute.\n```python"  # 16 + 9 = 25 sampled tokens, ends on the first stop
STEP2 = "\nprint(2+3)\n```"  # 1 + 10 + 1 + 3 = 15 sampled tokens, ends on the closing fence
INJECTED = "\n```output\n5\n```\n"  # 17 injected tokens
ANSWER = "\nThe answer is \\boxed{5}."  # 25 sampled tokens, then EOS
CODE = "\nprint(2+3)\n"
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=4096)
LOCKSTEP = Schedule("lockstep")  # one call per phase: the call structure below is exact


def run(scripts, sandbox, prompts, params=GREEDY, tool=None, truths=None, schedule=Schedule(), engine=None):
    engine = engine or ScriptedEngine(TOK, scripts, n=params.n)
    ids = [TOK.encode(p, add_special_tokens=False) for p in prompts]
    tool = tool or ToolConfig(max_tool_calls=20, max_output_chars=1024)  # the paper's call budget, roomy outputs
    traj, timings = rollout_sync(engine, TOK, sandbox, ids, params, tool, truths, schedule)
    return traj, timings, engine


def test_code_block_output_injected_then_answer():
    sandbox = ScriptedSandbox({CODE: ok("5\n")})
    traj, timings, engine = run({PROMPT: [[STEP1 + STEP2, ANSWER]]}, sandbox, [PROMPT], schedule=LOCKSTEP, truths=["5"])
    assert traj.response_texts == [STEP1 + STEP2 + INJECTED + ANSWER]
    assert sandbox.codes == [CODE] and sandbox.timeouts == [5.0]
    assert traj.num_calls.tolist() == [1] and traj.num_exec_errors.tolist() == [0]
    assert traj.finish_reasons == ["stop"] and traj.truncated.tolist() == [False]
    assert traj.ground_truths == ["5"] and traj.rewards.tolist() == [0.0]
    # Three phases: text (stop on the opening), code (stop on the closing fence), text again.
    assert [c.params.stop for c in engine.calls] == [["```python"], ["```"], ["```python"]]
    assert engine.calls[1].text == PROMPT + STEP1
    assert engine.calls[2].text == PROMPT + STEP1 + STEP2 + INJECTED
    assert set(timings) == {"generation", "sandbox"} and min(timings.values()) >= 0
    assert set(engine.released) == {0} and engine.num_running == 0


def test_action_mask_covers_exactly_the_sampled_tokens():
    traj, _, engine = run({PROMPT: [[STEP1 + STEP2, ANSWER]]}, ScriptedSandbox({CODE: ok("5\n")}), [PROMPT],
                          schedule=LOCKSTEP)
    # prompt 8 | sampled 25 + 15 | injected 17 | sampled 25 + EOS
    assert traj.prompt_lens.tolist() == [8] and traj.response_lens.tolist() == [83]
    expected = [0] * 8 + [1] * 40 + [0] * 17 + [1] * 26
    assert traj.action_mask[0].long().tolist() == expected
    assert traj.attention_mask[0].tolist() == [1] * 91
    # Token-in / token-out: the response ids are the engine's sampled ids and the encoded output block, in order.
    sampled = [sample.token_ids for _, sample in engine.returned]
    assert traj.input_ids[0, 8:48].tolist() == sampled[0] + sampled[1]
    assert traj.input_ids[0, 48:65].tolist() == TOK.encode(INJECTED, add_special_tokens=False)
    assert traj.input_ids[0, 65:].tolist() == sampled[2] and sampled[2][-1] == TOK.eos_token_id
    # Log-probs sit on their own tokens (the scripted value restarts at index 0 in each request), 0 elsewhere.
    want = torch.zeros(91)
    for start, ids in ((8, sampled[0]), (33, sampled[1]), (65, sampled[2])):
        want[start : start + len(ids)] = torch.tensor([fake_logprob(t, i) for i, t in enumerate(ids)])
    assert torch.allclose(traj.logprobs[0], want)


def test_rows_are_right_padded_and_grouped():
    scripts = {"A?": [["\\boxed{1}"]], "Bb?": [["x```python\nprint(1)\n```", "\\boxed{1}"]]}
    traj, _, _ = run(scripts, ScriptedSandbox(default=ok("1")), ["A?", "Bb?"], SamplingParams(n=2, max_new_tokens=99),
                     truths=["1", "2"])
    assert traj.group_ids.tolist() == [0, 0, 1, 1] and traj.ground_truths == ["1", "1", "2", "2"]
    # "A?" 2 + "\boxed{1}" 9 + EOS = 12; "Bb?" 3 + "x```python\nprint(1)\n```" 1 + 9 + 1 + 8 + 1 + 3 = 23 sampled
    # + "\n```output\n1\n```\n" 17 injected + "\boxed{1}" 9 + EOS = 53
    assert (traj.prompt_lens + traj.response_lens).tolist() == [12, 12, 53, 53]
    assert traj.input_ids.shape == (4, 53)
    assert traj.attention_mask[0].tolist() == [1] * 12 + [0] * 41
    assert traj.input_ids[0, 12:].tolist() == [TOK.pad_token_id] * 41
    assert not traj.action_mask[0, 12:].any() and not traj.action_mask[:, :2].any()


def test_tool_call_cap_holds_and_drops_the_code_stops():
    turns = ["A```python\nprint(1)\n```", "B```python\nprint(2)\n```", "C```python\nprint(3)\n```D"]
    sandbox = ScriptedSandbox(default=ok("x"))
    traj, _, engine = run({"P": [turns]}, sandbox, ["P"], tool=ToolConfig(max_tool_calls=2), schedule=LOCKSTEP)
    assert traj.num_calls.tolist() == [2] and sandbox.codes == ["\nprint(1)\n", "\nprint(2)\n"]
    # After the second call the model writes on with no code stop at all: the third block is plain text.
    assert engine.calls[-1].params.stop == []
    out = "\n```output\nx\n```\n"
    assert traj.response_texts == [turns[0] + out + turns[1] + out + turns[2]]
    assert traj.finish_reasons == ["stop"]


def test_zero_tool_calls_means_no_code_stops():
    sandbox = ScriptedSandbox()
    traj, _, engine = run({"P": [["A```python\nprint(1)\n```B"]]}, sandbox, ["P"],
                          tool=ToolConfig(max_tool_calls=0), schedule=LOCKSTEP)
    assert [c.params.stop for c in engine.calls] == [[]] and sandbox.codes == []
    assert traj.num_calls.tolist() == [0] and traj.response_texts == ["A```python\nprint(1)\n```B"]


def test_long_output_is_cut_with_a_marker():
    long = ExecResult(ExecStatus.OK, "0123456789" * 500, "", 0.01, 0)
    tool = ToolConfig(max_output_chars=200)
    traj, _, _ = run({PROMPT: [[STEP1 + STEP2, ANSWER]]}, ScriptedSandbox({CODE: long}), [PROMPT], tool=tool)
    shown = format_for_model(long, 200)
    assert len(shown) <= 200 and "omitted" in shown
    assert traj.response_texts == [STEP1 + STEP2 + "\n```output\n" + shown + "\n```\n" + ANSWER]


def test_long_output_is_cut_to_the_token_cap_with_a_marker():
    long = ExecResult(ExecStatus.OK, "0123456789" * 300, "", 0.01, 0)  # 3000 characters = 3000 byte tokens
    tool = ToolConfig(max_output_chars=4096, max_output_tokens=100)
    traj, _, _ = run({PROMPT: [[STEP1 + STEP2, ANSWER]]}, ScriptedSandbox({CODE: long}), [PROMPT], tool=tool)
    marker = "\n... [3000 tokens in all, the middle omitted] ...\n"  # 50 tokens: 50 left, 25 head + 25 tail
    shown = "0123456789" * 2 + "01234" + marker + "56789" + "0123456789" * 2
    assert traj.response_texts == [STEP1 + STEP2 + "\n```output\n" + shown + "\n```\n" + ANSWER]
    assert len(TOK.encode(shown, add_special_tokens=False)) == 100


@pytest.mark.parametrize("budget, calls, injected, codes", [
    (30, 0, 0, []),  # 25 + 5 sampled: the budget ends inside the code, nothing runs
    (40, 0, 0, []),  # the closing fence lands exactly on the budget: no room to inject, nothing runs
    (45, 1, 5, [CODE]),  # 40 sampled, then only 5 of the 17 output tokens fit
])
def test_response_budget_truncates(budget, calls, injected, codes):
    sandbox = ScriptedSandbox({CODE: ok("5\n")})
    traj, _, _ = run({PROMPT: [[STEP1 + STEP2, ANSWER]]}, sandbox, [PROMPT],
                     SamplingParams(temperature=0.0, max_new_tokens=budget))
    assert traj.finish_reasons == ["length"] and traj.truncated.tolist() == [True]
    assert traj.response_lens.tolist() == [budget] and sandbox.codes == codes
    assert traj.num_calls.tolist() == [calls]
    mask = traj.action_mask[0, 8 : 8 + budget].long().tolist()
    assert mask == [1] * (budget - injected) + [0] * injected


def test_execution_error_is_injected_as_the_model_sees_it():
    trace = ('Traceback (most recent call last):\n  File "/srv/sandbox/tmp/snippet.py", line 1, in <module>\n'
             "    1/0\nZeroDivisionError: division by zero\n")
    error = ExecResult(ExecStatus.ERROR, "partial\n", trace, 0.01, 1)
    sandbox = ScriptedSandbox({CODE: error})
    traj, _, _ = run({PROMPT: [[STEP1 + STEP2, "\nOops."]]}, sandbox, [PROMPT])
    shown = format_for_model(error, 1024)
    assert traj.response_texts == [STEP1 + STEP2 + "\n```output\n" + shown + "\n```\n" + "\nOops."]
    assert shown.startswith("partial\n") and shown.endswith("ZeroDivisionError: division by zero")
    assert "/srv/sandbox" not in shown
    assert traj.num_exec_errors.tolist() == [1] and traj.num_timeouts.tolist() == [0]


@pytest.mark.parametrize("status, field", [
    (ExecStatus.ERROR, "num_exec_errors"), (ExecStatus.TIMEOUT, "num_timeouts"), (ExecStatus.MEMORY, "num_timeouts"),
    (ExecStatus.KILLED, "num_timeouts"), (ExecStatus.SANDBOX_ERROR, "num_sandbox_errors"),
])
def test_outcomes_are_counted(status, field):
    result = ExecResult(status, "", "boom", 0.01, None)
    traj, _, _ = run({PROMPT: [[STEP1 + STEP2, ANSWER]]}, ScriptedSandbox({CODE: result}), [PROMPT])
    counts = {f: getattr(traj, f).item() for f in ("num_exec_errors", "num_timeouts", "num_sandbox_errors")}
    assert counts == {f: int(f == field) for f in counts} and traj.num_calls.item() == 1
    assert "\n```output\n" + format_for_model(result, 1024) + "\n```\n" in traj.response_texts[0]


def test_each_execution_is_recorded_with_its_code_status_and_output():
    error = ExecResult(ExecStatus.ERROR, "", "ZeroDivisionError: division by zero\n", 0.01, 1)
    block = "```python\nprint(1)\n```"
    scripts = {"A?": [["a" + block, "b" + block, "\\boxed{1}"]], "B?": [["\\boxed{2}"]]}
    sandbox = ScriptedSandbox({"\nprint(1)\n": ok("1\n")})
    traj, _, _ = run(scripts, sandbox, ["A?", "B?"], schedule=LOCKSTEP)
    assert traj.tool_calls == [[ToolCall("\nprint(1)\n", "ok", "1")] * 2, []]
    traj, _, _ = run({PROMPT: [[STEP1 + STEP2, "\nOops."]]}, ScriptedSandbox({CODE: error}), [PROMPT])
    assert traj.tool_calls == [[ToolCall(CODE, "error", format_for_model(error, 1024))]]
    assert traj.select([0]).tool_calls == traj.tool_calls


def test_a_sandbox_that_raises_counts_as_sandbox_error_and_the_model_is_told():
    sandbox = ScriptedSandbox(raises=ConnectionError("refused"))
    traj, _, _ = run({PROMPT: [[STEP1 + STEP2, ANSWER]]}, sandbox, [PROMPT])
    assert traj.num_sandbox_errors.tolist() == [1] and traj.num_calls.tolist() == [1]
    assert "could not be run" in traj.response_texts[0] and traj.finish_reasons == ["stop"]


def test_rows_finish_at_different_times():
    block = "```python\nprint(1)\n```"
    scripts = {
        "A?": [["\\boxed{1}"]],  # answers at once
        "B?": [["b" + block, "\\boxed{1}"], ["I know: \\boxed{1}"]],  # sample 0: one call; sample 1: none
        "C?": [["c" + block, "c" + block, "c" + block, "\\boxed{1}"]],  # three calls
    }
    sandbox = ScriptedSandbox(default=ok("1"))
    traj, _, engine = run(scripts, sandbox, ["A?", "B?", "C?"], SamplingParams(n=2, max_new_tokens=999),
                          schedule=LOCKSTEP)
    assert traj.num_calls.tolist() == [0, 0, 1, 0, 3, 3]
    assert traj.finish_reasons == ["stop"] * 6 and len(sandbox.codes) == 7
    # One request per phase of each trajectory, and finished trajectories are not sent again: A one segment,
    # B's first sample three (text, code, text), its second one, C seven (three calls of two phases, then text).
    assert [len(engine.submissions(k)) for k in range(6)] == [1, 1, 3, 1, 7, 7]
    assert set(engine.released) == set(range(6))
    out = "\n```output\n1\n```\n"
    assert traj.response_texts[2] == "b" + block + out + "\\boxed{1}"
    assert traj.response_texts[3] == "I know: \\boxed{1}"
    assert traj.response_texts[4] == ("c" + block + out) * 3 + "\\boxed{1}"


def test_prompt_that_opens_a_block_starts_in_the_code_phase():
    prompt = "Solve.\n```python\nx = 6*7\n"
    sandbox = ScriptedSandbox({"\nx = 6*7\nprint(x)\n": ok("42\n")})
    traj, _, engine = run({prompt: [["print(x)\n```", "\\boxed{42}"]]}, sandbox, [prompt], schedule=LOCKSTEP)
    assert engine.calls[0].params.stop == ["```"]
    assert traj.response_texts == ["print(x)\n```\n```output\n42\n```\n\\boxed{42}"]
    assert traj.num_calls.tolist() == [1]


def test_caller_stop_strings_end_the_response():
    params = SamplingParams(temperature=0.0, max_new_tokens=999, stop=["</answer>"])
    traj, _, engine = run({"P": [["<answer>1</answer> trailing"]]}, ScriptedSandbox(), ["P"], params, schedule=LOCKSTEP)
    assert engine.calls[0].params.stop == ["```python", "</answer>"]
    assert traj.response_texts == ["<answer>1</answer>"] and traj.finish_reasons == ["stop"]


def test_seed_is_offset_per_trajectory_and_segment():
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=999, seed=5)
    _, _, engine = run({PROMPT: [[STEP1 + STEP2, ANSWER]]}, ScriptedSandbox({CODE: ok("5")}), [PROMPT], params)
    seeds = [c.seed for c in (s.params for s in engine.calls)]
    assert sorted(seeds)[:2] == [5, 6] and len(set(seeds)) == 6  # 2 trajectories x 3 segments, all different


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="ground_truths"):
        run({PROMPT: [[ANSWER]]}, ScriptedSandbox(), [PROMPT], truths=["1", "2"])
    with pytest.raises(ValueError, match="prompts"):
        rollout_sync(ScriptedEngine(TOK, {}), TOK, ScriptedSandbox(), [], GREEDY, ToolConfig())
    with pytest.raises(ValueError, match="continuous"):
        Schedule("continuous")
    for kwargs, name in (({"max_tool_calls": -1}, "max_tool_calls"),
                         ({"output_template": "no slot"}, "output_template"), ({"code_end": ""}, "code_end"),
                         ({"run_timeout": 0}, "run_timeout"), ({"max_output_chars": 10}, "max_output_chars"),
                         ({"max_output_tokens": 8}, "max_output_tokens")):
        with pytest.raises(ValueError, match=name):
            ToolConfig(**kwargs)


def test_rollout_sync_refuses_a_running_loop_and_rollout_is_awaitable():
    engine = ScriptedEngine(TOK, {PROMPT: [[ANSWER]]})
    ids = [TOK.encode(PROMPT)]

    async def inside():
        with pytest.raises(RuntimeError, match="await rollout"):
            rollout_sync(engine, TOK, ScriptedSandbox(), ids, GREEDY, ToolConfig())
        return await rollout(engine, TOK, ScriptedSandbox(), ids, GREEDY, ToolConfig())

    traj, _ = asyncio.run(inside())
    assert traj.response_texts == [ANSWER]


SCHEDULES = [Schedule(), LOCKSTEP, Schedule("rounds", 64), Schedule("rounds", 5), Schedule("rounds", 1)]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: f"{s.kind}-{s.tokens_per_call}")
def test_every_schedule_gives_the_same_trajectories(schedule):
    """Per trajectory, in lockstep, or cut into rounds of a few tokens (stops then span rounds: "```python" is 9
    tokens), with code running while others generate: when things happen changes, never what the trajectories are."""
    block = "```python\nprint(1)\n```"
    scripts = {"A?": [["\\boxed{1}"]], "B?": [["b" + block, "\\boxed{1}"], ["I know: \\boxed{1}"]],
               "C?": [["c" + block, "cc" + block, "ccc" + block, "\\boxed{1} end"]]}
    params = SamplingParams(n=2, max_new_tokens=999, stop=["end"])
    traj, _, engine = run(scripts, ScriptedSandbox(default=ok("1")), ["A?", "B?", "C?"], params, schedule=schedule)
    out = "\n```output\n1\n```\n"
    assert traj.response_texts == [
        "\\boxed{1}", "\\boxed{1}", "b" + block + out + "\\boxed{1}", "I know: \\boxed{1}",
        "c" + block + out + "cc" + block + out + "ccc" + block + out + "\\boxed{1} end",
        "c" + block + out + "cc" + block + out + "ccc" + block + out + "\\boxed{1} end"]
    assert traj.num_calls.tolist() == [0, 0, 1, 0, 3, 3] and traj.finish_reasons == ["stop"] * 6
    sampled = [len(TOK.encode(t)) for t in ("\\boxed{1}", "b" + block + "\\boxed{1}", "I know: \\boxed{1}",
                                            "c" + block + "cc" + block + "ccc" + block + "\\boxed{1} end")]
    eos = [1, 1, 1, 1, 0, 0]  # "end" is a caller stop: no EOS after it
    want = [sampled[0], sampled[0], sampled[1], sampled[2], sampled[3], sampled[3]]
    assert traj.action_mask.sum(1).tolist() == [w + e for w, e in zip(want, eos)]
    if schedule.kind == "rounds":
        assert max(c.params.max_new_tokens for c in engine.calls) <= schedule.tokens_per_call


def test_each_resubmission_carries_exactly_the_accumulated_ids():
    """A trajectory's next request is its previous request's ids + what that request sampled (+ the injected output
    when its code ran): never re-tokenized, never shortened."""
    block = "```python\nprint(1)\n```"
    scripts = {"C?": [["c" + block, "cc" + block, "\\boxed{1}"]]}
    traj, _, engine = run(scripts, ScriptedSandbox(default=ok("1")), ["C?"], SamplingParams(n=2, max_new_tokens=999))
    injected = TOK.encode("\n```output\n1\n```\n", add_special_tokens=False)
    for key in range(2):
        subs = engine.submissions(key)
        samples = [s for k, s in engine.returned if k == key]
        assert len(subs) == len(samples) == 5  # text, code, text, code, text
        for i in range(4):
            after_code = subs[i].params.stop == ["```"]
            assert subs[i + 1].ids == subs[i].ids + samples[i].token_ids + (injected if after_code else [])
        full = traj.input_ids[key, : traj.prompt_lens[key] + traj.response_lens[key]].tolist()
        assert full == subs[-1].ids + samples[-1].token_ids


def test_slow_code_does_not_hold_back_the_other_trajectories():
    """Trajectory 0's code takes 0.3 s, the others' none: they run their code, go on and finish while the slow
    snippet still runs; trajectory 0 goes on the moment its result is back. (Scoring is the source's, once the
    batch is back: ``zerotir.rollout.scoring.score_trajectories``.)"""
    fast, slow = "```python\nprint(1)\n```", "```python\nprint(2)\n```"
    scripts = {"S?": [["s" + slow, "\\boxed{2}"]], "F?": [["f" + fast, "then \\boxed{1}"]]}
    sandbox = ScriptedSandbox(default=ok("1"), delays={"\nprint(2)\n": 0.3})
    traj, _, _ = run(scripts, sandbox, ["S?", "F?", "F?", "F?"], truths=["2", "1", "1", "9"])
    slow_done = sandbox.events.index(("done", "\nprint(2)\n"))
    assert [e for e in sandbox.events[:slow_done] if e[0] == "done"] == [("done", "\nprint(1)\n")] * 3
    assert traj.rewards.tolist() == [0.0] * 4  # unscored: the source scores the batch


def test_an_engine_error_fails_the_rollout_naming_the_trajectory():
    class Refusing(ScriptedEngine):
        def submit(self, key, ids, params):
            if key == 1:
                raise ValueError("ids hold token id 999")
            super().submit(key, ids, params)

    class Crashing(ScriptedEngine):
        def step(self):
            raise RuntimeError("CUDA error: device-side assert")

    scripts = {PROMPT: [[ANSWER]]}
    params = SamplingParams(n=2, max_new_tokens=99)
    with pytest.raises(RuntimeError, match=r"refused trajectory 1 \(prompt 0, segment 0.*token id 999"):
        run(scripts, ScriptedSandbox(), [PROMPT], params, engine=Refusing(TOK, scripts, n=2))
    crashing = Crashing(TOK, scripts, n=2)
    with pytest.raises(RuntimeError, match=r"failed while decoding trajectories \[0, 1\].*device-side"):
        run(scripts, ScriptedSandbox(), [PROMPT], params, engine=crashing)
    assert set(crashing.released) == {0, 1}  # nothing is left in the engine after the error


def test_an_engine_returning_more_than_asked_is_an_error():
    class Overlong(ScriptedEngine):
        def step(self):
            return [(k, type(s)(s.token_ids * 3, s.logprobs * 3, s.finish_reason)) for k, s in super().step()]

    with pytest.raises(RuntimeError, match="asked for at most 30 ids"):
        run({PROMPT: [[ANSWER]]}, ScriptedSandbox(), [PROMPT], SamplingParams(max_new_tokens=30),
            engine=Overlong(TOK, {PROMPT: [[ANSWER]]}))


def test_a_full_context_ends_the_trajectory_as_truncated():
    engine = ScriptedEngine(TOK, {PROMPT: [[STEP1 + STEP2, ANSWER]]}, context_length=8 + 45)
    traj, _, _ = run(None, ScriptedSandbox({CODE: ok("5\n")}), [PROMPT], engine=engine)
    # 40 sampled, then only 5 of the 17 output tokens fit in the 53-token context: no room to go on
    assert traj.finish_reasons == ["length"] and traj.response_lens.tolist() == [45]
