"""Several sandbox servers as one pool (``sandbox.client_pool``): least-loaded routing, the bound per server, retries
that move on to a server that has not failed yet, and the error naming every server when none answers. The routing
rules on the pool itself; the rest against two real local servers (``local_sandbox``), their ``/metrics`` saying
where each request went."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import httpx
import pytest

from sandbox import ExecStatus, SandboxClient, local_sandbox
from sandbox.client_pool import ServerPool
from tests.ports import dead_url

SLOW = "import time\nstart = time.time()\ntime.sleep({s})\nprint(start, time.time())"


@pytest.fixture(scope="module")
def two_servers() -> Iterator[list[str]]:
    """Two local servers of two workers each, for the module."""
    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(local_sandbox(workers=2, allow_imports=["time"], log_level="warning"))[0]
                for _ in range(2)]
        yield urls


def _code_requests(url: str) -> int:
    answer = httpx.get(url + "/metrics", timeout=10, trust_env=False).json()
    return answer["requests"].get("run_code", 0)


def test_pick_takes_the_least_loaded_and_rotates_between_equals() -> None:
    pool = ServerPool(["http://a", "http://b", "http://c"], max_per_server=None)
    firsts = [pool.pick(pool.urls) for _ in range(3)]
    assert sorted(firsts) == ["http://a", "http://b", "http://c"]  # equal load: each in turn
    pool.in_flight.update({"http://a": 2, "http://b": 0, "http://c": 1})
    assert [pool.pick(pool.urls) for _ in range(3)] == ["http://b"] * 3
    assert pool.pick(pool.urls, avoid={"http://b"}) == "http://c"  # a failed server is avoided while one is left
    assert pool.pick(["http://b"], avoid={"http://b"}) == "http://b"  # ... and taken again when none is


def test_pick_respects_the_bound_per_server_and_refuses_a_bad_one() -> None:
    pool = ServerPool(["http://a", "http://b"], max_per_server=1)
    pool.in_flight.update({"http://a": 1, "http://b": 0})
    assert pool.pick(pool.urls) == "http://b"
    pool.in_flight["http://b"] = 1
    assert pool.pick(pool.urls) is None
    with pytest.raises(ValueError, match="max_per_server must be >= 1"):
        SandboxClient("http://a", max_per_server=0)


def test_calls_go_to_the_server_with_fewer_in_flight(two_servers: list[str]) -> None:
    """One long call holds a server: the short calls made meanwhile all go to the other (round-robin would send
    every second one behind the long call)."""
    before = {url: _code_requests(url) for url in two_servers}

    async def scenario() -> tuple[str, list]:
        async with SandboxClient(two_servers, retries=0) as client:
            long = asyncio.ensure_future(client.run(SLOW.format(s=1.5)))
            while sum(client.in_flight.values()) == 0:
                await asyncio.sleep(0.01)
            busy = next(url for url, n in client.in_flight.items() if n)
            shorts = [await client.run("print(1 + 1)") for _ in range(4)]
            assert (await long).ok
            return busy, shorts

    busy, shorts = asyncio.run(scenario())
    assert all(r.ok and r.stdout == "2\n" for r in shorts)
    other = next(url for url in two_servers if url != busy)
    assert _code_requests(busy) - before[busy] == 1
    assert _code_requests(other) - before[other] == 4


def test_bound_per_server_keeps_calls_one_at_a_time(two_servers: list[str]) -> None:
    """``max_per_server=1`` on one server of two workers: three concurrent calls run one after another (their run
    intervals do not overlap); without the bound two would run at once."""

    async def scenario() -> list:
        async with SandboxClient(two_servers[:1], retries=0, max_per_server=1) as client:
            return await asyncio.gather(*(client.run(SLOW.format(s=0.3)) for _ in range(3)))

    results = asyncio.run(scenario())
    assert all(r.ok for r in results), [r.stderr for r in results]
    spans = sorted(tuple(map(float, r.stdout.split())) for r in results)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:])), spans


def test_a_dead_server_is_skipped_by_the_retry(two_servers: list[str]) -> None:
    """A pool of a dead URL and a live server, one retry: every call succeeds on the live one (a retry avoids
    the server that just failed it)."""
    dead, live = dead_url(), two_servers[0]
    before = _code_requests(live)

    async def scenario() -> list:
        async with SandboxClient([dead, live], retries=1, backoff=0.001) as client:
            return [await client.run("print(1 + 1)") for _ in range(6)]

    results = asyncio.run(scenario())
    assert all(r.ok for r in results), [r.stderr for r in results]
    assert _code_requests(live) - before == 6


def test_no_server_answering_is_a_sandbox_error_naming_every_server() -> None:
    """Two dead URLs and no retry: the one attempt fails, and the error names both servers (one not tried)."""
    urls = [dead_url(), dead_url()]

    async def scenario():
        async with SandboxClient(urls, retries=0) as client:
            return await client.run("print(1)")

    result = asyncio.run(scenario())
    assert result.status is ExecStatus.SANDBOX_ERROR
    assert all(url in result.stderr for url in urls) and "not tried" in result.stderr, result.stderr
