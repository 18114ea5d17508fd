"""The pool's side of the worker protocol: any failure on it retires and replaces the worker, never loses it."""

from __future__ import annotations

import asyncio

import pytest

from sandbox import pool as pool_module
from sandbox.config import ExecConfig
from sandbox.pool import WorkerPool


def test_a_protocol_exception_retires_and_replaces_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    # An answer line over the reader's limit makes readline raise ValueError (not a WorkerFailure): the request
    # gets a sandbox error, the worker is replaced, and the pool goes on answering.
    monkeypatch.setattr(pool_module, "_LINE_LIMIT", 4096)
    config = ExecConfig(isolate=False, preload=[], preamble=None, max_output_bytes=16384)

    async def scenario() -> tuple[dict, dict, int]:
        pool = WorkerPool(config, workers=1, queue_size=1, startup_timeout=60)
        await pool.start()
        try:
            job = {"code": "print('x' * 10000)", "run_timeout": 5.0, "memory_limit_mb": 256}
            assert pool.try_admit()
            broken = await asyncio.wait_for(pool.run_admitted(job), 60)
            assert pool.try_admit()
            fine = await asyncio.wait_for(pool.run_admitted(dict(job, code="print(6 * 7)")), 60)
            return broken, fine, pool.restarts
        finally:
            await pool.stop()

    broken, fine, restarts = asyncio.run(scenario())
    assert broken["reason"] == "sandbox_error" and "ValueError" in broken["error"], broken
    assert (fine["reason"], fine["stdout"], restarts) == ("ok", "42\n", 1)


def test_a_batch_entry_waits_for_room_and_nothing_jumps_ahead_of_it() -> None:
    config = ExecConfig(isolate=False, preload=[], preamble=None)

    async def scenario() -> tuple[bool, bool, bool, dict, dict, int]:
        pool = WorkerPool(config, workers=1, queue_size=1, startup_timeout=60)
        await pool.start()
        try:
            job = {"code": "print(1)", "run_timeout": 5.0, "memory_limit_mb": 256}
            assert pool.try_admit()  # the queue is now full
            waiter = asyncio.ensure_future(pool.admit())
            await asyncio.sleep(0)
            waiting, barged = not waiter.done(), pool.try_admit()  # the queue stays full while it waits
            first = await asyncio.wait_for(pool.run_admitted(job), 60)
            await asyncio.wait_for(waiter, 60)  # handed the room the first job freed
            granted = pool.pending == 1
            second = await asyncio.wait_for(pool.run_admitted(dict(job, code="print(2)")), 60)
            return waiting, barged, granted, first, second, pool.pending
        finally:
            await pool.stop()

    waiting, barged, granted, first, second, pending = asyncio.run(scenario())
    assert (waiting, barged, granted) == (True, False, True)
    assert (first["stdout"], second["stdout"], pending) == ("1\n", "2\n", 0)
