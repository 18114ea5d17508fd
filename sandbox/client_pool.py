"""Which sandbox server a client's next request goes to: the least loaded of its URLs, each within a bound.

A client given several servers (one per node, or a list of a service's replicas) treats them as one pool. Each
request takes a *slot* on one server and gives it back when its answer came: the server with the fewest requests of
this client in flight gets the next one (ties go round the list, so equal servers share the load evenly), and no
server holds more than ``max_per_server`` of them, so one slow server fills up and the rest take the traffic
instead of a queue forming behind it. A retry avoids the servers that already failed this request while another is
left. The bound is per client: several clients (engines) on one server each keep their own.

The pool belongs to one event loop (its waiters are futures of that loop), as the client's connection pool does.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Collection


class ServerPool:
    """The in-flight count of each server of one client, and the least-loaded choice among them.

    Args:
        urls: The servers, in the client's order (at least one).
        max_per_server: Most requests of this client in flight on one server; None: no bound of its own (the
            client's ``max_concurrency`` still bounds the total).
    """

    def __init__(self, urls: list[str], max_per_server: int | None) -> None:
        if not urls:
            raise ValueError("ServerPool needs at least one server URL")
        if max_per_server is not None and max_per_server < 1:
            raise ValueError(f"SandboxClient max_per_server must be >= 1 (or None for no bound), got {max_per_server}")
        self.urls = list(urls)
        self.max_per_server = max_per_server
        self.in_flight = dict.fromkeys(self.urls, 0)
        self._turn = itertools.count()
        self._room: asyncio.Condition | None = None

    def _condition(self) -> asyncio.Condition:
        if self._room is None:
            self._room = asyncio.Condition()
        return self._room

    def _has_room(self, url: str) -> bool:
        return self.max_per_server is None or self.in_flight[url] < self.max_per_server

    def pick(self, among: Collection[str], avoid: Collection[str] = ()) -> str | None:
        """The least-loaded server of ``among`` with room, preferring those not in ``avoid``; None: all are full.

        Ties are broken by a turn that moves on at every pick, so servers of equal load take requests in rotation.
        """
        candidates = [u for u in self.urls if u in among and self._has_room(u)]
        fresh = [u for u in candidates if u not in avoid]
        candidates = fresh or candidates
        if not candidates:
            return None
        start = next(self._turn) % len(candidates)
        rotated = candidates[start:] + candidates[:start]
        return min(rotated, key=lambda u: self.in_flight[u])

    async def acquire(self, among: Collection[str] | None = None, avoid: Collection[str] = ()) -> str:
        """Wait until a server of ``among`` (default: all) has room, take a slot on the least loaded; its URL."""
        among = self.urls if among is None else among
        unknown = [u for u in among if u not in self.in_flight]
        if unknown or not among:
            raise ValueError(f"ServerPool.acquire: {unknown or 'no server'} is not among the pool's {self.urls}")
        room = self._condition()
        async with room:
            while (url := self.pick(among, avoid)) is None:
                await room.wait()
            self.in_flight[url] += 1
        return url

    async def release(self, url: str) -> None:
        """Give back a slot taken by :meth:`acquire`, waking a request that waits for room."""
        room = self._condition()
        async with room:
            self.in_flight[url] -= 1
            room.notify()

    @contextlib.asynccontextmanager
    async def slot(self, among: Collection[str] | None = None, avoid: Collection[str] = ()) -> AsyncIterator[str]:
        """``acquire`` for the duration of a block (released however the block ends, cancelled included)."""
        url = await self.acquire(among, avoid)
        try:
            yield url
        finally:
            await asyncio.shield(self.release(url))
