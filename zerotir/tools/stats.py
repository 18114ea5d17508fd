"""The per-tool metrics of an RL step: calls, errors, timeouts, failures and latency per tool name
(``zerotir.metric_names.tool_tag``), from the tool calls the loop recorded (``Trajectories.tool_calls``)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from zerotir import metric_names as mn
from zerotir.tools.base import (
    STATUS_ERROR, STATUS_INVALID, STATUS_SANDBOX_ERROR, STATUS_TOOL_ERROR, TIMEOUT_STATUSES,
)
from zerotir.types import ToolCall


def tool_metrics(tool_calls: Iterable[Iterable[ToolCall]]) -> dict[str, float]:
    """``tools/<name>/<metric>`` for every tool called in the step (nothing for a tool never called).

    ``calls`` is a count; ``errors`` (status error or invalid: the model's fault), ``timeouts`` (stopped at a limit)
    and ``failures`` (the tool or the sandbox failed: the infrastructure's) are shares of that tool's calls;
    ``latency`` is the mean wall time of a call in seconds. A call that did not parse to a tool name counts under
    ``metric_names.INVALID_TOOL``.
    """
    counts: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0, 0.0])
    for row in tool_calls:
        for call in row:
            c = counts[call.tool or mn.INVALID_TOOL]
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
