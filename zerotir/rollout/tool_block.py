"""Text side of a tool call: the tool config, finding the code of a block, and the block injected back.

The tool loop (``agent_loop``) works on token ids; this module holds the few string rules it needs, each a pure
function tested on its own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

# ExecStatus values (sandbox.result.ExecStatus is a str enum): compared by value so any duck-typed sandbox works.
STATUS_OK, STATUS_ERROR, STATUS_SANDBOX_ERROR = "ok", "error", "sandbox_error"
TIMEOUT_STATUSES = ("timeout", "memory", "killed")


@dataclass
class ToolConfig:
    """How the model calls the code interpreter during a rollout.

    Args:
        max_tool_calls: N_max, code blocks executed per response; after the cap the code stops are removed and the
            model must finish in text (the paper allows 20).
        max_response_tokens: total response budget, sampled + injected tokens; reaching it truncates the response
            (finish reason "length", reward 0).
        max_output_chars: the injected output is cut to this many characters (head + tail with a marker) by
            ``sandbox.format_for_model``.
        max_output_tokens: then cut to this many tokens of the model's tokenizer (head + tail with a marker): a
            character cap does not bound tokens (Qwen2.5 spends one token per digit of a printed number). The
            paper's public code replaces results longer than 256 tokens by a short message; ToRL keeps head and
            tail. None = characters only.
        code_start: the stop string that opens a code block (first phase).
        code_end: the stop string that closes it (second phase).
        output_template: the injected block; ``{output}`` is replaced by the formatted result.
        run_timeout: wall-time limit of one execution, seconds.
        tokens_per_call: generation is cut into engine calls (rounds) of at most this many tokens per row, and an
            engine that can pause ends a round once three quarters of its rows have stopped, so that a row whose
            code has run rejoins the batch at the next round instead of waiting for the slowest row of a phase,
            while code runs as the other rows generate. None = one call per phase, then all code at once (the
            paper's strict lockstep). 32 measured best on CPU with a tiny model (benchmarks/rollout_overhead.py);
            long GPU rollouts may prefer a few hundred (fewer, larger calls).
        continuous: with an engine that has a decode session (``HFEngine``; not vLLM, which schedules its own
            batch) and ``tokens_per_call`` set, decode the whole rollout as one continuously batched session: a row
            leaves the batch at the end of a code block and rejoins, its keys / values in place, once the result
            is injected. Rounds and ``tokens_per_call`` then do not apply. Measured on 2 CPU cores
            (benchmarks/rollout_overhead.py, tool-loop tokens/s over plain decoding of the same tokens, real
            sandbox): ZeroTIR-shaped responses 0.89 against 0.65 with rounds at the toy world's model size, 0.73
            against 0.57 with the 0.16M-parameter model; short tool-dense ones (a call every ~60 tokens) 0.40
            either way; the toy world's rollouts take as long either way (0.41 s).
            Default True; False = rounds.
    """

    max_tool_calls: int = 20
    max_response_tokens: int = 1024
    max_output_chars: int = 1024
    max_output_tokens: int | None = 256
    code_start: str = "```python"
    code_end: str = "```"
    output_template: str = "\n```output\n{output}\n```\n"
    run_timeout: float = 5.0
    tokens_per_call: int | None = 32
    continuous: bool = True

    def __post_init__(self) -> None:
        if self.max_tool_calls < 0:
            raise ValueError(f"ToolConfig.max_tool_calls must be >= 0 (0 = no tool), got {self.max_tool_calls}")
        if self.max_response_tokens < 1:
            raise ValueError(f"ToolConfig.max_response_tokens must be >= 1, got {self.max_response_tokens}")
        if self.max_output_chars < 80:
            raise ValueError(f"ToolConfig.max_output_chars must be >= 80 (room for a message and the truncation "
                             f"marker), got {self.max_output_chars}")
        if self.max_output_tokens is not None and self.max_output_tokens < 32:
            raise ValueError(f"ToolConfig.max_output_tokens must be >= 32 (room for a message and the truncation "
                             f"marker) or None, got {self.max_output_tokens}")
        if not self.code_start or not self.code_end:
            raise ValueError("ToolConfig.code_start and code_end must be non-empty stop strings")
        if "{output}" not in self.output_template:
            raise ValueError(f"ToolConfig.output_template must contain '{{output}}', got {self.output_template!r}")
        if self.run_timeout <= 0:
            raise ValueError(f"ToolConfig.run_timeout must be > 0 seconds, got {self.run_timeout}")
        if self.tokens_per_call is not None and self.tokens_per_call < 1:
            raise ValueError(f"ToolConfig.tokens_per_call must be >= 1 or None, got {self.tokens_per_call}")


def open_block_head(prompt_text: str, code_start: str, code_end: str) -> str | None:
    """The code already written when ``prompt_text`` ends inside an open code block, else None.

    A prompt may end with an opened block (e.g. "...```python\\n" to force a tool call); the loop then starts in the
    code phase and this text is the beginning of the code.
    """
    at = prompt_text.rfind(code_start)
    if at < 0:
        return None
    head = prompt_text[at + len(code_start) :]
    return None if code_end in head else head


def code_after_start(segment_text: str, code_start: str) -> str:
    """The text after the first ``code_start`` of a sampled segment (what the model wrote inside the new block)."""
    at = segment_text.find(code_start)
    if at < 0:  # the engine reported the stop, so it is there; a mismatch means a decoding bug: say so
        raise ValueError(f"code_start {code_start!r} not found in the segment that stopped on it: {segment_text!r}")
    return segment_text[at + len(code_start) :]


def code_before_end(block_text: str, code_end: str) -> str:
    """The code of a block: ``block_text`` (what follows ``code_start``) up to the first ``code_end``."""
    at = block_text.find(code_end)
    return block_text if at < 0 else block_text[:at]


def straddling_stop(
    tokenizer: Any, ids: list[int], start: int, boundary: int, stops: list[str]
) -> tuple[int, str] | None:
    """A stop string the engine could not see because it spans two calls.

    An engine matches stop strings on the text it generated in the current call only. When a row's segment
    (``ids[start:]``, one mode) was generated by several calls, a stop that began before ``boundary`` (the first id
    of the latest call) and ended after it went unnoticed. Returns ``(k, stop)`` where ``ids[:k]`` ends with the
    token that completes the earliest stop ending after the boundary (within a stop's length of it; one wholly in
    the new call is found where the engine found it), or None.
    """
    if not stops:
        return None
    width = max(len(s.encode()) for s in stops) + 2  # tokens that can hold a stop, as in HFEngine
    low = max(start, boundary - width)
    before = tokenizer.decode(ids[low:boundary], skip_special_tokens=True)
    stops = [s for s in stops if s not in before]  # already complete before the boundary: not this call's stop
    for k in range(boundary + 1, min(len(ids), boundary + width) + 1):
        text = tokenizer.decode(ids[low:k], skip_special_tokens=True)
        hit = next((s for s in stops if s in text), None)
        if hit is not None:
            return k, hit
    return None


def status_of(result: Any) -> str:
    """The status value ("ok", "error", "timeout", ...) of an ``ExecResult``-like object."""
    status = result.status
    return str(getattr(status, "value", status))


def format_result(result: Any, tool: ToolConfig, tokenizer: Any = None) -> str:
    """The injected text for one execution: ``tool.output_template`` around ``format_output``."""
    return tool.output_template.format(output=format_output(result, tool, tokenizer))


def format_output(result: Any, tool: ToolConfig, tokenizer: Any = None) -> str:
    """What goes inside the output block: ``sandbox.format_for_model``, cut to ``tool.max_output_tokens`` tokens of
    ``tokenizer`` when both are given."""
    from sandbox.result import format_for_model

    output = format_for_model(result, tool.max_output_chars)
    if tokenizer is not None and tool.max_output_tokens is not None:
        output = truncate_tokens(output, tokenizer, tool.max_output_tokens)
    return output


def truncate_tokens(text: str, tokenizer: Any, max_tokens: int) -> str:
    """Head and tail of ``text`` with a marker in between, about ``max_tokens`` tokens in all (exactly, unless the
    tokenizer merges across the cuts)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) <= max_tokens:
        return text
    marker = f"\n... [{len(ids)} tokens in all, the middle omitted] ...\n"
    room = max(2, max_tokens - len(tokenizer.encode(marker, add_special_tokens=False)))
    head = room // 2
    return tokenizer.decode(ids[:head]) + marker + tokenizer.decode(ids[len(ids) - (room - head):])


def failed_call_result(error: BaseException) -> Any:
    """A SANDBOX_ERROR result for a sandbox call that raised (the client is meant to return one instead).

    The model sees the same message as for any unavailable interpreter; the call is counted as a sandbox error,
    which the trainer's guard watches, and the exception is logged.
    """
    from sandbox.result import ExecResult, ExecStatus

    log.warning("sandbox call raised %s: %s (counted as a sandbox error)", type(error).__name__, error)
    return ExecResult(ExecStatus.SANDBOX_ERROR, "", f"{type(error).__name__}: {error}", 0.0)
