"""Request bodies: SandboxFusion's ``/run_code`` request, ``/run_batch``, and where their parsing runs.

A body passes :class:`sandbox.bounds.BodyLimit` (16 MiB) before it is read. Parsing it is another matter: JSON and
pydantic hold the GIL, and a 16 MiB batch of ~420,000 tiny entries took ~5 s to validate (and ~500 MB), during
which the event loop answered nothing, a ``print(1+1)`` included, before the batch got its 413 for having more
entries than the queue. So a body over :data:`INLINE_BYTES` is parsed in a separate process
(:class:`BodyParser`), and a batch is counted before its entries are validated: over ``queue_size`` entries it is
refused without building one of them. Small bodies (every ``/run_code`` of a training step) are parsed inline, as
a process round trip would cost them more than the parse.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sandbox.files import MAX_FILES

MAX_CODE_CHARS = 1_000_000
#: Bodies up to this size are parsed on the event loop (well under a millisecond of work); larger ones elsewhere.
INLINE_BYTES = 256 * 2**10


class RunCodeRequest(BaseModel):
    """SandboxFusion's ``/run_code`` request (fields it has and this server does not use are accepted and ignored)."""

    model_config = ConfigDict(extra="ignore")
    code: str = Field(max_length=MAX_CODE_CHARS, description="The Python source to run.")
    language: str | None = Field(None, description="Required, as in SandboxFusion: only 'python' (or 'python3') "
                                                    "runs here.")
    compile_timeout: float | None = Field(None, description="Ignored (Python needs no compile step).")
    run_timeout: float | None = Field(None, description="Wall-time limit in seconds; null or <= 0 for the default.")
    memory_limit_MB: int | None = Field(None, description="Memory budget in MB; null or <= 0 (SandboxFusion's -1) "
                                                          "for the default.")
    stdin: str | None = Field(None, description="The snippet's standard input (null: empty).")
    files: dict[str, str | None] = Field(default_factory=dict, max_length=MAX_FILES, description="Input files: "
                                         "name relative to the snippet's cwd -> base64 content (null: skipped).")
    fetch_files: list[str] = Field(default_factory=list, max_length=MAX_FILES, description="Files read back "
                                   "after the run, returned base64 in the response's files (a missing one is left "
                                   "out).")
    request_id: str | int | None = Field(None, description="Echoed in the response.")

    @field_validator("request_id")
    @classmethod
    def _encodable(cls, value: str | int | None) -> str | int | None:
        """A request_id the response cannot carry (a lone surrogate) is refused before the snippet runs."""
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                raise ValueError(f"request_id must be valid UTF-8 text: {e.reason} at index {e.start}") from None
        return value


class RunBatchRequest(BaseModel):
    """``/run_batch``: several ``/run_code`` requests, answered in the same order."""

    requests: list[RunCodeRequest]


MODELS: dict[str, type[BaseModel]] = {"run_code": RunCodeRequest, "run_batch": RunBatchRequest}


def parse_body(kind: str, body: bytes, max_entries: int) -> tuple[int, Any]:
    """(200, the request), (413, why) or (422, pydantic's errors with ``body`` first in each ``loc``).

    A batch of more than ``max_entries`` entries is 413 before any entry is validated.
    """
    try:
        data = json.loads(body)
    except ValueError as e:
        pos = e.pos if isinstance(e, json.JSONDecodeError) else 0
        return 422, [{"type": "json_invalid", "loc": ["body", pos], "msg": "JSON decode error",
                      "ctx": {"error": str(e)}}]
    entries = data.get("requests") if kind == "run_batch" and isinstance(data, dict) else None
    if isinstance(entries, list) and len(entries) > max_entries:  # every entry counts, the refused ones too
        return 413, (f"batch of {len(entries)} entries exceeds the server queue (queue_size={max_entries}); "
                     "split it or raise --queue_size")
    try:
        return 200, MODELS[kind].model_validate(data)
    except ValidationError as e:
        return 422, [{**err, "loc": ["body", *err["loc"]]} for err in e.errors(include_url=False)]


class BodyParser:
    """Parses request bodies: small ones inline, large ones in one separate process (spawned on first use)."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None

    async def parse(self, kind: str, body: bytes, max_entries: int) -> tuple[int, Any]:
        """:func:`parse_body`, off the event loop for a body over :data:`INLINE_BYTES`."""
        if len(body) <= INLINE_BYTES:
            return parse_body(kind, body, max_entries)
        if self._pool is None:
            self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        return await asyncio.get_running_loop().run_in_executor(self._pool, parse_body, kind, body, max_entries)

    def close(self) -> None:
        """Stop the parser process, if one was started."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
