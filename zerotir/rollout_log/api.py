"""The JSON the web viewer reads: a run's steps, a step's prompt groups, one trajectory, from the dump files.

Plain functions of a rollouts folder (``records``' layout), no HTTP: ``zerotir.rollout_log.server`` maps URLs onto
them. They read a run that is still training: each call lists the folder again (a new step appears on the next
request), a file is read again only when its size or time changed, and a file cut short (a copy in progress, a
disk that filled) yields the records before the cut: a partly written last line is skipped, never an error. Steps
written by several data-parallel ranks are merged; a trajectory is named ``<rank>-<index>`` and a prompt group
``<rank>-<group>`` (group ids are per rank).
"""

from __future__ import annotations

import json
import threading
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from zerotir.rollout_log.records import SPLITS, has_failed_call, segments, step_files, summary, tool_of


class ApiInputError(ValueError):
    """A request for something the run does not have (an unknown split, step or trajectory); ``status`` is the
    HTTP status that says so."""

    def __init__(self, message: str, status: int = 404) -> None:
        super().__init__(message)
        self.status = status


def read_tolerant(path: Path) -> list[dict[str, Any]]:
    """The records of one file; a truncated gzip stream or a partly written (undecodable) line ends or skips
    quietly, as a run still writing may leave them."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []  # pruned between the listing and the read
    inflate = zlib.decompressobj(wbits=31)  # gzip framing; what decompresses before a cut is kept
    try:
        data = inflate.decompress(raw)
    except zlib.error:
        data = b""
    records = []
    for line in data.split(b"\n"):
        try:
            records.append(json.loads(line))
        except ValueError:
            continue  # empty, or the partly written last line
    return records


class RunReader:
    """The records of a rollouts folder, cached per file by (size, mtime)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self._cache: dict[Path, tuple[tuple[int, int], list[dict[str, Any]]]] = {}
        self._lock = threading.Lock()  # the server answers from several threads

    def _read(self, path: Path) -> list[dict[str, Any]]:
        try:
            stat = path.stat()
        except FileNotFoundError:
            return []  # pruned between the listing and the read
        key = (stat.st_size, stat.st_mtime_ns)
        with self._lock:
            cached = self._cache.get(path)
            if cached is not None and cached[0] == key:
                return cached[1]
        records = read_tolerant(path)
        with self._lock:
            self._cache[path] = (key, records)
        return records

    def records(self, split: str, step: int) -> list[dict[str, Any]]:
        """Every record of ``step`` (all ranks, rank then row order)."""
        _check_split(split)
        files = step_files(self.folder, split).get(step)
        if not files:
            raise ApiInputError(f"no {split} rollouts of step {step} in {self.folder}")
        return [r for path in files for r in self._read(path)]

    def steps(self, split: str) -> list[int]:
        _check_split(split)
        return list(step_files(self.folder, split))


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ApiInputError(f"split={split!r}: choose one of {list(SPLITS)}", 400)


def traj_id(record: dict[str, Any]) -> str:
    return f"{record['rank']}-{record['index']}"


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def runs_splits(reader: RunReader) -> dict[str, Any]:
    """The splits that have files, and the folder."""
    return {"folder": str(reader.folder), "splits": [s for s in SPLITS if reader.steps(s)]}


def step_list(reader: RunReader, split: str) -> list[dict[str, Any]]:
    """One line per step on disk: ``step, trajectories, reward`` (mean), ``accuracy, tool_rate`` (share that
    called a tool), ``failed_call_rate, response_tokens, truncated, ranks``."""
    out = []
    for step in reader.steps(split):
        files = step_files(reader.folder, split).get(step, [])
        records = reader.records(split, step)
        line: dict[str, Any] = {"step": step, "ranks": len(files), "reward": _mean([r["reward"] for r in records])}
        stats = summary(records)
        line.update(trajectories=stats["trajectories"], accuracy=stats.get("accuracy"),
                    tool_rate=stats.get("tool_call_rate"), failed_call_rate=stats.get("failed_call_rate"),
                    response_tokens=stats.get("response_tokens"), truncated=stats.get("truncated"))
        out.append(line)
    return out


def trajectory_line(record: dict[str, Any]) -> dict[str, Any]:
    """What a step's view shows of one trajectory (and filters on)."""
    return {
        "id": traj_id(record), "rank": record["rank"], "index": record["index"], "reward": record["reward"],
        "correct": bool(record["correct"]), "advantage": record.get("advantage"), "calls": record["calls"],
        "failed": has_failed_call(record), "tools": sorted({tool_of(c) for c in record["tool_calls"]}),
        "finish_reason": record["finish_reason"], "response_tokens": record["response_tokens"],
        "filtered_by": record.get("filtered_by") or [], "answer": record["answer"], "has_tokens": "tokens" in record,
        "preview": record["response"][:160],
    }


def step_view(reader: RunReader, split: str, step: int) -> dict[str, Any]:
    """A step's prompt groups (in first-seen order), each with its trajectories; and every tool name of the step."""
    groups: dict[str, dict[str, Any]] = {}
    tools: set[str] = set()
    for record in reader.records(split, step):
        key = f"{record['rank']}-{record['group']}"
        group = groups.setdefault(key, {"id": key, "problem_id": record["problem_id"], "source": record["source"],
                                        "prompt": record["prompt"], "reference": record["reference"],
                                        "trajectories": []})
        line = trajectory_line(record)
        tools.update(line["tools"])
        group["trajectories"].append(line)
    for group in groups.values():
        rewards = [t["reward"] for t in group["trajectories"]]
        group["reward"] = _mean(rewards)
        group["accuracy"] = _mean([float(t["correct"]) for t in group["trajectories"]])
    return {"split": split, "step": step, "groups": list(groups.values()), "tools": sorted(tools)}


def trajectory_view(reader: RunReader, split: str, step: int, traj: str) -> dict[str, Any]:
    """One trajectory: its record (with ``tokens`` when it was sampled for them), ``id``, and its response as
    ``blocks`` (``[kind, text]``: text, code and output parts) for a record without tokens."""
    for record in reader.records(split, step):
        if traj_id(record) == traj:
            return {**record, "id": traj, "blocks": [list(b) for b in segments(record["response"])]}
    raise ApiInputError(f"no trajectory {traj!r} (<rank>-<index>) in {split} step {step}")
