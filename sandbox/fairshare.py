"""The workers ``/run_batch`` entries may hold, shared between every batch and taken by their clients in turn.

With a cap per batch (all workers but one), two batches at once would hold every worker and a ``/run_code`` would
wait behind both. So the cap is one for all batches together, and a slot that frees goes to the clients waiting
for one in turn (round robin by client address; first come, first served within a client), so one client's
long batch does not make another's wait for its end.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict, deque
from collections.abc import AsyncIterator


class FairShare:
    """At most ``capacity`` batch entries run at once, over all batches; freed slots go to the clients in turn.

    Args:
        capacity: Slots for batch entries (the server gives all workers but one, so ``/run_code`` finds a worker).
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"FairShare capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.running = 0
        self._lanes: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()  # client -> its waiting entries

    @contextlib.asynccontextmanager
    async def slot(self, client: str) -> AsyncIterator[None]:
        """Hold one slot for ``client`` for the duration of the block (waiting for its turn first)."""
        await self.acquire(client)
        try:
            yield
        finally:
            self.release()

    async def acquire(self, client: str) -> None:
        """Take a slot now if one is free and nobody waits, else wait for ``client``'s turn."""
        if self.running < self.capacity and not self._lanes:
            self.running += 1
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._lanes.setdefault(client, deque()).append(granted)
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():  # the slot was handed over just as we were cancelled
                self.release()
            raise

    def release(self) -> None:
        """Free a slot: hand it to the first waiting entry of the next client in turn."""
        self.running -= 1
        while self._lanes and self.running < self.capacity:
            client, lane = next(iter(self._lanes.items()))
            granted = lane.popleft()
            if lane:
                self._lanes.move_to_end(client)  # its next entry waits for every other client's turn
            else:
                del self._lanes[client]
            if not granted.done():  # a cancelled waiter is skipped
                self.running += 1
                granted.set_result(None)
