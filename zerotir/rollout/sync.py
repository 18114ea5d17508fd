"""One way for synchronous code (the trainer, scripts) to run the project's coroutines: ``run_sync``.

The coroutines (the tool loop, reward scoring) run on one event loop kept per thread rather than a fresh
``asyncio.run`` loop per call, so what is bound to a loop (the sandbox client's connection pool) is reused from one
RL step to the next.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class _ThreadLoop(threading.local):
    """Each thread's own event loop (None until the thread first runs a coroutine here)."""

    loop: asyncio.AbstractEventLoop | None = None


_THREAD = _ThreadLoop()


def run_sync(coro: Coroutine[Any, Any, T], what: str = "this call") -> T:
    """Run ``coro`` to completion on this thread's event loop and return its result.

    Raises:
        RuntimeError: when called from a running event loop (it would block it); ``await`` the coroutine there.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        coro.close()
        raise RuntimeError(f"{what} was called from a running event loop; await the coroutine there instead")
    return thread_loop().run_until_complete(coro)


def thread_loop() -> asyncio.AbstractEventLoop:
    """This thread's event loop, the one ``run_sync`` runs coroutines on (made now if it has none): a task created
    on it while it is not running goes on at the next ``run_sync`` of this thread."""
    loop = _THREAD.loop
    if loop is None or loop.is_closed():
        loop = _THREAD.loop = asyncio.new_event_loop()
    return loop
