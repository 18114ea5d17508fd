"""Bounds checked before any work: the request body's size, the connections uvicorn holds, a batch's share.

A request the server will refuse must cost it little: a 50 MB ``/run_code`` body used to be read and parsed whole
before its code field was found too long. :class:`BodyLimit` answers 413 from the ``Content-Length`` header before
reading a byte, and stops a body sent without one (chunked) as soon as it passes the limit. uvicorn's own settings
(:func:`uvicorn_limits`) cap the open connections and the size of an incomplete request head. uvicorn closes an
idle kept-alive connection, but has no timeout for a request head: a connection that never sends a byte (or sends
its head a byte a minute) would stay open for good, holding one of the capped connections. :func:`head_timeout_protocol`
adds that timeout.
"""

from __future__ import annotations

import json
from typing import Any

#: Largest request body accepted: a full batch of near-limit snippets fits (1 MB of code each, JSON-escaped).
MAX_BODY_BYTES = 16 * 2**20
#: Largest incomplete request head (request line and headers) uvicorn buffers.
MAX_HEAD_BYTES = 64 * 2**10
#: Seconds an idle keep-alive connection stays open.
KEEP_ALIVE_S = 5
#: Seconds a connection may take to send a whole request head, from its opening or the end of its last response.
HEAD_TIMEOUT_S = 10.0


def batch_share(workers: int) -> int:
    """Workers one ``/run_batch`` may hold at once: all but one, so other requests always find a worker soon."""
    return max(1, workers - 1)


async def validation_error(_: Any, exc: Any) -> Any:
    """422 naming each bad field, without echoing its value: a value the response cannot encode (a lone surrogate
    in ``request_id``) would otherwise turn the 422 into a 500."""
    from fastapi.encoders import jsonable_encoder
    from fastapi.responses import JSONResponse

    errors = [{k: v for k, v in error.items() if k != "input"} for error in exc.errors()]
    return JSONResponse({"detail": jsonable_encoder(errors)}, status_code=422)


def uvicorn_limits(queue_size: int, head_timeout: float = HEAD_TIMEOUT_S) -> dict[str, Any]:
    """uvicorn settings: connections beyond ``limit_concurrency`` get 503 at once (room for every admitted request,
    their clients' retries and health checks), request heads over ``MAX_HEAD_BYTES`` are refused, and a connection
    that has not sent a whole request head ``head_timeout`` seconds after it opened (or after its last response) is
    closed."""
    if head_timeout <= 0:
        raise ValueError(f"--head_timeout must be > 0 seconds, got {head_timeout}")
    return {"limit_concurrency": 4 * queue_size + 64, "timeout_keep_alive": KEEP_ALIVE_S,
            "h11_max_incomplete_event_size": MAX_HEAD_BYTES, "http": head_timeout_protocol(head_timeout)}


def head_timeout_protocol(seconds: float) -> type:
    """uvicorn's HTTP protocol (the one ``http="auto"`` picks) closing a connection whose request head is not
    complete ``seconds`` after the connection opened or its last response ended. A request being answered is never
    cut: the timer stops as soon as its head is parsed (uvicorn then has a request cycle that is not complete)."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class HeadTimeoutProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        _head_timer: Any = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm_head_timer()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._answering():
                self._stop_head_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self._answering():
                self._arm_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_head_timer()
            super().connection_lost(exc)

        def _answering(self) -> bool:
            return self.cycle is not None and not self.cycle.response_complete

        def _arm_head_timer(self) -> None:
            self._stop_head_timer()
            self._head_timer = self.loop.call_later(seconds, self._head_timed_out)

        def _stop_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if not self._answering() and not self.transport.is_closing():
                self.transport.close()

    return HeadTimeoutProtocol


class BodyLimit:
    """ASGI middleware: 413 for a body over ``limit`` bytes, before the application reads it."""

    def __init__(self, app: Any, limit: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await self._refuse(send)
            return
        if declared is not None:
            await self.app(scope, receive, send)
            return
        chunks, seen = [], 0  # no Content-Length (chunked): read up to the limit first, then hand the body on
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunks.append(message.get("body", b""))
            seen += len(chunks[-1])
            if seen > self.limit:
                await self._refuse(send)
                return
            if not message.get("more_body"):
                break
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        await self.app(scope, replay, send)

    async def _refuse(self, send: Any) -> None:
        body = json.dumps({"detail": f"request body over {self.limit} bytes; send smaller batches "
                                     "(or fewer, shorter snippets)"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
