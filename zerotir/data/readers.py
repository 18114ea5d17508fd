"""The file readers of the data module: JSONL, Parquet and ``datasets`` sources, each yielding ``(where, row)``
(``where``: the file and line, or the row, that an error names), and the field check of a row."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path


def row_field(obj: dict, field: str, where: str) -> str:
    """The text of ``obj[field]``; raises ValueError naming ``where`` and the field where it is missing or empty."""
    value = obj.get(field) if isinstance(obj, dict) else None
    text = "" if value is None else str(value)
    if not text.strip():
        state = "missing" if not isinstance(obj, dict) or field not in obj else "null" if value is None else "empty"
        raise ValueError(f"{where}: field {field!r} is {state}; every row needs a non-empty {field!r} "
                         "(set data.problem_field / data.answer_field if the file names it differently)")
    return text


def read_jsonl(path: Path) -> Iterator[tuple[str, dict]]:
    """The objects of a JSONL file (blank lines skipped); raises ValueError naming the line of bad JSON."""
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{line_no}: not valid JSON ({exc.msg})") from exc
            yield f"{path}:{line_no}", obj


def read_parquet(path: Path) -> Iterator[tuple[str, dict]]:
    """The rows of a Parquet file."""
    import pyarrow.parquet as pq

    for i, obj in enumerate(pq.read_table(path).to_pylist()):
        yield f"{path} row {i}", obj


def read_hf(spec: str, default_split: str) -> Iterator[tuple[str, dict]]:
    """The rows of ``hf:<dataset>[:<split>]`` (``default_split`` where it names none)."""
    try:
        import datasets
    except ImportError as exc:
        raise ImportError(f"{spec!r} needs the 'datasets' package (pip install datasets), "
                          "or export the data to JSONL / Parquet and name the file instead") from exc
    name, _, split = spec[3:].partition(":")
    for i, obj in enumerate(datasets.load_dataset(name, split=split or default_split)):
        yield f"{spec} row {i}", dict(obj)
