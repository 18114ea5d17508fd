"""The tool loop: ZeroTIR's two-phase stop machine over token ids.

Every row (prompt x sample) is in one of three modes:

    text  -- generating with stop ``code_start`` ("```python"); on it the row enters a code block;
    code  -- generating with stop ``code_end`` (the closing fence); on it the block's code is extracted from the
             decoded text and sent to the sandbox; the formatted result is injected as an ```output block;
    final -- the call budget is spent: no code stop at all (the closing fence neither), the model finishes in text.

How rows are driven is the ``Schedule`` (the ``model.rollout`` group's ``schedule``: ``zerotir.config``).

With "rounds", all rows step together: a round is one ``engine.generate`` call for every row not waiting on the
sandbox, each row with its own stops and at most ``schedule.tokens_per_call`` new tokens (an engine that can pause
ends the round early once three quarters of its rows have stopped). A row that closes a block has its code sent to the sandbox,
which runs it while the other rows generate, and rejoins the next round once its result is injected; when more rows
wait on the sandbox than could generate, the loop waits for results rather than run a thin batch.
"lockstep" is the paper's strict loop: one call per phase, then all code at once.

With "continuous" (engines with a decode session: ``HFEngine.session``), there are no rounds: one
session decodes the whole rollout, a row leaves the batch when it closes a block and rejoins, its keys / values in
place, as soon as its result is injected (continuous batching; see ``hf_session``).

Token-in / token-out: sampled ids are kept exactly as the engine returned them; only the injected output block is
tokenized. ``action_mask`` is 1 exactly on sampled ids. A row ends on EOS or one of the caller's stop strings ("stop"),
or when its response (sampled + injected) reaches the token budget ("length", truncated).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from zerotir.rollout.engine import RolloutEngine, Sample, SamplingParams
from zerotir.config import DEFAULT_TOKENS_PER_CALL, ToolConfig
from zerotir.rollout.sync import run_sync
from zerotir.rollout.tool_block import (
    STATUS_ERROR, STATUS_SANDBOX_ERROR, TIMEOUT_STATUSES, code_after_start, code_before_end,
    failed_call_result, format_output, open_block_head, status_of, straddling_stop,
)
from zerotir.rollout.trajectories import to_trajectories
from zerotir.types import FINISH_LENGTH, FINISH_STOP, ToolCall, Trajectories

__all__ = ["Schedule", "ToolConfig", "rollout", "rollout_sync"]

TEXT, CODE, FINAL = "text", "code", "final"
_IO_TURNS = 8  # event-loop turns given to sandbox calls between rounds (see _let_io_run)
_STEPS_PER_TURN = 4  # continuous decoding: tokens per row between two looks at the sandbox results
# A round ends once fewer than this share of its rows still generate (engines that can pause): the stragglers go on
# in the next round, together with the rows whose code has run, instead of holding them up.
_PAUSE_FRACTION = 0.25


@dataclass(frozen=True)
class Schedule:
    """How the tool loop drives the engine (see the module doc)."""

    kind: Literal["continuous", "rounds", "lockstep"] = "rounds"
    tokens_per_call: int = DEFAULT_TOKENS_PER_CALL  # "rounds": tokens per row and engine call

    def __post_init__(self) -> None:
        if self.kind not in ("continuous", "rounds", "lockstep"):
            raise ValueError(f"Schedule.kind={self.kind!r}: choose 'continuous', 'rounds' or 'lockstep'")
        if self.tokens_per_call < 1:
            raise ValueError(f"Schedule.tokens_per_call={self.tokens_per_call}: must be >= 1")

    @property
    def per_call(self) -> int | None:
        """Token cap of one engine call: None in lockstep (one call per phase)."""
        return None if self.kind == "lockstep" else self.tokens_per_call


@dataclass
class Row:
    """One trajectory being built."""

    group: int
    prompt: list[int]
    mode: str
    head: str | None = None  # code already in the prompt, when the prompt ends inside an open block
    mode_start: int = 0  # response index where the current mode began
    block_from: int = 0  # response index from which the decoded text holds the current block's opening
    response: list[int] = field(default_factory=list)
    action: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    code: str | None = None  # extracted in this round, to send to the sandbox
    running: str = ""  # the code in flight (recorded with its result in tool_calls)
    pending: asyncio.Future | None = None  # the sandbox batch holding this row's code, in flight
    slot: int = 0  # this row's place in that batch
    calls: int = 0
    exec_errors: int = 0
    timeouts: int = 0
    sandbox_errors: int = 0
    finish: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)


async def rollout(
    engine: RolloutEngine,
    tokenizer: Any,
    sandbox: Any,
    prompts: list[list[int]],
    params: SamplingParams,
    tool: ToolConfig,
    ground_truths: list[str] | None = None,
    schedule: Schedule = Schedule(),
) -> tuple[Trajectories, dict[str, float]]:
    """Tool-integrated rollouts: ``params.n`` trajectories per prompt.

    Args:
        engine: any ``RolloutEngine``. One whose ``accepts_param_list`` is true gets one call per round (each row
            its own stops and budget); others get one call per group of rows sharing their stops.
        tokenizer: the model's tokenizer (decodes code blocks, encodes the injected output).
        sandbox: anything with ``async run(code, *, run_timeout=None) -> ExecResult`` (``sandbox.SandboxClient``);
            a sandbox that also has ``async run_many(codes, *, run_timeout=None) -> list[ExecResult]`` gets the
            code of each round as one ``run_many`` call.
        prompts: prompt token ids.
        params: sampling settings; ``n`` samples per prompt. ``params.max_new_tokens`` is the response budget
            (sampled + injected tokens); ``params.stop`` are extra stop strings that end the response (e.g.
            "</answer>"); ``params.seed`` seeds each round (offset by the round).
        tool: the tool-call settings.
        ground_truths: the reference answer of each prompt, copied to its trajectories ("" when None).
        schedule: how the engine is driven; "continuous" needs an engine with a decode session.

    Returns:
        The trajectories (prompt i's samples at rows ``i * n .. i * n + n - 1``, ``group_ids`` = i, rewards 0 for the
        reward step to fill) and wall times in seconds: ``generation`` (inside ``engine.generate``) and ``sandbox``
        (waiting for code results; execution hidden behind generation is not counted).
    """
    _check_inputs(prompts, params, ground_truths)
    if schedule.kind == "continuous" and not getattr(engine, "can_continue", False):
        raise ValueError(f"rollout: schedule 'continuous' needs an engine with a decode session (HFEngine with sdpa "
                         f"or eager attention); {type(engine).__name__} has none: use 'rounds'")
    budget = params.max_new_tokens
    rows = _initial_rows(tokenizer, prompts, params.n, tool)
    timings = {"generation": 0.0, "sandbox": 0.0}
    try:
        if schedule.kind == "continuous":
            await _run_continuous(engine, tokenizer, sandbox, rows, params, tool, budget, timings)
        else:
            await _run_rounds(engine, tokenizer, sandbox, rows, params, tool, budget, timings, schedule.per_call)
    finally:
        for row in rows:  # only on an error: nothing is pending after a normal finish
            if row.pending is not None:
                row.pending.cancel()
    truths = ground_truths if ground_truths is not None else [""] * len(prompts)
    return to_trajectories(rows, tokenizer, truths), timings


async def _run_rounds(engine: RolloutEngine, tokenizer: Any, sandbox: Any, rows: list[Row], params: SamplingParams,
                      tool: ToolConfig, budget: int, timings: dict[str, float], per_call: int | None) -> None:
    """Rows step together in rounds of ``engine.generate`` calls of at most ``per_call`` tokens (None: lockstep)."""
    lockstep = per_call is None
    round_idx = 0
    while True:
        await _let_io_run()
        ready, waiting = _collect(rows, tokenizer, tool, budget)
        if waiting and (not ready or lockstep or len(waiting) > len(ready)):
            start = time.perf_counter()
            await asyncio.wait({r.pending for r in waiting}, return_when=asyncio.ALL_COMPLETED if lockstep
                               else asyncio.FIRST_COMPLETED)
            timings["sandbox"] += time.perf_counter() - start
            continue
        if not ready:
            break
        start = time.perf_counter()
        _generate_round(engine, tokenizer, ready, params, tool, budget, round_idx, per_call)
        timings["generation"] += time.perf_counter() - start
        _submit([r for r in ready if r.code is not None], sandbox, tool)
        round_idx += 1


async def _run_continuous(engine: Any, tokenizer: Any, sandbox: Any, rows: list[Row], params: SamplingParams,
                          tool: ToolConfig, budget: int, timings: dict[str, float]) -> None:
    """One decode session for the whole rollout (``HFEngine.session``): a row leaves the batch when it closes a
    code block and rejoins, its keys / values still in place, as soon as its result is injected; a row that opens
    a block goes on at once with the closing fence as its stop. The engine never waits for the sandbox while any
    row can generate."""

    def start(key: int, row: Row) -> None:
        session.add(key, row.prompt + row.response, replace(
            params, n=1, stop=_stops(row.mode, tool, params.stop), max_new_tokens=budget - len(row.response)))

    with engine.session(replace(params, n=1)) as session:
        for key, row in enumerate(rows):
            if row.finish is None:
                start(key, row)
        while True:
            await _let_io_run()
            for key in _inject_ready(rows, tokenizer, tool, budget):  # results that are back: the row rejoins
                if rows[key].finish is None:
                    start(key, rows[key])
                else:
                    session.release(key)
            waiting = [r for r in rows if r.pending is not None]
            running = session.num_running
            # Parked rows still ride in every decode forward: with more of them than running rows, a step costs
            # about a full batch for a few tokens, so wait for results instead (as the rounds do).
            if not running or len(waiting) > running:
                if not waiting:
                    return
                begin = time.perf_counter()
                await asyncio.wait({r.pending for r in waiting}, return_when=asyncio.FIRST_COMPLETED)
                timings["sandbox"] += time.perf_counter() - begin
                continue
            begin = time.perf_counter()
            finished = session.step(_STEPS_PER_TURN)
            timings["generation"] += time.perf_counter() - begin
            to_run = []
            for key, sample in finished:
                row = rows[key]
                _absorb(row, sample, budget - len(row.response), tokenizer, tool, budget, params.stop)
                if row.finish is not None:
                    session.release(key)
                elif row.code is not None:
                    to_run.append(row)
                else:  # it opened a code block: on with the closing fence as its stop
                    start(key, row)
            _submit(to_run, sandbox, tool)


async def _let_io_run() -> None:
    """Give the sandbox calls in flight a few turns of the event loop: enough to write new requests and read the
    answers that came back. The server runs the code while this thread generates (its own processes); the client's
    Python work happens here, between rounds. (A client thread running during generation was measured 2-5x slower
    for both: the two threads fight over the GIL on every small torch op.)"""
    for _ in range(_IO_TURNS):
        await asyncio.sleep(0)


def rollout_sync(*args: Any, **kwargs: Any) -> tuple[Trajectories, dict[str, float]]:
    """``rollout`` for synchronous callers (the trainer): same arguments, same result, on this thread's one event
    loop (``zerotir.rollout.sync.run_sync``: the sandbox client's connection pool is reused between steps).

    Raises:
        RuntimeError: when called from a running event loop (it would block it); ``await rollout(...)`` there.
    """
    return run_sync(rollout(*args, **kwargs), "rollout_sync (await rollout(...) there)")




def _submit(rows: list[Row], sandbox: Any, tool: ToolConfig) -> None:
    """Send the code of ``rows`` to the sandbox as one batch (``run_many`` when the sandbox has it: one request for
    the round instead of one per row), without waiting for it."""
    if not rows:
        return
    task = asyncio.ensure_future(_execute([r.code for r in rows], sandbox, tool))
    for slot, row in enumerate(rows):
        row.pending, row.slot, row.running, row.code = task, slot, row.code, None


async def _execute(codes: list[str], sandbox: Any, tool: ToolConfig) -> list[Any]:
    """One result per code; a sandbox that raises (instead of returning SANDBOX_ERROR) never loses a row."""
    if hasattr(sandbox, "run_many"):
        try:
            results = list(await sandbox.run_many(codes, run_timeout=tool.run_timeout))
        except Exception as error:
            return [failed_call_result(error)] * len(codes)
        if len(results) != len(codes):  # a broken sandbox, not a failed snippet: stop loudly
            raise RuntimeError(f"sandbox.run_many returned {len(results)} results for {len(codes)} snippets")
        return results

    async def one(code: str) -> Any:
        try:
            return await sandbox.run(code, run_timeout=tool.run_timeout)
        except Exception as error:
            return failed_call_result(error)

    return list(await asyncio.gather(*(one(code) for code in codes)))


def _check_inputs(prompts: list[list[int]], params: SamplingParams, ground_truths: list[str] | None) -> None:
    if not prompts:
        raise ValueError("rollout: `prompts` is empty; pass at least one prompt (token ids)")
    params.validate("rollout: params")
    if ground_truths is not None and len(ground_truths) != len(prompts):
        raise ValueError(f"rollout: {len(ground_truths)} ground_truths for {len(prompts)} prompts; pass one per "
                         "prompt (or None)")


def _initial_rows(tokenizer: Any, prompts: list[list[int]], n: int, tool: ToolConfig) -> list[Row]:
    """``n`` rows per prompt; a prompt that ends inside an opened code block starts in the code phase."""
    rows = []
    for group, prompt in enumerate(prompts):
        head, mode = None, FINAL
        if tool.max_tool_calls > 0:
            head = open_block_head(tokenizer.decode(prompt, skip_special_tokens=True), tool.code_start, tool.code_end)
            mode = TEXT if head is None else CODE
        rows += [Row(group, list(prompt), mode, head) for _ in range(n)]
    return rows


def _stops(mode: str, tool: ToolConfig, extra: list[str]) -> list[str]:
    own = {TEXT: [tool.code_start], CODE: [tool.code_end], FINAL: []}[mode]
    return own + [s for s in extra if s not in own]


def _generate_round(engine: RolloutEngine, tokenizer: Any, ready: list[Row], params: SamplingParams,
                    tool: ToolConfig, budget: int, round_idx: int, per_call: int | None) -> None:
    """One generation round for ``ready``; fold each sample into its row."""
    pause = per_call is not None  # strict lockstep keeps one call per phase
    per_call = per_call or budget
    seed = None if params.seed is None else params.seed + 7919 * round_idx

    def call(row: Row, n: int = 1) -> SamplingParams:
        return replace(params, n=n, stop=_stops(row.mode, tool, params.stop), seed=seed,
                       max_new_tokens=min(per_call, budget - len(row.response)))

    if round_idx == 0:  # the rows of a prompt are its n samples, all still identical: one request each
        firsts: dict[int, Row] = {}
        for row in ready:
            firsts.setdefault(row.group, row)
        heads = list(firsts.values())
        outs, limits = _call_engine(engine, [r.prompt for r in heads], [call(r, params.n) for r in heads], pause)
        samples = {r.group: iter(o) for r, o in zip(heads, outs)}
        limit_of = {r.group: lim for r, lim in zip(heads, limits)}
        pairs = [(row, next(samples[row.group]), limit_of[row.group]) for row in ready]
    else:
        outs, limits = _call_engine(engine, [r.prompt + r.response for r in ready], [call(r) for r in ready], pause)
        pairs = [(row, o[0], lim) for row, o, lim in zip(ready, outs, limits)]
    for row, sample, limit in pairs:
        _absorb(row, sample, limit, tokenizer, tool, budget, params.stop)


def _call_engine(engine: RolloutEngine, contexts: list[list[int]], plist: list[SamplingParams],
                 pause: bool) -> tuple[list[list[Sample]], list[int]]:
    """Samples per context and the ``max_new_tokens`` the engine was given for it."""
    if getattr(engine, "accepts_param_list", False):
        kwargs = {"pause_fraction": _PAUSE_FRACTION} if pause and getattr(engine, "can_pause", False) else {}
        return engine.generate(contexts, plist, **kwargs), [p.max_new_tokens for p in plist]
    groups: dict[tuple, list[int]] = {}
    for i, p in enumerate(plist):
        groups.setdefault((tuple(p.stop), p.n), []).append(i)
    outs: list[list[Sample]] = [[] for _ in contexts]
    limits = [0] * len(contexts)
    for idx in groups.values():  # one call per stop set; a row given more room than it has is cut by _absorb
        limit = max(plist[i].max_new_tokens for i in idx)
        out = engine.generate([contexts[i] for i in idx], replace(plist[idx[0]], max_new_tokens=limit))
        for i, samples in zip(idx, out):
            outs[i], limits[i] = samples, limit
    return outs, limits


def _absorb(row: Row, sample: Sample, limit: int, tokenizer: Any, tool: ToolConfig, budget: int,
            extra_stops: list[str]) -> None:
    """Append a sample's ids to ``row`` and move the row's state machine."""
    boundary = len(row.response)
    room = budget - boundary
    over = len(sample.token_ids) > room  # possible only with one call for rows of different budgets
    row.response += sample.token_ids[:room]
    row.action += [True] * len(sample.token_ids[:room])
    row.logprobs += list(sample.logprobs[:room])
    reason, stop = sample.finish_reason, sample.stop_str
    if boundary > row.mode_start:  # this mode's text came from several calls: a stop may span the last boundary
        hit = straddling_stop(tokenizer, row.response, row.mode_start, boundary, _stops(row.mode, tool, extra_stops))
        if hit is not None:  # end the row where the stop ends; later samples are dropped, as if never drawn
            (cut, stop), reason, over = hit, "stop", False
            del row.response[cut:], row.action[cut:], row.logprobs[cut:]
    if over:
        row.finish = FINISH_LENGTH
    elif reason == "eos":
        row.finish = FINISH_STOP
    elif reason == "length":
        # The budget, or the model's context (fewer ids than asked, not paused); otherwise only this call's limit
        # or a pause: go on in the same mode.
        if len(row.response) >= budget or (len(sample.token_ids) < limit and not sample.partial):
            row.finish = FINISH_LENGTH
    elif row.mode == TEXT and stop == tool.code_start:
        row.mode, row.block_from, row.mode_start, row.head = CODE, row.mode_start, len(row.response), None
    elif row.mode == CODE and stop == tool.code_end:
        text = tokenizer.decode(row.response[row.block_from :], skip_special_tokens=True)
        block = row.head + text if row.head is not None else code_after_start(text, tool.code_start)
        row.code = code_before_end(block, tool.code_end)
    else:  # one of the caller's stop strings
        row.finish = FINISH_STOP
    if row.finish is None and len(row.response) >= budget:  # a phase stop at the budget: no room to go on
        row.finish, row.code = FINISH_LENGTH, None


def _collect(rows: list[Row], tokenizer: Any, tool: ToolConfig, budget: int) -> tuple[list[Row], list[Row]]:
    """Inject the results that are back; return the rows ready to generate and the rows still waiting."""
    _inject_ready(rows, tokenizer, tool, budget)
    ready = [r for r in rows if r.finish is None and r.pending is None]
    return ready, [r for r in rows if r.pending is not None]


def _inject_ready(rows: list[Row], tokenizer: Any, tool: ToolConfig, budget: int) -> list[int]:
    """Inject every result that is back (both schedules); returns the indices of the rows that got one."""
    done = []
    for key, row in enumerate(rows):
        if row.pending is not None and row.pending.done():
            result, row.pending = row.pending.result()[row.slot], None
            _inject(row, result, tokenizer, tool, budget)
            done.append(key)
    return done


def _inject(row: Row, result: Any, tokenizer: Any, tool: ToolConfig, budget: int) -> None:
    """Count one execution and append its formatted output (action 0), cut at the budget."""
    row.calls += 1
    status = status_of(result)
    row.exec_errors += status == STATUS_ERROR
    row.timeouts += status in TIMEOUT_STATUSES
    row.sandbox_errors += status == STATUS_SANDBOX_ERROR
    output = format_output(result, tool, tokenizer)
    row.tool_calls.append(ToolCall(row.running, status, output))
    injected = tokenizer.encode(tool.output_template.format(output=output), add_special_tokens=False)
    room = budget - len(row.response)
    row.response += injected[:room]
    row.action += [False] * len(injected[:room])
    row.logprobs += [0.0] * len(injected[:room])
    row.head = None
    row.mode = TEXT if row.calls < tool.max_tool_calls else FINAL
    row.mode_start = row.block_from = len(row.response)
    if len(injected) >= room:
        row.finish = FINISH_LENGTH
