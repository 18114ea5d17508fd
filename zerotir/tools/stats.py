"""The per-tool metrics of an RL step: calls, errors, timeouts, failures and latency per tool name
(``zerotir.metric_names.tool_tag``), from the tool calls the loop recorded (``Trajectories.tool_calls``)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from zerotir import metric_names as mn
from zerotir.tools.base import STATUS_ERROR, STATUS_INVALID, STATUS_SANDBOX_ERROR, STATUS_TOOL_ERROR, TIMEOUT_STATUSES
from zerotir.types import ToolCall


def tool_label(call: ToolCall) -> str:
    """The name one recorded call counts under in the per-tool metrics: its tool, or ``metric_names.INVALID_TOOL``
    for a call that reached no tool (status ``invalid``: malformed, a name no tool has, arguments off its schema).

    The name a model writes is free text (a tiny model writes ``nalculator``): kept as the label, each misspelling
    would be a tag of its own, an unbounded set. This way the labels are the configured tools and one more.
    """
    return mn.INVALID_TOOL if not call.tool or call.status == STATUS_INVALID else call.tool


def tool_metrics(tool_calls: Iterable[Iterable[ToolCall]]) -> dict[str, float]:
    """``tools/<name>/<metric>`` for every tool called in the step (nothing for a tool never called).

    ``calls`` is a count; ``errors`` (status error or invalid: the model's fault), ``timeouts`` (stopped at a limit)
    and ``failures`` (the tool or the sandbox failed: the infrastructure's) are shares of that tool's calls;
    ``latency`` is the mean wall time of a call in seconds. A call that reached no tool counts under
    ``metric_names.INVALID_TOOL`` (``tool_label``), whose ``errors`` are all its calls.
    """
    counts: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0, 0.0])
    for row in tool_calls:
        for call in row:
            c = counts[tool_label(call)]
            c[0] += 1
            c[1] += call.status in (STATUS_ERROR, STATUS_INVALID)
            c[2] += call.status in TIMEOUT_STATUSES
            c[3] += call.status in (STATUS_SANDBOX_ERROR, STATUS_TOOL_ERROR)
            c[4] += call.seconds
    out = {}
    for tool, (calls, errors, timeouts, failures, seconds) in sorted(counts.items()):
        values = (calls, errors / calls, timeouts / calls, failures / calls, seconds / calls)
        out.update({mn.tool_tag(tool, name): value for name, value in zip(mn.TOOL_METRICS, values)})
    return out
