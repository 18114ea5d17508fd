"""Tool-choice metrics of an RL step: which tool each answer calls first, per tool and per question kind,
the accuracy per kind and the share of its correct answers that called two different tools or more (a
looked-up value computed on: coordination), for any dataset whose rows carry a ``kind`` field (tags:
``zerotir.metric_names``).

The first call of an answer is its first recorded call (``Trajectories.tool_calls``): the tool's name, ``none``
without a call, ``invalid`` for a call that reached no tool (malformed, a name no tool has, arguments off its
schema: status ``invalid``), so a tiny model's misspelt names (``nalculator``) do not each become tags. A trajectory's kind is its prompt row's
(``StepResult.batch.kinds``, indexed by ``group_ids``). Observation only: nothing here reaches the loss.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

from zerotir import metric_names as mn
from zerotir.tools.stats import tool_label
from zerotir.types import ToolCall, Trajectories


def first_call(calls: Sequence[ToolCall]) -> str:
    """The first-call label of one answer (module doc)."""
    if not calls:
        return mn.NO_CALL
    return tool_label(calls[0])  # the per-tool metrics' label: the same tools/invalid/... for both


def tools_reached(calls: Sequence[ToolCall]) -> set[str]:
    """The distinct tools an answer's calls reached: a call that reached none (``invalid``: a misspelt name, say)
    names no tool, so ``nalculator`` then ``calculator`` is one tool, not two."""
    return {label for label in map(tool_label, calls) if label != mn.INVALID_TOOL}


def choice_metrics(batch: Trajectories, kinds: Sequence[str]) -> dict[str, float]:
    """``tools/<label>/first`` over the batch, and the ``kinds/<kind>/...`` tags for each kind of ``kinds`` (one per
    group id; "" for a row without a kind, left out of the per-kind tags; empty: no per-kind tags)."""
    size = len(batch)
    if size == 0:
        return {}
    firsts = [first_call(calls) for calls in batch.tool_calls]
    out = {mn.tool_tag(label, mn.FIRST_CALL): count / size for label, count in sorted(Counter(firsts).items())}
    if not kinds:
        return out
    groups = batch.group_ids.tolist()
    if max(groups) >= len(kinds):
        raise ValueError(f"choice_metrics: group id {max(groups)} but {len(kinds)} kinds; pass one per prompt row")
    correct, calls = batch.correct.tolist(), batch.num_calls.tolist()
    rows: dict[str, list[int]] = defaultdict(list)
    for i, group in enumerate(groups):
        if kinds[group]:
            rows[kinds[group]].append(i)
    for kind, members in sorted(rows.items()):
        n = len(members)
        out[mn.kind_tag(kind, "accuracy")] = sum(correct[i] for i in members) / n
        out[mn.kind_tag(kind, "calls_per_response")] = sum(calls[i] for i in members) / n
        out[mn.kind_tag(kind, "answers")] = float(n)
        right = [i for i in members if correct[i]]
        two = sum(len(tools_reached(batch.tool_calls[i])) >= 2 for i in right)
        out[mn.kind_tag(kind, "two_tools_in_correct")] = two / len(right) if right else 0.0
        for label, count in sorted(Counter(firsts[i] for i in members).items()):
            out[mn.kind_tag(kind, f"first_{label}")] = count / n
    return out
