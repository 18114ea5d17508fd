"""Evaluation metrics: pure functions from per-trajectory results to per-benchmark numbers, and the report writer.

Used by ``zerotir test`` and by validation during training: the module turns each scored ``Trajectories`` batch into
``EvalRecord``s (``records_from_trajectories``), gathers them per benchmark, then calls ``benchmark_metrics`` and
``write_report``. Metric keys are the ``EVAL_*`` tags of ``zerotir.metric_names``; TensorBoard tags are
``f"{benchmark}/{key}"`` (``tensorboard_scalars``).
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zerotir.metric_names import (
    EVAL_ACCURACY,
    EVAL_CALLS_PER_RESPONSE,
    EVAL_METRICS,
    EVAL_PASS_AT_K,
    EVAL_RESPONSE_LENGTH,
    EVAL_SANDBOX_ERROR_RATE,
    EVAL_TOOL_CALL_RATE,
    EVAL_TOOL_CALLS,
    EVAL_TRUNCATION_RATE,
    eval_tool_tag,
)
from zerotir.tools.stats import tool_label

# Extra keys of a benchmark's result dict (counts, not TensorBoard curves).
NUM_PROBLEMS = "num_problems"
SAMPLES_PER_PROBLEM = "samples_per_problem"
K = "k"


@dataclass
class EvalRecord:
    """The result of one trajectory (one sample for one problem).

    Args:
        problem_id: the problem this sample answers; the k samples of a problem share it.
        correct: the answer counts as correct (``Trajectories.correct``: the reward's verdict).
        num_calls: code blocks executed.
        response_length: response tokens (sampled + injected).
        num_sandbox_errors: executions the sandbox failed to run (infrastructure fault).
        num_exec_errors: executions whose code raised.
        num_timeouts: executions stopped at a limit.
        truncated: the response hit the token budget.
        tool_calls: calls per tool name (calls that reached no tool under ``metric_names.INVALID_TOOL``:
            ``tools.stats.tool_label``).
    """

    problem_id: str
    correct: bool
    num_calls: int = 0
    response_length: int = 0
    num_sandbox_errors: int = 0
    num_exec_errors: int = 0
    num_timeouts: int = 0
    truncated: bool = False
    tool_calls: dict[str, int] = field(default_factory=dict)


def records_from_trajectories(traj: Any, problem_ids: Sequence[str]) -> list[EvalRecord]:
    """One ``EvalRecord`` per row of a scored ``zerotir.types.Trajectories``.

    Args:
        traj: the batch, scored (``correct``: the reward's verdict, whatever its score).
        problem_ids: the id of each prompt, indexed by ``traj.group_ids``.
    """
    return [
        EvalRecord(
            problem_id=str(problem_ids[int(g)]), correct=bool(r), num_calls=int(c), response_length=int(n),
            num_sandbox_errors=int(se), num_exec_errors=int(ee), num_timeouts=int(to), truncated=bool(tr),
            tool_calls=dict(Counter(tool_label(call) for call in calls)),
        )
        for g, r, c, n, se, ee, to, tr, calls in zip(
            traj.group_ids.tolist(), traj.correct.tolist(), traj.num_calls.tolist(), traj.response_lens.tolist(),
            traj.num_sandbox_errors.tolist(), traj.num_exec_errors.tolist(), traj.num_timeouts.tolist(),
            traj.truncated.tolist(), traj.tool_calls,
        )
    ]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem from ``n`` samples of which ``c`` are correct: ``1 - C(n-c, k) / C(n, k)``
    (Chen et al., 2021), the chance that a random subset of k samples holds a correct one.

    Raises:
        ValueError: unless ``0 <= c <= n`` and ``1 <= k <= n``.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _ratio(num: float, den: float) -> float:
    return num / den if den else 0.0


def benchmark_metrics(records: Iterable[EvalRecord], k: int | None = None) -> dict[str, float]:
    """Metrics of one benchmark.

    Args:
        records: one per trajectory; problems may have different sample counts.
        k: pass@k's k; default the smallest number of samples any problem has.

    Returns:
        ``accuracy`` (avg@k: per problem the share of correct samples, averaged over problems), ``pass_at_k``
        (mean unbiased estimator), ``tool_call_rate`` (share of responses with >= 1 call to any tool),
        ``calls_per_response``,
        ``response_length`` (mean tokens), ``sandbox_error_rate`` (sandbox failures per execution),
        ``truncation_rate``, ``tool_calls_per_response/<tool>`` for every tool called (``eval_tool_tag``), and the
        counts ``num_problems``, ``samples_per_problem`` (mean), ``k``.

    Raises:
        ValueError: no records, or ``k`` larger than some problem's sample count.
    """
    records = list(records)
    if not records:
        raise ValueError("benchmark_metrics: no records")
    by_problem: dict[str, list[EvalRecord]] = defaultdict(list)
    for rec in records:
        by_problem[rec.problem_id].append(rec)
    sizes = [len(group) for group in by_problem.values()]
    k = min(sizes) if k is None else k
    if k > min(sizes):
        raise ValueError(f"benchmark_metrics: k={k} but some problem has only {min(sizes)} samples")
    corrects = [(len(group), sum(r.correct for r in group)) for group in by_problem.values()]
    num_calls = sum(r.num_calls for r in records)
    per_tool: Counter[str] = Counter()
    for rec in records:
        per_tool.update(rec.tool_calls)
    return {
        EVAL_ACCURACY: sum(c / n for n, c in corrects) / len(corrects),
        EVAL_PASS_AT_K: sum(pass_at_k(n, c, k) for n, c in corrects) / len(corrects),
        EVAL_TOOL_CALL_RATE: sum(r.num_calls > 0 for r in records) / len(records),
        EVAL_CALLS_PER_RESPONSE: num_calls / len(records),
        EVAL_RESPONSE_LENGTH: sum(r.response_length for r in records) / len(records),
        EVAL_SANDBOX_ERROR_RATE: _ratio(sum(r.num_sandbox_errors for r in records), num_calls),
        EVAL_TRUNCATION_RATE: sum(r.truncated for r in records) / len(records),
        **{eval_tool_tag(tool): calls / len(records) for tool, calls in sorted(per_tool.items())},
        NUM_PROBLEMS: len(by_problem),
        SAMPLES_PER_PROBLEM: len(records) / len(by_problem),
        K: k,
    }


def tool_keys(results: dict[str, dict[str, float]]) -> list[str]:
    """The per-tool keys (``eval_tool_tag``) of every tool any benchmark called, sorted; a benchmark without one
    of them never called that tool (0 calls per response)."""
    return sorted({key for m in results.values() for key in m if key.startswith(f"{EVAL_TOOL_CALLS}/")})


def tensorboard_scalars(results: dict[str, dict[str, float]]) -> dict[str, float]:
    """``{f"{benchmark}/{metric}": value}`` for the curve metrics (not the counts), the per-tool calls included."""
    keys = (*EVAL_METRICS, *tool_keys(results))
    return {f"{name}/{key}": float(metrics[key]) for name, metrics in results.items() for key in keys if key in metrics}


def average_row(results: dict[str, dict[str, float]]) -> dict[str, float]:
    """Unweighted mean over benchmarks of each metric (the paper averages benchmarks this way); a tool a benchmark
    did not call counts there as 0 calls."""
    keys = [key for key in EVAL_METRICS if all(key in m for m in results.values())]
    mean = {key: sum(m[key] for m in results.values()) / len(results) for key in keys}
    mean.update({key: sum(m.get(key, 0.0) for m in results.values()) / len(results) for key in tool_keys(results)})
    return mean


_COLUMNS = (
    ("benchmark", None, ""),
    ("problems", NUM_PROBLEMS, "d"),
    ("k", K, "d"),
    ("avg@k %", EVAL_ACCURACY, "pct"),
    ("pass@k %", EVAL_PASS_AT_K, "pct"),
    ("tool use %", EVAL_TOOL_CALL_RATE, "pct"),
    ("calls / response", EVAL_CALLS_PER_RESPONSE, ".2f"),
    ("response tokens", EVAL_RESPONSE_LENGTH, ".0f"),
    ("sandbox errors %", EVAL_SANDBOX_ERROR_RATE, "pct"),
    ("truncated %", EVAL_TRUNCATION_RATE, "pct"),
)


def _cell(value: float | None, fmt: str) -> str:
    if value is None:
        return ""
    if fmt == "pct":
        return f"{100 * value:.1f}"
    if fmt == "d":
        return str(int(value))
    return format(value, fmt)


def _columns(results: dict[str, dict[str, float]]) -> list[tuple[str, str | None, str]]:
    """``_COLUMNS`` with a column per tool called (its calls per response) after the calls of all tools."""
    at = [key for _, key, _ in _COLUMNS].index(EVAL_CALLS_PER_RESPONSE) + 1
    tools = [(f"{key.split('/', 1)[1]} calls / response", key, ".2f") for key in tool_keys(results)]
    return [*_COLUMNS[:at], *tools, *_COLUMNS[at:]]


def markdown_table(results: dict[str, dict[str, float]]) -> str:
    """A Markdown table, one row per benchmark plus an unweighted mean row when there are several; a tool a
    benchmark did not call shows 0.00 in its column."""
    columns = _columns(results)
    lines = ["| " + " | ".join(title for title, _, _ in columns) + " |",
             "|" + "|".join("---" if key is None else "---:" for _, key, _ in columns) + "|"]
    rows = list(results.items())
    if len(results) > 1:
        rows.append(("mean", average_row(results)))
    tools = set(tool_keys(results))
    for name, metrics in rows:
        cells = [name] + [_cell(metrics.get(key, 0.0 if key in tools else None), fmt) for _, key, fmt in columns[1:]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_report(results: dict[str, dict[str, float]], out_dir: str | Path,
                 meta: dict[str, Any] | None = None, stem: str = "eval_report") -> tuple[Path, Path]:
    """Write ``<stem>.json`` (per-benchmark metrics, their mean, and ``meta``) and ``<stem>.md`` (the table).

    Args:
        results: benchmark name -> ``benchmark_metrics`` output.
        out_dir: folder to write to (created if needed).
        meta: run details to keep with the numbers (model, checkpoint, sampling settings, dropped prompts...).
        stem: file name without extension.

    Returns:
        (json_path, md_path).
    """
    if not results:
        raise ValueError("write_report: no benchmark results")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / f"{stem}.json", out / f"{stem}.md"
    payload = {"benchmarks": results, "mean": average_row(results), "meta": meta or {}}
    json_path.write_text(json.dumps(payload, indent=2, sort_keys=False, default=str) + "\n", encoding="utf-8")
    header = "# Evaluation report\n\n"
    if meta:
        header += "".join(f"- {key}: {value}\n" for key, value in meta.items()) + "\n"
    md_path.write_text(header + markdown_table(results), encoding="utf-8")
    return json_path, md_path


def new_run_dir(parent: str | Path, now: float | None = None) -> Path:
    """A folder of its own for one ``validate`` / ``test`` run: ``<parent>/<YYYYmmdd-HHMMSS>``, or ``...-2``,
    ``...-3`` when another run took that name (the folder is created here, exclusively, so two runs started in the
    same second, even at once, never share one)."""
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    for k in range(1, 10_000):
        folder = parent / (stamp if k == 1 else f"{stamp}-{k}")
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder
    raise FileExistsError(f"{parent}: every run folder name of {stamp} is taken")
