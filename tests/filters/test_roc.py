"""GRPO-RoC downsampling: the penalty of each trajectory, every failed one kept, the noisiest correct ones dropped,
ties drawn from the step's seed (the same step, the same rows)."""

from __future__ import annotations

import pytest
import torch

from tests.callbacks.helpers import make_batch
from zerotir.config import ToolConfig
from zerotir.filters.blocks import Markers
from zerotir.filters.roc import roc_dropped, roc_penalty

M = Markers.of(ToolConfig())
RAN = "```python\nprint(1+1)\n```\n```output\n2\n```\n"


def group_batch():
    """Group 0: a clean correct row, a correct row whose only call raised, two correct rows without a call, two
    failed rows; group 1: three correct rows that each give two answers over two turns."""
    texts = [RAN + "\\boxed{2}", RAN + "\\boxed{2}", "\\boxed{2}", "\\boxed{2}", "x", "y"] + \
        [RAN + "\\boxed{1} or \\boxed{2}"] * 3
    return make_batch([1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0], [0] * 6 + [1] * 3,
                      num_calls=[1, 1, 0, 0, 0, 0, 1, 1, 1], exec_errors=[0, 1, 0, 0, 0, 0, 0, 0, 0], texts=texts)


def test_the_penalty_is_the_error_share_plus_the_format_share():
    # p_err: 0/1, 1/1, 0.5 (no call: rStar2-Agent's value), 0.5; p_format: one answer -> 0. Failed rows 4, 5: no
    # valid answer -> p_format 1, plus 0.5 without a call. Group 1: two answers over two turns -> (2 - 1) / 2.
    assert roc_penalty(group_batch(), M).tolist() == [0.0, 1.0, 0.5, 0.5, 1.5, 1.5, 0.5, 0.5, 0.5]


@pytest.mark.parametrize("fmt, output", [
    ("hermes", "\n<tool_response>\n2\n</tool_response>\n"),
    ("chat", "<|im_end|>\n<|im_start|>user\n<tool_response>\n2\n</tool_response><|im_end|>\n<|im_start|>assistant\n")])
def test_the_turns_are_counted_at_the_runs_call_format(fmt, output):
    # Two answers over two turns (a call, its response, then the answers): p_format (2 - 1) / 2 = 0.5; p_err 0 / 1.
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>'
    batch = make_batch([1.0], [0], num_calls=[1], texts=[call + output + "\\boxed{1} or \\boxed{2}"])
    markers = Markers.of(ToolConfig(format=fmt, tools=[{"class_path": "calculator"}]))
    assert roc_penalty(batch, markers).tolist() == [0.5]
    assert roc_penalty(batch, M).tolist() == [1.0]  # with the fences' markers: one turn, (2 - 1) / 1


def dropped(batch, keep=None, fraction=0.5, seed=0):
    keep = torch.ones(len(batch), dtype=torch.bool) if keep is None else keep
    return roc_dropped(keep, batch.correct, batch.group_ids, roc_penalty(batch, M), fraction,
                       torch.Generator().manual_seed(seed)).tolist()


def test_failed_rows_stay_and_the_noisiest_correct_ones_go():
    # Group 0: 4 correct, keep max(1 clean, ceil(0.5 x 4) = 2): row 0 (p 0) and one of rows 2 / 3 (p 0.5);
    # row 1 (p 1) is dropped, and so is the other p-0.5 row; failed rows 4 and 5 stay.
    # Group 1: 3 correct, none clean: keep ceil(1.5) = 2 of them.
    out = dropped(group_batch())
    assert out[0] is False and out[1] is True and out[2] != out[3] and out[4:6] == [False, False]
    assert sum(out[6:]) == 1


def test_the_order_among_equal_penalties_is_the_steps_and_only_its():
    batch = group_batch()
    assert dropped(batch, seed=7) == dropped(batch, seed=7)  # deterministic
    assert {dropped(batch, seed=s)[2] for s in range(20)} == {True, False}  # but not always the same row


def test_the_share_bounds_and_the_rows_already_removed():
    batch = group_batch()
    # Share 0: only clean correct rows stay (group 0: row 0; group 1 has none). Share 1: nothing dropped.
    assert dropped(batch, fraction=0.0) == [False, True, True, True, False, False, True, True, True]
    assert dropped(batch, fraction=1.0) == [False] * 9
    # Row 0 already removed: group 0 ranks rows 1-3 only: keep ceil(1.5) = 2, the two p-0.5 rows; drop row 1.
    keep = torch.tensor([False] + [True] * 8)
    assert dropped(batch, keep=keep)[:6] == [False, True, False, False, False, False]
