"""Rollouts on disk: one JSON record per trajectory, one gzipped JSONL file per RL step (or evaluation).

Layout under the run's ``rollouts/`` folder (``<trainer.default_root_dir>/rollouts`` by default)::

    step_<k>.jsonl.gz        the trajectories of RL step k (all of them, before pass-rate filtering)
    val_step_<k>.jsonl.gz    the validation run after RL step k (every benchmark; ``source`` names each row's)
    test_step_<k>.jsonl.gz   a test run of the checkpoint of RL step k

With several data-parallel ranks each rank writes its own share as ``step_<k>.rank<r>.jsonl.gz``; readers merge the
files of a step. A file is written under a temporary name and renamed, so a reader (or a resumed run that writes the
step again) never sees half a file.

A record holds what a researcher asks about one trajectory (see ``trajectory_records`` for every field); a tool call
is ``{"tool", "code", "status", "output"}``: the tool's name, the call as the model wrote it, how it ended, and the
text the model was shown (dumps written before the tool plug-ins have no ``tool``: their calls were all python).
"""

from __future__ import annotations

import gzip
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zerotir.rewards.verify import extract_boxed

if TYPE_CHECKING:  # annotations only: reading a run's rollouts imports no torch
    from torch import Tensor

    from zerotir.types import Trajectories

SPLITS = ("train", "val", "test")
FILTERS = ("correct", "wrong", "error", "tool", "no-tool")  # "tool": a call to any tool
_NAME = re.compile(r"^(?:(val|test)_)?step_(\d+)(?:\.rank(\d+))?\.jsonl\.gz$")
# Statuses of calls that failed (the model's code raised, ran out of time / memory, the sandbox failed, the tool
# raised, or the call was malformed).
FAILED_STATUSES = ("error", "timeout", "memory", "killed", "sandbox_error", "tool_error", "invalid")


def file_name(split: str, step: int, rank: int = 0, world_size: int = 1) -> str:
    """``step_<k>.jsonl.gz`` (train) or ``<split>_step_<k>.jsonl.gz``; ``.rank<r>`` before the suffix when
    ``world_size > 1``."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r}: choose one of {SPLITS}")
    stem = f"step_{step}" if split == "train" else f"{split}_step_{step}"
    return f"{stem}.rank{rank}.jsonl.gz" if world_size > 1 else f"{stem}.jsonl.gz"


def trajectory_records(traj: Trajectories, prompts: Sequence[str], problem_ids: Sequence[str],
                       sources: Sequence[str] | None = None, *, step: int, split: str = "train",
                       weight_version: int | None = None, rank: int = 0,
                       removed: Mapping[str, Tensor] | None = None) -> list[dict[str, Any]]:
    """One JSON-ready record per trajectory of ``traj``.

    Args:
        traj: the scored trajectories (``rewards`` filled); row ``i`` answers prompt ``traj.group_ids[i]``.
        prompts: the prompt text of each group id.
        problem_ids: the data id of each group id.
        sources: the data source (benchmark) name of each group id (None: not known).
        step: the RL step (for evaluation: the RL step of the weights evaluated).
        split: "train", "val" or "test".
        weight_version: how many updates the weights that generated the rollout had seen (None: unknown).
        rank: the data-parallel rank that generated the rows.
        removed: the step's removal rules (``FilterDecision.removed``: name -> (B,) bool of the rows each matched);
            None: no decision.

    Returns:
        Records with ``step, split, rank, index, group, problem_id, source, prompt, response, answer (the last
        \\boxed{} of the response, or None), reference, reward, correct, calls, exec_errors, timeouts,
        sandbox_errors, tool_errors, finish_reason, truncated, response_tokens (sampled + injected), sampled_tokens,
        tool_calls (each ``{tool, code, status, output}``),
        weight_version and filtered_by`` (the names of the rules that removed the row from the loss, in the order
        they apply; [] for a trained row or without a decision).
    """
    size = len(traj)
    groups = traj.group_ids.tolist()
    if groups and max(groups) >= min(len(prompts), len(problem_ids)):
        raise ValueError(f"group id {max(groups)} has no prompt: {len(prompts)} prompts, {len(problem_ids)} ids")
    action = traj.action_mask.sum(1).tolist()
    matched = {name: rows.tolist() for name, rows in (removed or {}).items()}
    columns = {name: getattr(traj, name).tolist() for name in (
        "rewards", "num_calls", "num_exec_errors", "num_timeouts", "num_sandbox_errors", "num_tool_errors", "truncated",
        "response_lens")}
    records = []
    for i in range(size):
        g = groups[i]
        response = traj.response_texts[i]
        records.append({
            "step": step, "split": split, "rank": rank, "index": i, "group": g, "problem_id": problem_ids[g],
            "source": sources[g] if sources is not None else None, "prompt": prompts[g], "response": response,
            "answer": extract_boxed(response),
            "reference": traj.ground_truths[i], "reward": float(columns["rewards"][i]),
            "correct": columns["rewards"][i] > 0, "calls": int(columns["num_calls"][i]),
            "exec_errors": int(columns["num_exec_errors"][i]), "timeouts": int(columns["num_timeouts"][i]),
            "sandbox_errors": int(columns["num_sandbox_errors"][i]), "tool_errors": int(columns["num_tool_errors"][i]),
            "finish_reason": traj.finish_reasons[i],
            "truncated": bool(columns["truncated"][i]), "response_tokens": int(columns["response_lens"][i]),
            "sampled_tokens": int(action[i]),
            "tool_calls": [{"tool": c.tool, "code": c.code, "status": c.status, "output": c.output}
                           for c in traj.tool_calls[i]],
            "weight_version": weight_version,
            "filtered_by": [name for name, rows in matched.items() if rows[i]],
        })
    return records


def write_records(path: str | os.PathLike, records: Iterable[dict[str, Any]]) -> Path:
    """Write ``records`` as gzipped JSON lines to ``path``, atomically (temporary file, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    # mtime=0: the same records give the same bytes (no timestamp in the gzip header).
    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) as gz:
        for record in records:
            gz.write((json.dumps(record, ensure_ascii=False) + "\n").encode())
    os.replace(tmp, path)
    return path


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of one file."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def step_files(folder: str | os.PathLike, split: str = "train") -> dict[int, list[Path]]:
    """Step -> the files of that step (one per rank) in ``folder``, for ``split``, sorted by step."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r}: choose one of {SPLITS}")
    found: dict[int, list[Path]] = {}
    folder = Path(folder)
    if not folder.is_dir():
        return found
    for path in folder.iterdir():
        match = _NAME.match(path.name)
        if match and (match.group(1) or "train") == split:
            found.setdefault(int(match.group(2)), []).append(path)
    return {step: sorted(found[step]) for step in sorted(found)}


def read_step(folder: str | os.PathLike, step: int, split: str = "train") -> list[dict[str, Any]]:
    """Every record of ``step`` (all ranks), in rank then row order."""
    files = step_files(folder, split).get(step)
    if not files:
        raise FileNotFoundError(f"no {split} rollouts of step {step} in {folder}")
    return [record for path in files for record in read_records(path)]


def prune(folder: str | os.PathLike, split: str, keep_last: int) -> list[Path]:
    """Delete the files of all but the ``keep_last`` latest steps of ``split``; returns the deleted paths."""
    if keep_last < 1:
        raise ValueError(f"keep_last={keep_last}: must be >= 1")
    steps = step_files(folder, split)
    removed = []
    for step in list(steps)[: max(len(steps) - keep_last, 0)]:
        for path in steps[step]:
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def has_failed_call(record: dict[str, Any]) -> bool:
    """A call of the trajectory failed (the code raised or timed out, the sandbox or the tool failed, the call was
    malformed)."""
    return any(call["status"] in FAILED_STATUSES for call in record["tool_calls"])


def matches(record: dict[str, Any], kind: str) -> bool:
    """Whether ``record`` passes the filter ``kind`` (one of ``FILTERS``)."""
    if kind == "correct":
        return bool(record["correct"])
    if kind == "wrong":
        return not record["correct"]
    if kind == "error":
        return has_failed_call(record)
    if kind == "tool":
        return record["calls"] > 0
    if kind == "no-tool":
        return record["calls"] == 0
    raise ValueError(f"filter {kind!r}: choose one of {FILTERS}")


def summary(records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Counts and means of one step: trajectories, accuracy, tool-call rate (a call to any tool), calls, failed-call
    rate, length, truncation."""
    n = len(records)
    if n == 0:
        return {"trajectories": 0}
    calls = sum(r["calls"] for r in records)
    failed = sum(1 for r in records for c in r["tool_calls"] if c["status"] in FAILED_STATUSES)
    return {
        "trajectories": n,
        "accuracy": sum(bool(r["correct"]) for r in records) / n,
        "tool_call_rate": sum(r["calls"] > 0 for r in records) / n,
        "calls_per_response": calls / n,
        "failed_call_rate": failed / calls if calls else 0.0,
        "response_tokens": sum(r["response_tokens"] for r in records) / n,
        "truncated": sum(bool(r["truncated"]) for r in records) / n,
    }


def tool_of(call: dict[str, Any]) -> str:
    """The name of the tool a recorded call went to, for display: "python" in dumps written before calls named their
    tool, "no tool" for a call that did not parse to a name."""
    return call.get("tool", "python") or "no tool"


def segments(response: str, code_start: str = "```python", output_start: str = "```output",
             fence: str = "```") -> list[tuple[str, str]]:
    """Split a response into ``("text" | "code" | "output", text)`` parts along its code and output blocks.

    A block runs from its opening fence to the next ``fence``; one left open (a truncated response) runs to the end.
    Empty text parts are dropped; block contents lose the newline right after the opening fence and the one before
    the closing fence.
    """
    parts: list[tuple[str, str]] = []
    opening = re.compile(f"{re.escape(code_start)}|{re.escape(output_start)}")
    at = 0
    while True:
        found = opening.search(response, at)
        if found is None:
            break
        if found.start() > at:
            parts.append(("text", response[at:found.start()]))
        kind = "code" if found.group() == code_start else "output"
        body_start = found.end()
        close = response.find(fence, body_start)
        body = response[body_start:] if close < 0 else response[body_start:close]
        parts.append((kind, body.removeprefix("\n").removesuffix("\n")))
        at = len(response) if close < 0 else close + len(fence)
    if at < len(response):
        parts.append(("text", response[at:]))
    return [(kind, text) for kind, text in parts if kind != "text" or text.strip()]
