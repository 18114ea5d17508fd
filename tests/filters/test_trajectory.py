"""Each trajectory rule on constructed trajectories, with what it must and must not match."""

from __future__ import annotations

import pytest

from tests.callbacks.helpers import make_batch
from zerotir.config import FilterConfig, ToolConfig
from zerotir.filters.trajectory import RULES, FilterContext, has_void_turn

CTX = FilterContext.of(ToolConfig(), max_response_tokens=16)
CFG = FilterConfig()
RAN = "```python\nprint(1+1)\n```\n```output\n2\n```\n"  # one executed block and its output
UNRUN = "```python\nprint(2)\n```\n"  # a block with no output after it (written after the call budget was spent)


def matched(name: str, batch, cfg: FilterConfig = CFG) -> list[bool]:
    return RULES[name](batch, cfg, CTX).tolist()


def test_the_registry_names_the_config_switches():
    on = FilterConfig(overlong_wrong=True, shortcut=True, code_mismatch=True, void_repetition=True, void_turn=True)
    assert tuple(RULES) == on.trajectory_rules


def test_overlong_wrong_removes_a_truncated_right_answer_and_a_wrong_one_at_the_budget():
    # Row 0: the right answer written, then cut at the budget: truncated, so its reward is 0 (wrong) -> matched.
    # Row 1: wrong, stopped at exactly the budget (16 of 16 tokens) -> matched. Row 2: correct at the budget -> kept.
    # Row 3: wrong, 15 tokens, not truncated -> kept.
    batch = make_batch([0.0, 0.0, 1.0, 0.0], [0, 0, 0, 0], truncated=[True, False, False, False],
                       response_lens=[16, 16, 16, 15], texts=["\\boxed{4} and then", "\\boxed{5}", "\\boxed{4}", "x"])
    assert matched("overlong_wrong", batch) == [True, True, False, False]


def test_shortcut_removes_a_correct_answer_whose_block_has_no_output():
    # Row 0: correct, blocks (2 opened, 2 closed, 1 output): the second block never ran -> matched.
    # Row 1: correct, every block answered by its output -> kept. Row 2: the same mismatch but wrong -> kept.
    texts = [RAN + UNRUN + "\\boxed{2}", RAN + "\\boxed{2}", RAN + UNRUN + "\\boxed{3}"]
    batch = make_batch([1.0, 1.0, 0.0], [0, 0, 0], num_calls=[1, 1, 1], texts=texts)
    assert matched("shortcut", batch) == [True, False, False]


def test_code_mismatch_needs_a_valid_answer_and_a_successful_execution():
    # All four rows: blocks (2, 2, 1). Row 0: valid answer, its one execution succeeded -> matched.
    # Row 1: its one execution raised (all failed) -> kept. Row 2: no valid answer (truncated) -> kept.
    # Row 3: valid answer but no execution at all (the paper's code: none ran counts as all failed) -> kept.
    texts = [RAN + UNRUN + "\\boxed{2}"] * 4
    batch = make_batch([0.0] * 4, [0] * 4, num_calls=[1, 1, 1, 0], exec_errors=[0, 1, 0, 0],
                       truncated=[False, False, True, False], texts=texts)
    assert matched("code_mismatch", batch) == [True, False, False, False]


def test_code_mismatch_counts_a_call_the_sandbox_could_not_run_as_failed():
    # Blocks (2, 2, 1) and a valid answer in every row. Row 0: its one call never ran (sandbox error), so no
    # execution succeeded -> kept. Row 1: a timeout and a sandbox error, nothing ran -> kept. Row 2: two calls, one
    # could not run and one succeeded -> matched (one success is enough).
    texts = [RAN + UNRUN + "\\boxed{2}"] * 3
    batch = make_batch([0.0] * 3, [0] * 3, num_calls=[1, 2, 2], timeouts=[0, 1, 0], sandbox_errors=[1, 1, 1],
                       texts=texts)
    assert matched("code_mismatch", batch) == [False, False, True]


def test_void_repetition_removes_a_repetition_loop_without_an_answer():
    # "ab" x 10 has 20 characters: 210 substring occurrences, 39 distinct (2 per length 1..19, 1 of length 20),
    # so its repeat score is 1 - 39/210 = 0.814 > 0.2. "abcdefghij": every substring distinct, score 0.
    loop = "ab" * 10
    batch = make_batch([0.0, 0.0, 0.0, 1.0], [0] * 4, truncated=[True, False, False, False],
                       texts=[loop, "abcdefghij", loop + " \\boxed{ab}", loop + " \\boxed{ab}"])
    # Row 0: the loop, cut at the budget (no valid answer) -> matched. Row 1: no repetition -> kept.
    # Rows 2 and 3: the same loop but ending in a valid answer -> kept (the rule is for answer-less loops).
    on = FilterConfig(void_repetition=True)
    assert matched("void_repetition", batch, on) == [True, False, False, False]
    lenient = FilterConfig(void_repetition=True, void_repetition_threshold=0.9)  # 0.814 is below 0.9
    assert matched("void_repetition", batch, lenient) == [False] * 4


def test_void_turn_removes_a_turn_that_ended_without_code_or_answer():
    texts = [RAN + "I am not sure.",  # turn 2 ended (EOS) with neither a block nor an answer -> void
             "Let me think.",  # one turn, nothing in it -> void
             RAN + "so \\boxed{2}",  # turn 1 a closed block, turn 2 an answer -> kept
             RAN + "I am not sure and",  # the same as row 0 but cut at the budget: the last turn was cut -> kept
             UNRUN]  # a closed block the model wrote after its call budget: a turn with code -> kept
    batch = make_batch([0.0] * 5, [0] * 5, truncated=[False, False, False, True, False], texts=texts)
    assert matched("void_turn", batch) == [True, True, False, False, False]


@pytest.mark.parametrize("text,truncated,void", [
    ("```output\n1\n```\nthen \\boxed{1}", False, True),  # an output the model wrote: the turn before it is empty
    ("\\fbox{3}", False, False),  # \fbox is an answer too (the reward reads it)
])
def test_void_turn_edge_cases(text, truncated, void):
    assert has_void_turn(text, truncated, CTX.markers) is void


# The same responses in the JSON call formats: hermes injects its <tool_response> block inside the assistant's turn;
# chat (a Qwen-style chat template) ends the turn, puts the observation in a tool turn and opens a new one.
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>'
HERMES_RAN = CALL + "\n<tool_response>\n2\n</tool_response>\n"
CHAT_RAN = (CALL + "<|im_end|>\n<|im_start|>user\n<tool_response>\n2\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n")


@pytest.mark.parametrize("fmt, ran", [("hermes", HERMES_RAN), ("chat", CHAT_RAN)])
def test_the_rules_read_the_markers_of_the_runs_call_format(fmt, ran):
    ctx = FilterContext.of(ToolConfig(format=fmt, tools=[{"class_path": "calculator"}]), max_response_tokens=16)
    # Row 0: correct, a second call written after the budget (no response after it) -> shortcut. Row 1: every call
    # answered -> kept. Row 2: a turn after the response with neither a call nor an answer -> void turn.
    texts = [ran + "check: " + CALL + "\\boxed{2}", ran + "so \\boxed{2}", ran + "I am not sure."]
    batch = make_batch([1.0, 1.0, 0.0], [0, 0, 0], num_calls=[1, 1, 1], texts=texts)
    assert RULES["shortcut"](batch, CFG, ctx).tolist() == [True, False, False]
    assert RULES["void_turn"](batch, CFG, ctx).tolist() == [False, False, True]
    # Read with the fences' markers, these responses hold no block at all: nothing would be matched.
    assert RULES["shortcut"](batch, CFG, CTX).tolist() == [False, False, False]
