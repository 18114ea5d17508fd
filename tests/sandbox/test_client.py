"""SandboxClient, CodeSession and local_sandbox: retry rules on a mock transport, the rest on a real server."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from sandbox import client as client_module
from sandbox import CodeSession, ExecStatus, SandboxClient, SandboxUnavailable, local_sandbox
from tests.ports import dead_url
from tests.sandbox.conftest import Server

REPO_ROOT = Path(__file__).resolve().parents[2]
OK_BODY = {"status": "Success", "message": "", "run_result": {"status": "Finished", "execution_time": 0.01,
                                                              "return_code": 0, "stdout": "2\n", "stderr": ""}}


def scripted(answers: list, seen: list[str]) -> httpx.MockTransport:
    """A transport answering from ``answers`` in turn (an exception instance is raised); records URLs hit."""

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    return httpx.MockTransport(handler)


def run_with(answers: list, urls: list[str], retries: int = 3) -> tuple[object, list[str]]:
    seen: list[str] = []

    async def once():
        async with SandboxClient(urls, retries=retries, backoff=0.001, transport=scripted(answers, seen)) as c:
            return await c.run("print(1 + 1)")

    return asyncio.run(once()), seen


def test_connection_error_is_retried_on_the_next_url() -> None:
    answers = [httpx.ConnectError("refused"), httpx.Response(200, json=OK_BODY)]
    result, seen = run_with(answers, ["http://a:1", "http://b:2"])
    assert result.status is ExecStatus.OK and result.stdout == "2\n"
    assert seen == ["http://a:1/run_code", "http://b:2/run_code"]


def test_429_is_retried_after_its_retry_after() -> None:
    answers = [httpx.Response(429, headers={"Retry-After": "0"}), httpx.Response(200, json=OK_BODY)]
    result, seen = run_with(answers, ["http://a:1"])
    assert result.ok and len(seen) == 2


def test_503_of_the_connection_cap_is_retried_on_the_next_url_after_a_jittered_backoff(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """uvicorn answers 503 beyond its connection cap, before the request is read: safe to send again."""
    delays: list[float] = []
    real_sleep = asyncio.sleep

    async def recorded(delay: float) -> None:
        delays.append(delay)
        await real_sleep(0)

    monkeypatch.setattr(client_module.asyncio, "sleep", recorded)
    answers = [httpx.Response(503, text="Service Unavailable"), httpx.Response(200, json=OK_BODY)]
    result, seen = run_with(answers, ["http://a:1", "http://b:2"])
    assert result.ok and seen == ["http://a:1/run_code", "http://b:2/run_code"]
    assert len(delays) == 1 and 0.0005 <= delays[0] <= 0.0015, delays  # backoff 0.001 x (0.5 + random())


def test_read_timeout_is_not_retried_and_gives_sandbox_error() -> None:
    answers = [httpx.ReadTimeout("slow"), httpx.Response(200, json=OK_BODY)]
    result, seen = run_with(answers, ["http://a:1"])
    assert result.status is ExecStatus.SANDBOX_ERROR and len(seen) == 1


def test_server_error_is_not_retried_and_gives_sandbox_error() -> None:
    answers = [httpx.Response(500, text="boom"), httpx.Response(200, json=OK_BODY)]
    result, seen = run_with(answers, ["http://a:1"])
    assert result.status is ExecStatus.SANDBOX_ERROR and "HTTP 500" in result.stderr and len(seen) == 1


def test_exhausted_retries_give_sandbox_error_naming_every_attempt() -> None:
    answers = [httpx.ConnectError("refused")] * 3
    result, seen = run_with(answers, ["http://a:1", "http://b:2"], retries=2)
    assert result.status is ExecStatus.SANDBOX_ERROR and len(seen) == 3
    assert "after 3 attempts" in result.stderr and "http://a:1" in result.stderr and "http://b:2" in result.stderr


def test_answer_that_is_not_json_is_a_sandbox_error_not_an_exception() -> None:
    result, _ = run_with([httpx.Response(200, text="<html>proxy error</html>")], ["http://a:1"])
    assert result.status is ExecStatus.SANDBOX_ERROR and "not JSON" in result.stderr


def test_response_for_another_request_id_is_a_sandbox_error() -> None:
    answers = [httpx.Response(200, json={**OK_BODY, "request_id": "someone-else"})]
    result, _ = run_with(answers, ["http://a:1"])
    assert result.status is ExecStatus.SANDBOX_ERROR


def test_request_carries_the_sandboxfusion_fields() -> None:
    bodies: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json=OK_BODY)

    async def once() -> None:
        async with SandboxClient("http://a:1/run_code", run_timeout=3.0, memory_limit_mb=256,
                                 transport=httpx.MockTransport(handler)) as client:
            await client.run("x = 1", run_timeout=1.5)

    asyncio.run(once())
    body = bodies[0]
    assert (body["code"], body["language"], body["run_timeout"], body["memory_limit_MB"]) == ("x = 1", "python",
                                                                                              1.5, 256)
    assert isinstance(body["request_id"], str) and body["request_id"]


def test_bad_url_is_refused_naming_the_field_and_the_fix() -> None:
    with pytest.raises(ValueError, match=r"SandboxClient urls: '127\.0\.0\.1:8080' is not an http"):
        SandboxClient("127.0.0.1:8080")


def test_health_with_no_server_raises_naming_every_url_and_the_fix() -> None:
    urls = [dead_url(), dead_url()]
    with pytest.raises(SandboxUnavailable) as info:
        SandboxClient(urls).check_health()
    message = str(info.value)
    assert all(url in message for url in urls)
    assert "python -m sandbox serve" in message


def test_check_health_works_inside_a_running_event_loop(sandbox_server: Server) -> None:
    async def inside_loop() -> dict:
        return SandboxClient(sandbox_server.url).check_health()

    report = asyncio.run(inside_loop())
    assert report["healthy"][sandbox_server.url]["status"] == "ok" and report["unreachable"] == {}


def test_run_many_returns_results_in_order(sandbox_server: Server) -> None:
    async def many() -> list:
        async with SandboxClient(sandbox_server.url, max_concurrency=4) as client:
            return await client.run_many([f"import time\ntime.sleep({0.02 * (8 - i)})\nprint({i})"
                                          for i in range(8)])

    assert [r.stdout for r in asyncio.run(many())] == [f"{i}\n" for i in range(8)]


def test_code_session_keeps_variables_and_skips_failed_cells(sandbox_server: Server) -> None:
    async def cells() -> list:
        async with SandboxClient(sandbox_server.url) as client:
            session = CodeSession(client)
            return [await session.run("a = 6\nprint('set a')"),
                    await session.run("b = undefined_name"),
                    await session.run("print(a * 7)"),
                    await session.run("c = a\n\nprint(c / 0)")]

    first, failed, second, third = asyncio.run(cells())
    assert first.stdout == "set a\n"
    assert failed.status is ExecStatus.ERROR
    assert second.stdout == "42\n"  # 'set a' was replayed silently; the failed cell was not replayed
    assert 'File "<snippet>", line 3, in <module>' in third.stderr  # line numbers of the new cell, not the program


def test_local_sandbox_failure_to_start_shows_the_server_output() -> None:
    failing = local_sandbox(workers=1, preamble="import no_such_module_zt\n", preload=["math"], startup_timeout=60)
    with pytest.raises(RuntimeError, match=r"(?s)exited with code.*No module named 'no_such_module_zt'"), failing:
        pass


def test_local_sandbox_unknown_option_is_refused_listing_the_known_ones() -> None:
    misspelt = local_sandbox(run_timout=3)
    with pytest.raises(TypeError, match=r"unknown server option 'run_timout'.*run_timeout"), misspelt:
        pass


def test_local_server_exits_when_its_parent_is_killed() -> None:
    script = ("import sys, time\n"
              "from sandbox import local_sandbox\n"
              "with local_sandbox(workers=1, preload=['math'], preamble=None, log_level='warning') as urls:\n"
              "    print(urls[0], flush=True)\n"
              "    time.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    try:
        url = parent.stdout.readline().strip()
        server_pid = httpx.get(url + "/health", timeout=10, trust_env=False).json()["server_pid"]
    finally:
        parent.kill()  # SIGKILL: local_sandbox gets no chance to stop the server
        parent.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and os.path.exists(f"/proc/{server_pid}"):
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{server_pid}")


# --- run_many: one /run_batch per chunk ------------------------------------------------------------------------------

def batch_answer(body: dict) -> dict:
    """A /run_batch answer that prints each snippet's code (request ids echoed)."""
    return {"results": [{**OK_BODY, "request_id": r["request_id"],
                         "run_result": {**OK_BODY["run_result"], "stdout": r["code"]}} for r in body["requests"]]}


def code_answer(body: dict) -> dict:
    return batch_answer({"requests": [body]})["results"][0]


def run_many_with(handler, urls: list[str], codes: list[str], calls: int = 1, **kw) -> list[list]:
    """Run ``codes`` through ``run_many`` ``calls`` times with one client over a transport built from ``handler``."""

    async def many() -> list[list]:
        async with SandboxClient(urls, backoff=0.001, transport=handler, **kw) as client:
            return [await client.run_many(codes) for _ in range(calls)]

    return asyncio.run(many())


def test_run_many_sends_chunks_of_a_quarter_of_the_queue() -> None:
    """A chunk of the whole queue could only be admitted by an empty server (a server that admits a batch whole)."""
    sizes: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(200, json={"status": "ok", "queue_size": 8, "workers": 2})
        body = json.loads(request.content)
        sizes.append(len(body["requests"]))
        return httpx.Response(200, json=batch_answer(body))

    (results,) = run_many_with(httpx.MockTransport(handler), ["http://a:1"], [str(i) for i in range(7)])
    assert sizes == [2, 2, 2, 1]
    assert [r.stdout for r in results] == [str(i) for i in range(7)]


def test_run_many_batch_429_is_retried_and_request_ids_are_checked() -> None:
    posts: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(200, json={"status": "ok", "queue_size": 12, "workers": 1})  # chunks of 3
        posts.append(request.url.path)
        body = json.loads(request.content)
        if len(posts) == 1:
            return httpx.Response(429, headers={"Retry-After": "0"})
        answer = batch_answer(body)
        answer["results"][1]["request_id"] = "someone-else"
        return httpx.Response(200, json=answer)

    (results,) = run_many_with(httpx.MockTransport(handler), ["http://a:1"], ["a", "b", "c"])
    assert posts == ["/run_batch", "/run_batch"]
    assert [r.status for r in results] == [ExecStatus.OK, ExecStatus.SANDBOX_ERROR, ExecStatus.OK]
    assert [results[0].stdout, results[2].stdout] == ["a", "c"] and "someone-else" in results[1].stderr


def test_run_many_with_no_server_gives_sandbox_errors_not_an_exception() -> None:
    (results,) = run_many_with(None, [dead_url()], ["print(1)", "print(2)"], retries=1)
    assert [r.status for r in results] == [ExecStatus.SANDBOX_ERROR] * 2
    assert all("after 2 attempts" in r.stderr for r in results)


def only_run_code_app(extra_get_run_batch: bool):
    """A tiny FastAPI server with only ``/run_code`` (as SandboxFusion), optionally a GET-only ``/run_batch``."""
    from fastapi import FastAPI

    app = FastAPI()
    app.state.run_code_calls = 0

    @app.post("/run_code")
    async def run_code(body: dict) -> dict:
        app.state.run_code_calls += 1
        return code_answer(body)

    if extra_get_run_batch:

        @app.get("/run_batch")
        async def run_batch_get() -> dict:
            return {}
    return app


@pytest.mark.parametrize("get_only", [False, True], ids=["404", "405"])
def test_run_many_falls_back_to_run_code_on_a_server_without_run_batch(get_only: bool) -> None:
    app = only_run_code_app(get_only)
    codes = [f"print({i})" for i in range(5)]
    first, second = run_many_with(httpx.ASGITransport(app=app), ["http://sf:1"], codes, calls=2)
    assert [r.stdout for r in first] == [r.stdout for r in second] == codes
    assert all(r.ok for r in first + second) and app.state.run_code_calls == 10


def test_run_many_remembers_per_url_which_server_has_no_run_batch() -> None:
    hits: list[tuple[str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        host, path = request.url.host, request.url.path
        hits.append((host, path))
        if path == "/health":  # "a" is a SandboxFusion (no /health); "b" reports a queue of 2
            return httpx.Response(404) if host == "a" else httpx.Response(200, json={"status": "ok", "queue_size": 2,
                                                                                     "workers": 1})
        body = json.loads(request.content)
        if path == "/run_batch":
            return httpx.Response(404) if host == "a" else httpx.Response(200, json=batch_answer(body))
        return httpx.Response(200, json=code_answer(body))

    codes = [f"c{i}" for i in range(5)]
    first, second = run_many_with(httpx.MockTransport(handler), ["http://a:1", "http://b:2"], codes, calls=2)
    assert [r.stdout for r in first] == [r.stdout for r in second] == codes
    assert hits.count(("a", "/run_batch")) == 1  # learned once, never asked again
    assert hits.count(("a", "/health")) == hits.count(("b", "/health")) == 1
    # Second call: only "b" gets batches, in chunks of its queue size (2 + 2 + 1).
    tail = hits[len(hits) - 3:]
    assert tail == [("b", "/run_batch")] * 3


def metric_counts(server: Server) -> tuple[int, int, int]:
    m = server.metrics()
    return m["requests"].get("run_batch", 0), m["requests"].get("run_code", 0), m["rejected_429"]


def test_run_many_batches_keep_order_of_ok_error_and_timeout(sandbox_server: Server) -> None:
    codes = ["print('first')", "raise ValueError('bad')", "while True:\n    pass", "print(6 * 7)",
             "import sys\nsys.exit(3)", "print('last')"]
    before = metric_counts(sandbox_server)

    async def many() -> list:
        async with SandboxClient(sandbox_server.url) as client:
            return await client.run_many(codes, run_timeout=1.0)

    results = asyncio.run(many())
    after = metric_counts(sandbox_server)
    assert [r.status for r in results] == [ExecStatus.OK, ExecStatus.ERROR, ExecStatus.TIMEOUT, ExecStatus.OK,
                                           ExecStatus.ERROR, ExecStatus.OK]
    assert [results[0].stdout, results[3].stdout, results[5].stdout] == ["first\n", "42\n", "last\n"]
    assert "ValueError: bad" in results[1].stderr and results[4].return_code == 3
    chunks = math.ceil(len(codes) / (sandbox_server.health["queue_size"] // 4))
    assert (after[0] - before[0], after[1] - before[1]) == (chunks, 0)  # only /run_batch, no /run_code


def test_run_many_splits_a_batch_larger_than_the_server_queue(sandbox_server: Server) -> None:
    queue = sandbox_server.health["queue_size"]
    codes = [f"print({i} * {i})" for i in range(2 * queue + 3)]
    before = metric_counts(sandbox_server)

    async def many() -> list:
        async with SandboxClient(sandbox_server.url) as client:
            return await client.run_many(codes)

    results = asyncio.run(many())
    after = metric_counts(sandbox_server)
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(len(codes))]
    chunks = math.ceil(len(codes) / (queue // 4))  # chunks of a quarter of the queue
    assert (after[0] - before[0], after[1] - before[1], after[2] - before[2]) == (chunks, 0, 0)  # no 429
