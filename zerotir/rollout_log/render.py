"""Showing rollout records: as Markdown for TensorBoard's text panel, and coloured in a terminal (rich).

Both read the records of ``zerotir.rollout_log.records``; the response is split into its text, code and output parts
(``records.segments``), so code and tool output show as blocks of their own. The k-th output block of a response is
the result of its k-th call (``tool_calls[k]``), labelled with its tool's name and coloured by its status; the
headline names the tools called, so a format whose calls are not fenced blocks still shows which tool ran.

A record with its tokens (``zerotir.rollout_log.tokens``) can be shown token by token under an overlay
(``OVERLAYS``): each token's background says its log-prob, entropy, engine/trainer mismatch, loss weight or weight
version, as the web viewer's overlays do.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from zerotir.rollout_log.records import FAILED_STATUSES, has_failed_call, segments, summary, tool_of

_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>#|])")
OVERLAYS = ("logprob", "entropy", "mismatch", "weight", "version")
_HUES = {"logprob": (229, 57, 53), "entropy": (142, 36, 170), "mismatch": (245, 124, 0), "weight": (67, 160, 71),
         "version": (30, 136, 229)}


def pick_samples(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """A few telling trajectories of a step: ``best`` (highest reward, then shortest), ``worst`` (lowest reward,
    then longest) and ``exec_error`` (the first one with a failed execution that is neither of those, if any)."""
    if not records:
        return {}
    best = max(records, key=lambda r: (r["reward"], -r["response_tokens"]))
    worst = min(records, key=lambda r: (r["reward"], -r["response_tokens"]))
    picked = {"best": best}
    if worst is not best:
        picked["worst"] = worst
    failed = [r for r in records if has_failed_call(r)]
    rest = [r for r in failed if r is not best and r is not worst]
    if failed:
        picked["exec_error"] = (rest or failed)[0]
    return picked


def _escape(text: str) -> str:
    """Markdown-escaped text with its line breaks kept (a trailing double space breaks a Markdown line)."""
    return "  \n".join(_MD_SPECIAL.sub(r"\\\1", line) for line in text.split("\n"))


def _fenced(text: str, lang: str = "") -> str:
    fence = "````" if "```" in text else "```"
    return f"{fence}{lang}\n{text}\n{fence}"


def _output_label(call: dict[str, Any] | None) -> str:
    """``<tool> output (<status>)`` for an output block; ``output (?)`` when no recorded call matches it."""
    return f"{tool_of(call)} output ({call['status']})" if call is not None else "output (?)"


def headline(record: dict[str, Any]) -> str:
    """One line on a trajectory: reward, verdict, calls (per tool), finish reason, length, and the filters that
    removed it."""
    failed = sum(c["status"] in FAILED_STATUSES for c in record["tool_calls"])
    tools = Counter(tool_of(c) for c in record["tool_calls"])
    per_tool = f" ({', '.join(f'{tool} {n}' for tool, n in tools.items())})" if tools else ""
    verdict = "correct" if record["correct"] else "wrong"
    removed = record.get("filtered_by") or []  # absent from dumps written before the trajectory filters
    return (f"reward {record['reward']:g} ({verdict}) | {record['calls']} call(s){per_tool}, {failed} failed | "
            f"finish {record['finish_reason']} | {record['response_tokens']} tokens"
            + (f" | filtered by {', '.join(removed)}" if removed else ""))


def markdown_sample(record: dict[str, Any], title: str = "") -> str:
    """One trajectory as Markdown: a headline, the answer against the reference, the prompt, then the response
    with its code blocks as ``python`` and its outputs as ``text`` blocks (each labelled with its tool and status)."""
    lines = [f"**{title}** | " if title else "", headline(record), "\n\n",
             f"problem `{record['problem_id']}` | answer `{record['answer']}` | reference `{record['reference']}`",
             "\n\n**prompt**\n\n", _fenced(record["prompt"], "text"), "\n\n**response**\n\n"]
    calls = iter(record["tool_calls"])
    for kind, text in segments(record["response"]):
        if kind == "text":
            lines.append(_escape(text.strip("\n")) + "\n\n")
        elif kind == "code":
            lines.append(_fenced(text, "python") + "\n\n")
        else:
            call = next(calls, None)
            lines.append(f"*{_output_label(call)}*\n\n" + _fenced(text, "text") + "\n\n")
    return "".join(lines).rstrip() + "\n"


def summary_line(step: int, records: Sequence[dict[str, Any]]) -> str:
    """``step k | n trajectories | accuracy | tool-call rate | calls | failed calls | tokens | truncated``."""
    s = summary(records)
    if not s["trajectories"]:
        return f"step {step} | 0 trajectories"
    return (f"step {step} | {s['trajectories']} trajectories | accuracy {s['accuracy']:.2f} | tool "
            f"calls {s['tool_call_rate']:.2f} | calls/response {s['calls_per_response']:.2f} | failed calls "
            f"{s['failed_call_rate']:.2f} | {s['response_tokens']:.1f} tokens | truncated {s['truncated']:.2f}")


def rich_trajectory(record: dict[str, Any]) -> Any:
    """A rich renderable of one trajectory: headline, prompt (dim), text, code (syntax-highlighted) and output
    panels (yellow, red when the execution failed), and the answer against the reference (green / red)."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.syntax import Syntax
    from rich.text import Text

    ok = bool(record["correct"])
    head = Text.assemble((f"#{record['index']} ", "bold"), (f"{record['problem_id']}  ", "cyan"),
                         (headline(record), "bold green" if ok else "bold red"))
    parts: list[Any] = [head, Text(record["prompt"].rstrip("\n"), style="dim")]
    calls = iter(record["tool_calls"])
    for kind, text in segments(record["response"]):
        if kind == "text":
            parts.append(Text(text.strip("\n")))
        elif kind == "code":
            parts.append(Panel(Syntax(text, "python", theme="ansi_dark", background_color="default"),
                               title="code", title_align="left", border_style="blue"))
        else:
            call = next(calls, None)
            failed = call is not None and call["status"] in FAILED_STATUSES
            parts.append(Panel(Text(text, style="red" if failed else "yellow"), title=_output_label(call),
                               title_align="left", border_style="red" if failed else "yellow"))
    answer = Text.assemble(("answer ", "bold"), (str(record["answer"]), "bold green" if ok else "bold red"),
                           ("   reference ", "bold"), (str(record["reference"]), "green"))
    parts.append(answer)
    return Group(*parts)


def overlay_strength(tokens: dict[str, Any], i: int, overlay: str, max_version: int = 0) -> float | None:
    """How strongly token ``i`` is coloured under ``overlay`` (0..1; None: no value there): log-prob from 0 to -5
    (the trainer's, else the engine's), entropy from 0 to 3 nats, |trainer - engine| from 0 to 0.5, loss weight 0 or
    1, and staleness (``max_version`` - version + 1, over 4)."""
    engine = tokens["engine_logprob"][i]
    trainer = tokens["trainer_logprob"][i] if tokens["trainer_logprob"] else None
    if overlay == "logprob":
        value = trainer if trainer is not None else engine
        return None if value is None else min(-value / 5, 1.0)
    if overlay == "entropy":
        value = tokens["entropy"][i] if tokens["entropy"] else None
        return None if value is None else min(value / 3, 1.0)
    if overlay == "mismatch":
        return None if engine is None or trainer is None else min(abs(trainer - engine) / 0.5, 1.0)
    if overlay == "weight":
        return float(tokens["loss_weight"][i])
    if overlay == "version":
        value = tokens["weight_version"][i] if tokens["weight_version"] else None
        return None if value is None else min((max_version - value + 1) / 4, 1.0)
    raise ValueError(f"overlay {overlay!r}: choose one of {OVERLAYS}")


def rich_tokens(record: dict[str, Any], overlay: str) -> Any:
    """The response of a record with tokens, token by token on a background of ``overlay``'s colour (the prompt
    dim, tool calls blue, tool outputs yellow, all uncoloured where the token has no value)."""
    from rich.text import Text

    tokens = record["tokens"]
    versions = [v for v in tokens["weight_version"] or [] if v is not None]
    top = max(versions, default=0)
    red, green, blue = _HUES[overlay]
    text = Text()
    for i, (piece, span) in enumerate(zip(tokens["pieces"], tokens["span"])):
        style = {"prompt": "dim", "call": "blue", "output": "yellow", "answer": "bold"}.get(span, "")
        strength = overlay_strength(tokens, i, overlay, top)
        if strength is not None:
            mix = [int(255 - (255 - c) * (0.15 + 0.85 * strength)) for c in (red, green, blue)]
            style = f"{style} on rgb({mix[0]},{mix[1]},{mix[2]})".strip()
        text.append(piece, style=style or None)
    return text
