"""The result type of one execution, how a ``/run_code`` response becomes one, and how it is shown to the model."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any


class ExecStatus(str, enum.Enum):
    """How an execution ended."""

    OK = "ok"  #: ran to completion with exit code 0
    ERROR = "error"  #: raised, exited non-zero, had a syntax error or was refused by the static check
    TIMEOUT = "timeout"  #: killed at the wall-time limit
    MEMORY = "memory"  #: ran out of its memory budget
    KILLED = "killed"  #: died of a signal (CPU-time limit, segfault, ...)
    SANDBOX_ERROR = "sandbox_error"  #: the service could not run it (unreachable, overloaded): not the code's fault


@dataclass
class ExecResult:
    """One execution.

    Attributes:
        status: How it ended.
        stdout: Captured standard output (capped by the server, with a marker where the middle was dropped).
        stderr: Captured standard error (tracebacks), or the reason for a SANDBOX_ERROR.
        elapsed: Seconds the snippet ran, as measured by the sandbox (the client's round trip when it gave none).
        return_code: Exit code; negative for a signal; None when the snippet never ran.
        wall_time: Seconds of the whole client call: queueing, retries and HTTP included.
        limits_hit: The limits the snippet ran into, as this server reports them (``time``, ``memory``, ``pids``,
            ``cpu``); empty from a SandboxFusion server.
    """

    status: ExecStatus
    stdout: str
    stderr: str
    elapsed: float
    return_code: int | None = None
    wall_time: float = 0.0
    limits_hit: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True when the snippet ran to completion with exit code 0."""
        return self.status is ExecStatus.OK


_MEMORY_LINE = re.compile(r"^[\w.]*MemoryError\b")


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def parse_run_code_response(payload: dict[str, Any], wall_time: float) -> ExecResult:
    """Build an :class:`ExecResult` from a ``/run_code`` response of this server or of a real SandboxFusion.

    SandboxFusion: ``status`` Success | Failed | SandboxError; ``run_result.status`` Finished | TimeLimitExceeded |
    Error. This server adds ``details.reason`` (ok, error, refused, timeout, memory, signal), used when present.
    """
    status = payload.get("status")
    run = payload.get("run_result")
    if status == "SandboxError" or not isinstance(run, dict):
        message = payload.get("message") or f"sandbox returned status {status!r} without a run_result"
        return ExecResult(ExecStatus.SANDBOX_ERROR, "", str(message), wall_time, None, wall_time)
    stdout, stderr = run.get("stdout") or "", run.get("stderr") or ""
    return_code = run.get("return_code")
    elapsed = run.get("execution_time")
    elapsed = float(elapsed) if elapsed is not None else wall_time
    details = payload.get("details") or {}
    reason = details.get("reason")
    if run.get("status") == "TimeLimitExceeded" or reason == "timeout":
        kind = ExecStatus.TIMEOUT
    elif status == "Success":  # exit code 0, whatever its stderr says (a snippet may print "MemoryError" itself)
        kind = ExecStatus.OK
    elif reason == "memory" or (reason is None and _MEMORY_LINE.match(_last_line(stderr))):
        kind = ExecStatus.MEMORY
    elif reason == "signal" or (isinstance(return_code, int) and return_code < 0):
        kind = ExecStatus.KILLED
    else:
        kind = ExecStatus.ERROR
    return ExecResult(kind, stdout, stderr, elapsed, return_code, wall_time, tuple(details.get("limits_hit") or ()))


# --- formatting for the model ---------------------------------------------------------------------------------------

_PACKAGE_PREFIX = re.compile(r"(?:/[^\s\"':]+)*/(?:site|dist)-packages/")
_STDLIB_PREFIX = re.compile(r"(?:/[^\s\"':]+)*/lib/python3\.\d+/")
_FILE_PATH = re.compile(r'File "(/[^"]*/)([^"/]+)"')
_FRAME = re.compile(r'^  File "([^"]+)", line \d+')

_MESSAGES = {
    ExecStatus.TIMEOUT: "TimeoutError: the code did not finish within the time limit and was stopped.",
    ExecStatus.MEMORY: "MemoryError: the code exceeded the memory limit.",
    ExecStatus.SANDBOX_ERROR: "The code could not be run: the code interpreter is unavailable.",
}


def strip_server_paths(text: str) -> str:
    """Remove server file-system paths: ``.../site-packages/sympy/x.py`` -> ``sympy/x.py``, others -> basename."""
    text = _PACKAGE_PREFIX.sub("", text)
    text = _STDLIB_PREFIX.sub("", text)
    return _FILE_PATH.sub(r'File "\2"', text)


def reduce_traceback(stderr: str) -> str:
    """Keep what the model can use: the snippet's last frame, the frame that raised, and the exception lines.

    Text that is not a traceback (a SyntaxError report, a warning, a refusal) is returned unchanged.
    """
    header = "Traceback (most recent call last):"
    start = stderr.rfind(header)
    if start < 0:
        return stderr.strip("\n")
    lines = stderr[start + len(header):].strip("\n").splitlines()
    frames: list[list[str]] = []
    rest: list[str] = []
    for line in lines:
        if _FRAME.match(line):
            frames.append([line])
        elif frames and not rest and line.startswith("    "):
            frames[-1].append(line)
        else:
            rest.append(line)
    if not frames:
        return stderr[start:].strip("\n")
    snippet_file = _FRAME.match(frames[0][0]).group(1)
    own = [f for f in frames if _FRAME.match(f[0]).group(1) == snippet_file]
    kept = [own[-1]] if own else []
    if frames[-1] is not (own[-1] if own else None):
        kept.append(frames[-1])
    body = [line for frame in kept for line in frame]
    return "\n".join([header, *body, *rest])


_CARETS = re.compile(r"^ *[~^]+[~^ ]*$")
# A source line in a traceback or syntax error report longer than this is cut to a window around its caret.
MAX_SOURCE_LINE = 120


def shorten_source_lines(report: str, max_line: int = MAX_SOURCE_LINE) -> str:
    """Cut source lines longer than ``max_line`` in a traceback or syntax error report (Python echoes the whole
    line: hundreds of characters when a model writes prose in a code block), keeping the window around the caret
    line's mark (or the line's head when there is none) with ``...`` where text was cut; the caret line is moved
    to match.
    """
    lines = report.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        carets = lines[i + 1] if i + 1 < len(lines) and _CARETS.match(lines[i + 1]) else None
        if len(line) <= max_line or _FRAME.match(line):
            out.append(line)
            i += 1
            continue
        indent = len(line) - len(line.lstrip(" "))
        mark = len(carets) - len(carets.lstrip(" ")) if carets is not None else indent
        start = max(indent, mark - max_line // 2)
        end = min(len(line), start + max_line - indent)
        head = line[:indent] + ("..." if start > indent else "")
        out.append(head + line[start:end] + ("..." if end < len(line) else ""))
        if carets is not None:
            out.append(" " * (len(head) + mark - start) + carets.lstrip(" ")[: max(1, end - mark)])
            i += 1
        i += 1
    return "\n".join(out)


def truncate_middle(text: str, max_chars: int) -> str:
    """Head and tail of ``text`` with a marker in between, at most ``max_chars`` characters in all."""
    if len(text) <= max_chars:
        return text
    marker = f"\n... [{len(text)} characters in all, the middle omitted] ...\n"
    budget = max(0, max_chars - len(marker))
    head = budget // 2
    return text[:head] + marker + text[len(text) - (budget - head):]


def format_for_model(result: ExecResult, max_chars: int | None = 1024) -> str:
    """The text that goes inside the model's ```output block.

    stdout, then (for a failure) the traceback reduced to its useful last lines with server paths removed and long
    source lines cut around their caret, then a
    clear sentence for a timeout, memory or sandbox error; head and tail with a marker when longer than ``max_chars``
    (None: whole, for a caller that caps it itself; the server already bounds each stream at ``max_output_bytes``).
    """
    if max_chars is not None and max_chars < 80:
        raise ValueError(f"max_chars must be >= 80 so a message and the truncation marker fit, got {max_chars}")
    parts = [result.stdout.rstrip("\n")]
    if result.status is ExecStatus.SANDBOX_ERROR:
        parts = [_MESSAGES[result.status]]
    elif result.status in (ExecStatus.ERROR, ExecStatus.KILLED) or (result.status is ExecStatus.OK and result.stderr):
        parts.append(shorten_source_lines(reduce_traceback(strip_server_paths(result.stderr))))
        if result.status is ExecStatus.ERROR and not result.stderr.strip():
            parts.append(f"The code exited with code {result.return_code}.")
        if result.status is ExecStatus.KILLED:
            code = result.return_code
            parts.append(f"Killed: the process was terminated{f' by signal {-code}' if code and code < 0 else ''}.")
    else:
        parts.append(_MESSAGES.get(result.status, ""))
    text = "\n".join(p for p in parts if p)
    return text if max_chars is None else truncate_middle(text, max_chars)
