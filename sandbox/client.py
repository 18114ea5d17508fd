"""The asynchronous client of the sandbox service (and of SandboxFusion, whose ``/run_code`` shape it speaks).

One shared httpx connection pool, one global concurrency limit, retries with exponential backoff only on connection
errors and 429 (the code never runs twice because of a slow answer), and several server URLs used round-robin.

    async with SandboxClient("http://127.0.0.1:8080") as client:
        result = await client.run("print(1 + 1)")
        text = format_for_model(result)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import random
import time
import uuid
from typing import Any

import httpx

from sandbox.result import ExecResult, ExecStatus, parse_run_code_response

#: Connection-level failures worth another try (on the next URL): the request never reached a server, or the
#: server closed a kept-alive connection under it.
RETRYABLE = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError,
             httpx.WriteError, httpx.PoolTimeout)
_FIX = ("Fix: start a server with `python -m sandbox serve --port 8080` and pass its URL, or leave the sandbox URL "
        "list empty so a local server is started for you (sandbox.local_sandbox).")


class SandboxUnavailable(RuntimeError):
    """No sandbox server answered (raised by the health checks)."""


def _normalise_urls(urls: str | list[str]) -> list[str]:
    items = urls.split(",") if isinstance(urls, str) else list(urls)
    cleaned = []
    for url in (u.strip() for u in items):
        if not url:
            continue
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"SandboxClient urls: {url!r} is not an http(s) URL; write e.g. 'http://127.0.0.1:8080'")
        url = url.rstrip("/")
        cleaned.append(url[: -len("/run_code")] if url.endswith("/run_code") else url)
    if not cleaned:
        raise ValueError(f"SandboxClient urls is empty. {_FIX}")
    return cleaned


class SandboxClient:
    """Runs snippets on one or more sandbox servers.

    Args:
        urls: Base URL(s) of the servers (a list, or one string with commas); a trailing ``/run_code`` is accepted.
        max_concurrency: Most requests in flight at once, over all servers (also the connection-pool size).
        request_timeout: Seconds to wait for one HTTP answer (raised to ``run_timeout + 10`` when that is larger).
        retries: Further attempts after a connection error or a 429, each on the next URL, with backoff.
        run_timeout: Default wall-time limit of a snippet in seconds.
        memory_limit_mb: Default memory budget of a snippet, or None for the server's default.
        backoff: First backoff delay in seconds (doubled per attempt, with jitter; a 429's Retry-After wins).
        transport: An httpx transport to use instead of the network (tests).
        trust_env: Let httpx read proxy settings from the environment (off: a sandbox is usually on the LAN).
    """

    def __init__(self, urls: str | list[str], max_concurrency: int = 64, request_timeout: float = 60.0,
                 retries: int = 3, run_timeout: float = 5.0, memory_limit_mb: int | None = None, *,
                 backoff: float = 0.25, transport: httpx.AsyncBaseTransport | None = None,
                 trust_env: bool = False) -> None:
        self.urls = _normalise_urls(urls)
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
        self.backoff = backoff
        self._transport = transport
        self._trust_env = trust_env
        self._next_url = itertools.count()
        self._http: httpx.AsyncClient | None = None
        self._limit: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _new_http(self) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency)
        return httpx.AsyncClient(limits=limits, timeout=self.request_timeout, transport=self._transport,
                                 trust_env=self._trust_env)

    def _shared(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        """The connection pool and concurrency limit of the running loop (rebuilt if the client moves loops)."""
        loop = asyncio.get_running_loop()
        if self._http is None or self._loop is not loop:
            self._http, self._limit, self._loop = self._new_http(), asyncio.Semaphore(self.max_concurrency), loop
        return self._http, self._limit

    async def run(self, code: str, *, run_timeout: float | None = None,
                  memory_limit_mb: int | None = None) -> ExecResult:
        """Run one snippet. Never raises for a failure of the code; an unreachable service gives SANDBOX_ERROR."""
        timeout = run_timeout if run_timeout is not None else self.run_timeout
        memory = memory_limit_mb if memory_limit_mb is not None else self.memory_limit_mb
        request_id = uuid.uuid4().hex
        payload = {"code": code, "language": "python", "run_timeout": timeout,
                   "memory_limit_MB": memory if memory is not None else -1, "request_id": request_id}
        http, limit = self._shared()
        start = time.monotonic()
        async with limit:
            answer, error = await self._post(http, "/run_code", payload, max(self.request_timeout, timeout + 10))
        wall = time.monotonic() - start
        if answer is None:
            return ExecResult(ExecStatus.SANDBOX_ERROR, "", error, wall, None, wall)
        echoed = answer.get("request_id")
        if echoed is not None and echoed != request_id:
            return ExecResult(ExecStatus.SANDBOX_ERROR, "", f"response for request {echoed!r}, expected "
                              f"{request_id!r}", wall, None, wall)
        return parse_run_code_response(answer, wall)

    async def run_many(self, codes: list[str], **kw: Any) -> list[ExecResult]:
        """Run snippets concurrently (within ``max_concurrency``); results in the same order as ``codes``."""
        return list(await asyncio.gather(*(self.run(code, **kw) for code in codes)))

    async def _post(self, http: httpx.AsyncClient, path: str, payload: dict[str, Any],
                    timeout: float) -> tuple[dict[str, Any] | None, str]:
        """(JSON answer, "") or (None, why it failed after the retries)."""
        failures = []
        for attempt in range(self.retries + 1):
            url = self.urls[next(self._next_url) % len(self.urls)]
            delay = self.backoff * (2**attempt) * (0.5 + random.random())
            try:
                response = await http.post(url + path, json=payload, timeout=timeout)
            except RETRYABLE as e:
                failures.append(f"{url}: {type(e).__name__}: {e}")
            except httpx.HTTPError as e:  # a read timeout: the code may be running, so do not send it again
                return None, f"{url}: {type(e).__name__}: {e or 'no answer'} (after {timeout:g} s)"
            else:
                if response.status_code == 200:
                    try:
                        answer = response.json()
                    except ValueError:
                        return None, f"{url}: answered 200 with a body that is not JSON: {response.text[:200]!r}"
                    if not isinstance(answer, dict):
                        return None, f"{url}: answered 200 with JSON that is not an object: {response.text[:200]!r}"
                    return answer, ""
                if response.status_code != 429:
                    return None, f"{url}: HTTP {response.status_code}: {response.text[:300]}"
                failures.append(f"{url}: 429 queue full")
                delay = max(delay, _retry_after(response))
            if attempt < self.retries:
                await asyncio.sleep(delay)
        return None, f"no sandbox server accepted the request after {self.retries + 1} attempts: " + "; ".join(failures)

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
