"""Request bodies: a large one is parsed off the event loop, a batch is counted before its entries are built."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx

from sandbox.body import INLINE_BYTES, parse_body
from sandbox.bounds import MAX_BODY_BYTES
from tests.sandbox.conftest import QUEUE_SIZE, Server

ENTRY = b'{"code": "pass", "language": "python"}'


def tiny_entries_batch() -> bytes:
    """A batch just under the body limit made of ~400,000 tiny entries: ~5 s and ~500 MB to validate whole."""
    count = (MAX_BODY_BYTES - 64) // (len(ENTRY) + 2)
    return b'{"requests": [' + b", ".join([ENTRY] * count) + b"]}"


def test_a_print_sent_during_a_16_mib_batch_is_answered_first_and_the_server_does_not_parse_it(
        sandbox_server: Server) -> None:
    """The small request goes out once the whole big body is sent; inline parsing answered it only after the
    batch's 413 (the event loop was busy for seconds) and grew the server by ~500 MB."""
    sandbox_server.reset_peak_rss()
    before = sandbox_server.peak_rss_bytes()
    body = tiny_entries_batch()
    finished: list[str] = []

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        sent = asyncio.Event()

        async def stream() -> AsyncIterator[bytes]:
            for i in range(0, len(body), 2**20):
                yield body[i:i + 2**20]
            sent.set()

        async def big() -> httpx.Response:
            answer = await http.post(sandbox_server.url + "/run_batch", content=stream(),
                                     headers={"content-type": "application/json",
                                              "content-length": str(len(body))})
            finished.append("big")
            return answer

        async def small() -> httpx.Response:
            await sent.wait()
            answer = await http.post(sandbox_server.url + "/run_code",
                                     json={"code": "print(1+1)", "language": "python"})
            finished.append("small")
            return answer

        async with httpx.AsyncClient(timeout=120, trust_env=False) as http:
            return await asyncio.gather(big(), small())

    big_answer, small_answer = asyncio.run(scenario())
    growth = sandbox_server.peak_rss_bytes() - before
    assert small_answer.json()["run_result"]["stdout"] == "2\n"
    assert big_answer.status_code == 413 and "exceeds the server queue" in big_answer.json()["detail"]
    assert finished == ["small", "big"]
    assert growth < 100 * 2**20, f"the server's peak RSS grew by {growth / 2**20:.1f} MiB"


def test_a_large_body_parsed_in_the_parser_process_runs_or_names_its_bad_field(sandbox_server: Server) -> None:
    code = "#" * (INLINE_BYTES + 1) + "\nprint(6 * 7)"
    ok = httpx.post(sandbox_server.url + "/run_code", json={"code": code, "language": "python"}, timeout=60,
                    trust_env=False).json()
    assert ok["run_result"]["stdout"] == "42\n"
    bad = httpx.post(sandbox_server.url + "/run_code", json={"code": code, "language": "python", "run_timeout": "x"},
                     timeout=60, trust_env=False)
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "run_timeout"]


def test_a_batch_over_the_queue_is_refused_before_any_entry_is_validated() -> None:
    body = b'{"requests": [' + b", ".join([b'{"code": 1}'] * (QUEUE_SIZE + 1)) + b"]}"  # every entry invalid
    assert parse_body("run_batch", body, QUEUE_SIZE)[0] == 413
    assert parse_body("run_batch", b'{"requests": [{"code": 1}]}', QUEUE_SIZE)[0] == 422
    status, errors = parse_body("run_code", b'{"code": ', QUEUE_SIZE)
    assert status == 422 and errors[0]["type"] == "json_invalid"
