"""Per-tool metrics of a step (zerotir.tools.stats), worked by hand."""

from __future__ import annotations

import pytest

from zerotir import metric_names as mn
from zerotir.tools.stats import tool_label, tool_metrics
from zerotir.types import ToolCall


def test_calls_errors_timeouts_failures_and_latency_per_tool():
    rows = [
        [ToolCall("print(1)", "ok", "1", "python", 0.2), ToolCall("1/0", "error", "E", "python", 0.4)],
        [ToolCall("x", "timeout", "T", "python", 1.2), ToolCall("2+2", "ok", "4", "calculator", 0.01)],
        [ToolCall("{", "invalid", "Error", "", 0.0), ToolCall("q", "sandbox_error", "S", "python", 0.2)],
        [],
    ]
    m = tool_metrics(rows)
    assert m[mn.tool_tag("python", "calls")] == 4
    assert m[mn.tool_tag("python", "errors")] == 0.25  # 1 error / 4 calls
    assert m[mn.tool_tag("python", "timeouts")] == 0.25
    assert m[mn.tool_tag("python", "failures")] == 0.25  # the sandbox error
    assert m[mn.tool_tag("python", "latency")] == pytest.approx(0.5)  # (0.2 + 0.4 + 1.2 + 0.2) / 4
    assert m[mn.tool_tag("calculator", "calls")] == 1 and m[mn.tool_tag("calculator", "errors")] == 0
    assert m["tools/invalid/calls"] == 1 and m["tools/invalid/errors"] == 1.0  # an unparsed call: the model's error
    assert len(m) == 3 * len(mn.TOOL_METRICS)
    assert tool_metrics([[], []]) == {}


def test_calls_that_reached_no_tool_count_under_one_name_whatever_the_model_wrote():
    # A tiny model misspells: each name is recorded as written (status invalid); the tags stay the tools + "invalid".
    rows = [[ToolCall('{"name": "nalculator"}', "invalid", "Error: there is no tool named 'nalculator'", "nalculator",
                      0.0),
             ToolCall('{"name": "calculater"}', "invalid", "Error: there is no tool named", "calculater", 0.0)],
            [ToolCall('{"name": "calculator"}', "invalid", "Error: the arguments do not fit", "calculator", 0.0),
             ToolCall("1+1", "ok", "2", "calculator", 0.1)]]
    m = tool_metrics(rows)
    assert {k.split("/")[1] for k in m} == {"calculator", mn.INVALID_TOOL}
    assert m[mn.tool_tag(mn.INVALID_TOOL, "calls")] == 3 and m[mn.tool_tag(mn.INVALID_TOOL, "errors")] == 1.0
    assert m[mn.tool_tag("calculator", "calls")] == 1 and m[mn.tool_tag("calculator", "errors")] == 0.0
    assert tool_label(rows[0][0]) == mn.INVALID_TOOL and tool_label(rows[1][1]) == "calculator"
