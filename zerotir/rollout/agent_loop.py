"""The tool loop: ZeroTIR's two-phase stop machine over token ids, one state machine per trajectory.

Every trajectory (prompt x sample, a ``rows.Row``) is a request of the engine (``engine.GenerationEngine``) and is in
one of three modes (``rows.Mode``). The markers are those of the call format (``model.tool.format``,
``zerotir.tools.formats``: "```python" / "```" with ``fences``, "<tool_call>" / "</tool_call>" with ``hermes``):

    text  -- generating with stop ``call_start``; on it the trajectory enters a call and is resubmitted at once with
             the closing marker as its stop;
    call  -- generating with stop ``call_end``; on it the call's text is extracted from the decoded text, parsed by
             the format and sent to its tool that moment (``zerotir.tools``: the python tool runs it in the
             sandbox); when the observation is back it is injected in the format's output block and the
             trajectory is resubmitted (its ids + the output: the engine computes only the new ids);
    final -- the call budget is spent: no call stop at all (the closing marker neither), the model finishes in text.

How trajectories are driven is the ``Schedule`` (the ``model.rollout`` group's ``schedule``: ``zerotir.config``):

* "trajectory" (the default): every trajectory runs on its own. The engine decodes whatever is submitted; a
  trajectory that stops leaves at once for the sandbox (or ends) and is
  resubmitted the moment its result is back. Nothing waits for another trajectory.
* "rounds", the synchronous baseline the benchmark measures against: every trajectory not waiting on the sandbox is
  submitted with at most ``tokens_per_call`` new tokens, and the round ends when the last of them returns; code runs
  while the next round generates, and when more trajectories wait on the sandbox than could generate, the loop waits
  for results rather than run a thin round.
* "lockstep", the paper's strict loop: one call per phase for every trajectory, then all code at once.

Token-in / token-out: sampled ids are kept exactly as the engine returned them; only the injected output block is
tokenized. ``action_mask`` is 1 exactly on sampled ids. A trajectory ends on EOS or one of the caller's stop strings
("stop"), or when its response (sampled + injected) reaches the token budget or the context ("length", truncated).
An engine error fails the rollout naming the trajectory (or the running ones, for an error of a whole step); a
sandbox that fails is recorded on its trajectory as a sandbox error, as a failed snippet is.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import closing
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace
from typing import Any, get_args

import torch

from zerotir.config import DEFAULT_TOKENS_PER_CALL, ScheduleKind, ToolConfig
from zerotir.rollout.engine import GenerationEngine, Sample, SamplingParams
from zerotir.rollout.rows import Mode, Row, stops
from zerotir.rollout.sync import run_sync
from zerotir.rollout.tool_block import (
    code_after_start, code_before_end, injection_text, open_block_head, straddling_stop, text_after_end,
    truncate_tokens,
)
from zerotir.rollout.trajectories import to_trajectories
from zerotir.tools.base import (
    STATUS_ERROR, STATUS_INVALID, STATUS_SANDBOX_ERROR, STATUS_TOOL_ERROR, TIMEOUT_STATUSES,
)
from zerotir.tools.formats import CallFormat, call_format
from zerotir.tools.registry import Toolbox, Used
from zerotir.types import FINISH_LENGTH, FINISH_STOP, ToolCall, Trajectories

__all__ = ["Schedule", "ToolConfig", "rollout", "rollout_sync"]

_IO_TURNS = 8  # event-loop turns given to sandbox calls between engine steps (see _let_io_run)
_SEGMENT_SEED = 1_000_003  # a request's seed: params.seed + this x its segment + its trajectory index



@dataclass(frozen=True)
class Schedule:
    """How the tool loop drives the engine (see the module doc)."""

    kind: ScheduleKind = "trajectory"  # the config's ``model.rollout.init_args.schedule``
    tokens_per_call: int = DEFAULT_TOKENS_PER_CALL  # "rounds": tokens per trajectory and round

    def __post_init__(self) -> None:
        kinds = get_args(ScheduleKind)
        if self.kind not in kinds:
            raise ValueError(f"Schedule.kind={self.kind!r} (model.rollout.init_args.schedule): choose one of "
                             + ", ".join(repr(k) for k in kinds))
        if self.tokens_per_call < 1:
            raise ValueError(f"Schedule.tokens_per_call={self.tokens_per_call}: must be >= 1")


@dataclass
class _Run:
    """What the drivers share: the rows, the settings and the callbacks of one rollout."""

    engine: GenerationEngine
    tokenizer: Any
    tools: Toolbox
    fmt: CallFormat
    rows: list[Row]
    params: SamplingParams
    tool: ToolConfig
    truths: list[str]
    timings: dict[str, float] = field(default_factory=lambda: {"generation": 0.0, "sandbox": 0.0})
    on_end: Callable[[int, Row], None] | None = None  # told of each finished trajectory (``rollout``)
    ended: set[int] = field(default_factory=set)  # the trajectories ``on_end`` was told of
    # The rounds resubmit a stopped trajectory only once the round is over: the engine may drop its cache for room
    # (``SamplingParams.evictable``); on its own a trajectory goes on the moment it can and keeps it.
    evictable: bool = False

    def budget(self, row: Row) -> int:
        """The longest response ``row`` may have: the token budget, or what the context leaves after its prompt."""
        return min(self.params.max_new_tokens, self.engine.context_length - len(row.prompt))


async def rollout(
    engine: GenerationEngine,
    tokenizer: Any,
    sandbox: Any,
    prompts: list[list[int]],
    params: SamplingParams,
    tool: ToolConfig,
    ground_truths: list[str] | None = None,
    schedule: Schedule = Schedule(),
    tools: Toolbox | None = None,
    on_end: Callable[[int, Row], None] | None = None,
) -> tuple[Trajectories, dict[str, float]]:
    """Tool-integrated rollouts: ``params.n`` trajectories per prompt.

    Args:
        engine: any ``GenerationEngine``.
        tokenizer: the model's tokenizer (decodes the calls, encodes the injected observations).
        sandbox: with ``tools`` None, the python tool's sandbox client, anything with ``async run(code, *,
            run_timeout=None) -> ExecResult`` (``sandbox.SandboxClient``, a test's scripted one); None where no tool
            needs one. Each call is its own task, sent when its block closes.
        prompts: prompt token ids.
        params: sampling settings; ``n`` samples per prompt. ``params.max_new_tokens`` is the response budget
            (sampled + injected tokens); ``params.stop`` are extra stop strings that end the response (e.g.
            "</answer>"); ``params.seed`` seeds each request (offset by its trajectory and segment).
        tool: the tool-call settings: the call format, the tools (``model.tool``).
        ground_truths: the reference answer of each prompt, copied to its trajectories ("" when None).
        schedule: how the engine is driven.
        tools: the run's started toolbox, built once by the source or engine host that keeps it between rollouts
            (``zerotir.tools.Toolbox``); None, for a one-off rollout (a test, a script): ``tool.tools`` built with
            ``sandbox``, started and closed around this rollout.
        on_end: called on this event loop with each trajectory's index and row the moment it finishes (the in-line
            source scores it then, while the others generate: ``zerotir.rollout.scoring.EarlyScores``).

    Returns:
        The trajectories (prompt i's samples at rows ``i * n .. i * n + n - 1``, ``group_ids`` = i) and wall times in
        seconds: ``generation`` (inside ``engine.step``), ``sandbox`` (waiting for code results with nothing to
        decode; execution hidden behind generation is not counted). ``rewards`` are 0: the source scores the
        batch (``zerotir.rewards.score_trajectories``, the one scoring path of every source; ``on_end`` lets it
        start as trajectories finish).
    """
    _check_inputs(prompts, params, ground_truths)
    truths = ground_truths if ground_truths is not None else [""] * len(prompts)
    if tools is None:  # a one-off rollout: its own toolbox, for this rollout alone
        with closing(Toolbox.build(tool, sandbox)) as own:
            own.start()
            return await rollout(engine, tokenizer, None, prompts, params, tool, ground_truths, schedule, own, on_end)
    fmt = call_format(tool, tokenizer)
    if tool.enabled:
        fmt.check_tools(tools.names)
    run = _Run(engine, tokenizer, tools, fmt, _initial_rows(tokenizer, prompts, params.n, fmt, tool.max_tool_calls),
               params, tool, truths, on_end=on_end, evictable=schedule.kind != "trajectory")
    try:
        if schedule.kind == "trajectory":
            await _run_trajectories(run)
        else:
            await _run_rounds(run, None if schedule.kind == "lockstep" else schedule.tokens_per_call)
        traj = to_trajectories(run.rows, tokenizer, truths)
    finally:  # after an error: nothing stays in the engine or in flight
        for key, row in enumerate(run.rows):
            engine.release(key)
            if row.pending is not None and not row.pending.done():
                row.pending.cancel()
    return traj, run.timings


async def _run_trajectories(run: _Run) -> None:
    """Every trajectory on its own: resubmitted the moment it can go on (see the module doc)."""
    for key in range(len(run.rows)):
        _go_on(run, key)
    while True:
        await _let_io_run()
        for key in _inject_ready(run):
            _go_on(run, key)
        if not run.engine.num_running:
            waiting = [r.pending for r in run.rows if r.pending is not None]
            if not waiting:
                return
            start = time.perf_counter()
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            run.timings["sandbox"] += time.perf_counter() - start
            continue
        for key, sample in _step(run):
            _absorb(run, key, sample)
            _go_on(run, key)


async def _run_rounds(run: _Run, per_call: int | None) -> None:
    """Trajectories step together in rounds of at most ``per_call`` tokens (None: lockstep, one round per phase)."""
    lockstep = per_call is None
    while True:
        await _let_io_run()
        for key in _inject_ready(run):
            if run.rows[key].finish is not None:
                _end(run, key)
        ready = [k for k, r in enumerate(run.rows) if r.finish is None and r.pending is None]
        waiting = [r.pending for r in run.rows if r.pending is not None]
        if waiting and (not ready or lockstep or len(waiting) > len(ready)):
            start = time.perf_counter()
            await asyncio.wait(waiting, return_when=asyncio.ALL_COMPLETED if lockstep else asyncio.FIRST_COMPLETED)
            run.timings["sandbox"] += time.perf_counter() - start
            continue
        if not ready:
            return
        for key in ready:
            _submit(run, key, per_call)
        finished: list[tuple[Hashable, Sample]] = []
        while run.engine.num_running:
            finished += _step(run)
            await asyncio.sleep(0)  # a shared engine (fleet.hub): the other loops submit and take theirs too
        for key, sample in finished:
            _absorb(run, key, sample)
            row = run.rows[key]
            if row.finish is not None:
                _end(run, key)
            elif row.call_text is not None:
                _send_call(run, row)


def _go_on(run: _Run, key: int) -> None:
    """Whatever trajectory ``key`` does next: end, send its call, or generate its next segment."""
    row = run.rows[key]
    if row.finish is not None:
        _end(run, key)
    elif row.call_text is not None:
        _send_call(run, row)
    elif row.pending is None and not row.in_engine:
        _submit(run, key, None)


def _submit(run: _Run, key: int, per_call: int | None) -> None:
    """Submit trajectory ``key``'s next segment: its ids so far, its mode's stops, the room it has left."""
    row, params = run.rows[key], run.params
    ids = row.prompt + row.response.ids
    room = run.budget(row) - len(row.response)
    if room < 1:  # the context is full: the trajectory is cut there
        row.finish = FINISH_LENGTH
        _end(run, key)
        return
    row.limit = room if per_call is None else min(per_call, room)
    seed = None if params.seed is None else params.seed + _SEGMENT_SEED * row.segments + key
    request = replace(params, n=1, seed=seed, max_new_tokens=row.limit, stop=stops(row.mode, run.fmt, params.stop),
                      evictable=run.evictable)
    try:
        run.engine.submit(key, ids, request)
    except Exception as exc:
        raise RuntimeError(f"rollout: the engine refused trajectory {key} (prompt {row.group}, segment "
                           f"{row.segments}, {len(ids)} ids): {type(exc).__name__}: {exc}") from exc
    row.in_engine, row.segments = True, row.segments + 1


def _step(run: _Run) -> list[tuple[Hashable, Sample]]:
    """One engine step, timed; an engine error names the trajectories that were running."""
    start = time.perf_counter()
    try:
        finished = run.engine.step()
    except Exception as exc:
        running = [k for k, r in enumerate(run.rows) if r.in_engine]
        raise RuntimeError(f"rollout: the engine failed while decoding trajectories {running}: "
                           f"{type(exc).__name__}: {exc}") from exc
    run.timings["generation"] += time.perf_counter() - start
    for key, _ in finished:
        if not (isinstance(key, int) and 0 <= key < len(run.rows) and run.rows[key].in_engine):
            raise RuntimeError(f"rollout: the engine returned request {key!r}, which is not a running trajectory")
        run.rows[key].in_engine = False
    return finished


def _end(run: _Run, key: int) -> None:
    """Trajectory ``key`` has finished: the engine forgets it, and ``on_end`` is told (once)."""
    run.engine.release(key)
    if run.on_end is not None and key not in run.ended:
        run.ended.add(key)
        run.on_end(key, run.rows[key])


def _send_call(run: _Run, row: Row) -> None:
    """Send the trajectory's call to its tool now, without waiting for it."""
    row.running, row.call_text = row.call_text, None
    row.pending = asyncio.ensure_future(run.tools.run(run.fmt.parse(row.running)))  # never raises (Toolbox.run)


async def _let_io_run() -> None:
    """Give the sandbox calls in flight a few turns of the event loop: enough to write new
    requests and read the answers that came back. The server runs the code while this thread generates (its own
    processes); the client's Python work happens here, between engine steps. (A client thread running during
    generation was measured 2-5x slower for both: the two threads fight over the GIL on every small torch op.)"""
    for _ in range(_IO_TURNS):
        await asyncio.sleep(0)


def rollout_sync(*args: Any, **kwargs: Any) -> tuple[Trajectories, dict[str, float]]:
    """``rollout`` for synchronous callers (the trainer): same arguments, same result, on this thread's one event
    loop (``zerotir.rollout.sync.run_sync``: the sandbox client's connection pool is reused between steps).

    Raises:
        RuntimeError: when called from a running event loop (it would block it); ``await rollout(...)`` there.
    """
    return run_sync(rollout(*args, **kwargs), "rollout_sync (await rollout(...) there)")


def _check_inputs(prompts: list[list[int]], params: SamplingParams, ground_truths: list[str] | None) -> None:
    if not prompts:
        raise ValueError("rollout: `prompts` is empty; pass at least one prompt (token ids)")
    params.validate("rollout: params")
    if ground_truths is not None and len(ground_truths) != len(prompts):
        raise ValueError(f"rollout: {len(ground_truths)} ground_truths for {len(prompts)} prompts; pass one per "
                         "prompt (or None)")


def _initial_rows(tokenizer: Any, prompts: list[list[int]], n: int, fmt: CallFormat, max_calls: int) -> list[Row]:
    """``n`` rows per prompt; a prompt that ends inside an opened call starts in the call phase."""
    rows = []
    for group, prompt in enumerate(prompts):
        head, mode = None, Mode.FINAL
        if max_calls > 0:
            head = open_block_head(tokenizer.decode(prompt, skip_special_tokens=True), fmt.call_start, fmt.call_end)
            mode = Mode.TEXT if head is None else Mode.CALL
        rows += [Row(group, list(prompt), mode, head) for _ in range(n)]
    return rows


def _absorb(run: _Run, key: int, sample: Sample) -> None:
    """Append a sample's ids to trajectory ``key`` and move its state machine."""
    row, fmt, tokenizer = run.rows[key], run.fmt, run.tokenizer
    if len(sample.token_ids) > row.limit or len(sample.logprobs) != len(sample.token_ids):
        raise RuntimeError(f"rollout: the engine returned {len(sample.token_ids)} ids and {len(sample.logprobs)} "
                           f"log-probs for trajectory {key}, asked for at most {row.limit} ids with one log-prob each")
    boundary = len(row.response)
    row.response.append_sampled(sample.token_ids, sample.logprobs, sample.version)
    reason, stop = sample.finish_reason, sample.stop_str
    if boundary > row.mode_start:  # this mode's text came from several rounds: a stop may span the last boundary
        hit = straddling_stop(tokenizer, row.response.ids, row.mode_start, boundary,
                              stops(row.mode, fmt, run.params.stop))
        if hit is not None:  # end the segment where the stop ends; later samples are dropped, as if never drawn
            (cut, stop), reason = hit, "stop"
            row.response.truncate(cut)
    full = len(row.response) >= run.budget(row)
    if reason == "eos":
        row.finish = FINISH_STOP
    elif reason == "length":  # the budget or the context; else only this round's limit: go on in the same mode
        if full:
            row.finish = FINISH_LENGTH
    elif row.mode is Mode.TEXT and stop == fmt.call_start:
        row.mode, row.block_from, row.mode_start, row.head = Mode.CALL, row.mode_start, len(row.response), None
    elif row.mode is Mode.CALL and stop == fmt.call_end:
        text = tokenizer.decode(row.response.ids[row.block_from :], skip_special_tokens=True)
        block = row.head + text if row.head is not None else code_after_start(text, fmt.call_start)
        row.call_text, row.tail = code_before_end(block, fmt.call_end), text_after_end(block, fmt.call_end)
    else:  # one of the caller's stop strings
        row.finish = FINISH_STOP
    if row.finish is None and full:  # a phase stop at the budget: no room to go on
        row.finish, row.call_text = FINISH_LENGTH, None


def _inject_ready(run: _Run) -> list[int]:
    """Inject every observation that is back; returns the trajectories that got one."""
    done = []
    for key, row in enumerate(run.rows):
        if row.pending is not None and row.pending.done():
            used, row.pending = row.pending.result(), None
            _inject(run, row, used)
            done.append(key)
    return done


def _inject(run: _Run, row: Row, used: Used) -> None:
    """Count one call and append its rendered observation (action 0), cut at the budget. ``exec_errors`` counts the
    model's faults (code that raised, an invalid call), ``sandbox_errors`` and ``tool_errors`` the infrastructure's
    (the sandbox failed to run the code; a tool raised)."""
    tool, tokenizer, budget = run.tool, run.tokenizer, run.budget(row)
    row.calls += 1
    status = used.observation.status
    row.exec_errors += status in (STATUS_ERROR, STATUS_INVALID)
    row.timeouts += status in TIMEOUT_STATUSES
    row.sandbox_errors += status == STATUS_SANDBOX_ERROR
    row.tool_errors += status == STATUS_TOOL_ERROR
    output = used.observation.text
    if tool.max_output_tokens is not None:
        output = truncate_tokens(output, tokenizer, tool.max_output_tokens)
    row.tool_calls.append(ToolCall(row.running, status, output, used.tool, used.seconds))
    text = injection_text(run.fmt.render(output), row.tail)
    injected = tokenizer.encode(text, add_special_tokens=False)
    room = budget - len(row.response)
    row.response.append_injected(injected[:room])
    row.head, row.tail = None, ""
    row.mode = Mode.TEXT if row.calls < tool.max_tool_calls else Mode.FINAL
    row.mode_start = row.block_from = len(row.response)
    if len(injected) >= room:
        row.finish = FINISH_LENGTH
