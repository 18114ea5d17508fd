"""The asynchronous client of the sandbox service (and of SandboxFusion, whose ``/run_code`` shape it speaks).

One shared httpx connection pool, one global concurrency limit, retries with exponential backoff and jitter only on
connection errors, 429 and 503 (answers sent before any code ran: the code never runs twice because of a slow
answer), and several server URLs taken as one pool (``sandbox.client_pool``): each request goes to the server with
the fewest of this client's requests in flight, at most ``max_per_server`` on one, and a retry goes to a server that
has not failed it yet while one is left.
``run_many`` sends one ``POST /run_batch`` per chunk of snippets (chunks of a quarter of the server's queue, spread
over the URLs) and falls back to one ``/run_code`` per snippet on a server without that endpoint (SandboxFusion).

    async with SandboxClient("http://127.0.0.1:8080") as client:
        result = await client.run("print(1 + 1)")
        text = format_for_model(result)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import random
import time
import uuid
from typing import Any, NamedTuple

import httpx

from sandbox.client_pool import ServerPool
from sandbox.result import ExecResult, ExecStatus, parse_run_code_response

#: Connection-level failures worth another try (on the next URL): the request never reached a server, or the
#: server closed a kept-alive connection under it.
RETRYABLE = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError,
             httpx.WriteError, httpx.PoolTimeout)
#: Answers sent before any code ran, worth another try (with backoff and jitter, on the next URL): a full queue,
#: and the server's connection cap (uvicorn answers 503 beyond ``limit_concurrency`` before reading the request).
RETRY_STATUSES = {429: "queue full", 503: "service unavailable (connection limit)"}
#: Queue size assumed for a server whose ``/health`` does not report its ``queue_size``.
DEFAULT_BATCH_SIZE = 256
#: ``run_many`` sends chunks of ``queue_size // BATCH_SHARE_OF_QUEUE`` snippets: a server that admits a batch whole
#: (older versions of this one) fits one beside other traffic, where a chunk of the whole queue would get 429 as
#: long as anything else is queued.
BATCH_SHARE_OF_QUEUE = 4
_FIX = ("Fix: start a server with `python -m sandbox serve --port 8080` and pass its URL, or leave "
        "model.tool.sandbox.urls unset (null) so a local server is started for you (sandbox.local_sandbox).")


class SandboxUnavailable(RuntimeError):
    """No sandbox server answered (raised by the health checks)."""


class _Reply(NamedTuple):
    """What ``_post`` got: the JSON object (None on failure), why it failed, the last URL tried, its HTTP status."""

    body: dict[str, Any] | None
    error: str
    url: str
    status: int | None


def _sandbox_error(why: str, wall: float) -> ExecResult:
    return ExecResult(ExecStatus.SANDBOX_ERROR, "", why, wall, None, wall)


def _parse(answer: Any, request_id: str, wall: float) -> ExecResult:
    """One ``/run_code`` answer as an :class:`ExecResult`; an answer for another request is a SANDBOX_ERROR."""
    if not isinstance(answer, dict):
        return _sandbox_error(f"sandbox answered {type(answer).__name__} instead of a /run_code object", wall)
    echoed = answer.get("request_id")
    if echoed is not None and echoed != request_id:
        return _sandbox_error(f"response for request {echoed!r}, expected {request_id!r}", wall)
    return parse_run_code_response(answer, wall)


def _normalise_urls(urls: str | list[str]) -> list[str]:
    items = urls.split(",") if isinstance(urls, str) else list(urls)
    cleaned = []
    for url in (u.strip() for u in items):
        if not url:
            continue
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"SandboxClient urls: {url!r} is not an http(s) URL; write e.g. 'http://127.0.0.1:8080'")
        url = url.rstrip("/")
        cleaned.append(url.removesuffix("/run_code"))
    if not cleaned:
        raise ValueError(f"SandboxClient urls is empty. {_FIX}")
    return cleaned


class SandboxClient:
    """Runs snippets on one or more sandbox servers.

    Args:
        urls: Base URL(s) of the servers (a list, or one string with commas); a trailing ``/run_code`` is accepted.
        max_concurrency: Most requests in flight at once, over all servers (also the connection-pool size).
        request_timeout: Seconds to wait for one HTTP answer (raised to ``run_timeout + 10`` when that is larger).
        retries: Further attempts after a connection error, a 429 or a 503, each on the least-loaded server that
            has not failed this request yet (while one is left), with backoff.
        run_timeout: Default wall-time limit of a snippet in seconds.
        memory_limit_mb: Default memory budget of a snippet, or None for the server's default.
        backoff: First backoff delay in seconds (doubled per attempt, with jitter; a 429's Retry-After wins).
        transport: An httpx transport to use instead of the network (tests).
        trust_env: Let httpx read proxy settings from the environment (off: a sandbox is usually on the LAN).
        max_per_server: Most requests of this client in flight on one server (None: only ``max_concurrency``);
            a request finding every server at its bound waits for a slot.
    """

    def __init__(self, urls: str | list[str], max_concurrency: int = 64, request_timeout: float = 60.0,
                 retries: int = 3, run_timeout: float = 5.0, memory_limit_mb: int | None = None, *,
                 backoff: float = 0.25, transport: httpx.AsyncBaseTransport | None = None,
                 trust_env: bool = False, max_per_server: int | None = None) -> None:
        self.urls = _normalise_urls(urls)
        ServerPool(self.urls, max_per_server)  # refuses a bad bound now, not at the first call
        for name, value in (("max_concurrency", max_concurrency), ("request_timeout", request_timeout),
                            ("run_timeout", run_timeout)):
            if value <= 0:
                raise ValueError(f"SandboxClient {name} must be > 0, got {value!r}")
        if retries < 0:
            raise ValueError(f"SandboxClient retries must be >= 0, got {retries}")
        self.max_concurrency = max_concurrency
        self.request_timeout = request_timeout
        self.retries = retries
        self.run_timeout = run_timeout
        self.memory_limit_mb = memory_limit_mb
        self.max_per_server = max_per_server
        self.backoff = backoff
        self._transport = transport
        self._trust_env = trust_env
        self._pool: ServerPool | None = None
        self._http: httpx.AsyncClient | None = None
        self._limit: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._servers: dict[str, tuple[int, int]] = {}  # url -> (queue_size, workers), from its /health
        self._no_batch: set[str] = set()  # urls that answered 404/405 for /run_batch (SandboxFusion)

    def _new_http(self) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency)
        return httpx.AsyncClient(limits=limits, timeout=self.request_timeout, transport=self._transport,
                                 trust_env=self._trust_env)

    def _shared(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        """The connection pool and concurrency limit of the running loop (rebuilt, with the server pool, if the
        client moves loops)."""
        loop = asyncio.get_running_loop()
        if self._http is None or self._loop is not loop:
            self._http, self._limit, self._loop = self._new_http(), asyncio.Semaphore(self.max_concurrency), loop
            self._pool = ServerPool(self.urls, self.max_per_server)
        return self._http, self._limit

    @property
    def in_flight(self) -> dict[str, int]:
        """This client's requests in flight per server URL (all 0 before the first request)."""
        return dict(self._pool.in_flight) if self._pool is not None else dict.fromkeys(self.urls, 0)

    def _payload(self, code: str, run_timeout: float | None, memory_limit_mb: int | None) -> dict[str, Any]:
        """The ``/run_code`` request of one snippet (SandboxFusion's fields), with a fresh ``request_id``."""
        timeout = run_timeout if run_timeout is not None else self.run_timeout
        memory = memory_limit_mb if memory_limit_mb is not None else self.memory_limit_mb
        return {"code": code, "language": "python", "run_timeout": timeout,
                "memory_limit_MB": memory if memory is not None else -1, "request_id": uuid.uuid4().hex}

    async def run(self, code: str, *, run_timeout: float | None = None,
                  memory_limit_mb: int | None = None) -> ExecResult:
        """Run one snippet. Never raises for a failure of the code; an unreachable service gives SANDBOX_ERROR."""
        payload = self._payload(code, run_timeout, memory_limit_mb)
        http, limit = self._shared()
        start = time.monotonic()
        async with limit:
            reply = await self._post(http, "/run_code", payload,
                                     max(self.request_timeout, payload["run_timeout"] + 10))
        wall = time.monotonic() - start
        if reply.body is None:
            return _sandbox_error(reply.error, wall)
        return _parse(reply.body, payload["request_id"], wall)

    async def run_many(self, codes: list[str], *, run_timeout: float | None = None,
                       memory_limit_mb: int | None = None) -> list[ExecResult]:
        """Run snippets, results in the same order as ``codes``; never raises for a failure of the service.

        Sends one ``POST /run_batch`` per chunk of a quarter of the servers' smallest ``queue_size`` (from
        ``/health``, else ``DEFAULT_BATCH_SIZE``) snippets, so that a batch never needs the whole queue. Chunks are
        spread over the URLs, one in flight per URL at a time; retries (connection errors, 429, 503) work as in
        :meth:`run`. A server
        that answers 404/405 for ``/run_batch`` (SandboxFusion) is remembered, and its snippets go one
        ``/run_code`` request each.
        """
        if not codes:
            return []
        http, limit = self._shared()
        await self._learn_servers(http)
        batch_urls = [url for url in self.urls if url not in self._no_batch]
        if not batch_urls:
            return await self._one_by_one(codes, run_timeout, memory_limit_mb)
        queue = min(self._servers.get(url, (DEFAULT_BATCH_SIZE, 1))[0] for url in batch_urls)
        size = max(1, queue // BATCH_SHARE_OF_QUEUE)
        chunks = [list(range(i, min(i + size, len(codes)))) for i in range(0, len(codes), size)]
        results: list[ExecResult | None] = [None] * len(codes)

        async def lane(k: int) -> None:  # chunks k, k + len(urls), ... one after another, each to the least loaded
            for idx in chunks[k :: len(batch_urls)]:
                part = await self._run_chunk(http, limit, [codes[i] for i in idx], run_timeout, memory_limit_mb)
                for i, result in zip(idx, part, strict=True):
                    results[i] = result

        await asyncio.gather(*(lane(k) for k in range(min(len(batch_urls), len(chunks)))))
        return results  # type: ignore[return-value]  # every slot was filled by its lane

    async def _one_by_one(self, codes: list[str], run_timeout: float | None,
                          memory_limit_mb: int | None) -> list[ExecResult]:
        """One ``/run_code`` per snippet, concurrently (within ``max_concurrency``)."""
        return list(await asyncio.gather(*(self.run(code, run_timeout=run_timeout, memory_limit_mb=memory_limit_mb)
                                           for code in codes)))

    async def _run_chunk(self, http: httpx.AsyncClient, limit: asyncio.Semaphore, codes: list[str],
                         run_timeout: float | None, memory_limit_mb: int | None) -> list[ExecResult]:
        """One ``/run_batch`` request for ``codes`` to the least-loaded server that has that endpoint."""
        batch_urls = [u for u in self.urls if u not in self._no_batch]
        if not batch_urls:  # found out during this call that none has /run_batch
            return await self._one_by_one(codes, run_timeout, memory_limit_mb)
        payloads = [self._payload(code, run_timeout, memory_limit_mb) for code in codes]
        workers = min(self._servers.get(u, (0, 1))[1] for u in batch_urls)
        # The server runs the chunk on its workers: allow for every snippet running to its time limit.
        timeout = max(self.request_timeout, math.ceil(len(codes) / workers) * payloads[0]["run_timeout"] + 10)
        start = time.monotonic()
        async with limit:
            reply = await self._post(http, "/run_batch", {"requests": payloads}, timeout, among=batch_urls)
        wall = time.monotonic() - start
        if reply.status in (404, 405):
            self._no_batch.add(reply.url)
            return await self._one_by_one(codes, run_timeout, memory_limit_mb)
        if reply.status == 413 and len(codes) > 1:  # its queue shrank since /health: halve, and remember
            half = len(codes) // 2
            queue, workers_there = self._servers.get(reply.url, (DEFAULT_BATCH_SIZE, 1))
            self._servers[reply.url] = (min(queue, half), workers_there)
            return [*await self._run_chunk(http, limit, codes[:half], run_timeout, memory_limit_mb),
                    *await self._run_chunk(http, limit, codes[half:], run_timeout, memory_limit_mb)]
        if reply.body is None:
            return [_sandbox_error(reply.error, wall) for _ in codes]
        answers = reply.body.get("results")
        if not isinstance(answers, list) or len(answers) != len(codes):
            got = len(answers) if isinstance(answers, list) else type(answers).__name__
            why = f"{reply.url}: /run_batch answered {got} results for {len(codes)} snippets"
            return [_sandbox_error(why, wall) for _ in codes]
        return [_parse(answer, p["request_id"], wall) for answer, p in zip(answers, payloads, strict=True)]

    async def _learn_servers(self, http: httpx.AsyncClient) -> None:
        """Read ``queue_size`` and ``workers`` from the ``/health`` of each batch URL not asked yet.

        A server without ``/health`` (SandboxFusion) gets the defaults; an unreachable one is asked again next time.
        """

        async def ask(url: str) -> None:
            try:
                response = await http.get(url + "/health", timeout=10.0)
                payload = response.json() if response.status_code == 200 else {}
            except (httpx.HTTPError, ValueError):
                return
            payload = payload if isinstance(payload, dict) else {}
            queue, workers = payload.get("queue_size"), payload.get("workers")
            self._servers[url] = (queue if isinstance(queue, int) and queue > 0 else DEFAULT_BATCH_SIZE,
                                  workers if isinstance(workers, int) and workers > 0 else 1)

        await asyncio.gather(*(ask(u) for u in self.urls if u not in self._servers and u not in self._no_batch))

    async def _post(self, http: httpx.AsyncClient, path: str, payload: dict[str, Any], timeout: float,
                    among: list[str] | None = None) -> _Reply:
        """POST with retries on connection errors, 429 and 503, each to the least-loaded server of ``among``
        (default: all) that has not failed this request yet, while one is left (``ServerPool``)."""
        assert self._pool is not None  # built by _shared, which every caller ran first
        servers = among if among is not None else self.urls
        failures: list[str] = []
        failed: set[str] = set()
        url = ""
        for attempt in range(self.retries + 1):
            delay = self.backoff * (2**attempt) * (0.5 + random.random())
            async with self._pool.slot(servers, avoid=failed) as url:
                reply, failure, wait = await self._post_once(http, url, path, payload, timeout)
            if reply is not None:
                return reply
            failures.append(failure)
            failed.add(url)
            if attempt < self.retries:
                await asyncio.sleep(max(delay, wait))
        untried = [u for u in servers if u not in failed]
        return _Reply(None, f"no sandbox server accepted the request after {self.retries + 1} attempts (servers: "
                            f"{', '.join(servers)}): " + "; ".join(failures)
                            + (f"; not tried: {', '.join(untried)}" if untried else ""), url, None)

    @staticmethod
    async def _post_once(http: httpx.AsyncClient, url: str, path: str, payload: dict[str, Any],
                         timeout: float) -> tuple[_Reply | None, str, float]:
        """One POST to ``url``: (the final reply, "", 0), or (None, why it is worth another try, least delay)."""
        try:
            response = await http.post(url + path, json=payload, timeout=timeout)
        except RETRYABLE as e:
            return None, f"{url}: {type(e).__name__}: {e}", 0.0
        except httpx.HTTPError as e:  # a read timeout: the code may be running, so do not send it again
            return _Reply(None, f"{url}: {type(e).__name__}: {e or 'no answer'} (after {timeout:g} s)", url, None), "", 0
        status = response.status_code
        if status in RETRY_STATUSES:
            wait = _retry_after(response) if status == 429 or "retry-after" in response.headers else 0.0
            return None, f"{url}: {status} {RETRY_STATUSES[status]}", wait
        if status != 200:
            return _Reply(None, f"{url}: HTTP {status}: {response.text[:300]}", url, status), "", 0
        try:
            answer = response.json()
        except ValueError:
            return _Reply(None, f"{url}: answered 200 with a body that is not JSON: {response.text[:200]!r}", url,
                          status), "", 0
        if not isinstance(answer, dict):
            return _Reply(None, f"{url}: answered 200 with JSON that is not an object: {response.text[:200]!r}",
                          url, status), "", 0
        return _Reply(answer, "", url, status), "", 0

    async def health(self) -> dict[str, Any]:
        """Ask every server for its health. Raises SandboxUnavailable naming every URL tried when none is healthy.

        Returns:
            ``{"healthy": {url: health payload}, "unreachable": {url: reason}}``.
        """
        http, _ = self._shared()
        return await self._health(http)

    async def _health(self, http: httpx.AsyncClient) -> dict[str, Any]:
        answers = await asyncio.gather(*(self._health_of(http, url) for url in self.urls))
        healthy = {url: payload for url, (payload, _) in zip(self.urls, answers, strict=True) if payload is not None}
        unreachable = {url: why for url, (payload, why) in zip(self.urls, answers, strict=True) if payload is None}
        if not healthy:
            tried = "; ".join(f"{url} ({why})" for url, why in unreachable.items())
            raise SandboxUnavailable(f"no sandbox server is healthy. Tried: {tried}. {_FIX}")
        return {"healthy": healthy, "unreachable": unreachable}

    @staticmethod
    async def _health_of(http: httpx.AsyncClient, url: str) -> tuple[dict[str, Any] | None, str]:
        try:
            response = await http.get(url + "/health", timeout=10.0)
            if response.status_code == 404:  # SandboxFusion has no /health; it answers /v1/ping
                ping = await http.get(url + "/v1/ping", timeout=10.0)
                if ping.status_code == 200:
                    return {"status": "ok", "server": "sandboxfusion"}, ""
                return None, f"HTTP {ping.status_code} on /health and /v1/ping"
            if response.status_code != 200:
                return None, f"HTTP {response.status_code}: {response.text[:200]}"
            payload = response.json()
        except (httpx.HTTPError, ValueError) as e:
            return None, f"{type(e).__name__}: {e}"
        if payload.get("status") not in ("ok", "degraded"):
            alive = payload.get("workers_alive")
            return None, f"server reports status {payload.get('status')!r} ({alive} workers alive)"
        return payload, ""

    def check_health(self) -> dict[str, Any]:
        """Synchronous :meth:`health` for start-up checks; works whether or not an event loop runs in this thread."""

        async def once() -> dict[str, Any]:
            async with self._new_http() as http:
                return await self._health(http)

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(once())
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:  # a loop runs here: use another thread
            return pool.submit(asyncio.run, once()).result()

    async def aclose(self) -> None:
        """Close the connection pool."""
        if self._http is not None and self._loop is asyncio.get_running_loop():
            await self._http.aclose()
        self._http = self._limit = self._loop = None

    async def __aenter__(self) -> SandboxClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _retry_after(response: httpx.Response) -> float:
    try:
        return min(30.0, float(response.headers.get("Retry-After", "1")))
    except ValueError:
        return 1.0
