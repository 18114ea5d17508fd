"""The HTTP service against a real server process: the SandboxFusion contract, batching, overload, health."""

from __future__ import annotations

import asyncio
import os
import socket
import signal
import time
from collections.abc import Iterator

import httpx
import pytest

from sandbox import ExecStatus, local_sandbox
from sandbox.bounds import MAX_BODY_BYTES, batch_share
from tests.sandbox.conftest import BYPASS, QUEUE_SIZE, WORKERS, Server

RUN_RESULT_KEYS = {"status", "execution_time", "return_code", "stdout", "stderr"}
RESPONSE_KEYS = {"status", "message", "compile_result", "run_result", "executor_pod_name", "files", "request_id",
                 "details"}


def py(code: str, **fields: object) -> dict:
    """A ``/run_code`` request body: SandboxFusion's API requires ``language``."""
    return {"language": "python", "code": code, **fields}


def post(server: Server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=30, trust_env=False)


def test_run_code_response_has_sandboxfusion_shape_and_echoes_request_id(sandbox_server: Server) -> None:
    answer = post(sandbox_server, "/run_code", {"code": "print(1 + 1)", "language": "python", "run_timeout": 3,
                                                "memory_limit_MB": -1, "request_id": "req-42"})
    assert answer.status_code == 200
    body = answer.json()
    assert set(body) == RESPONSE_KEYS
    assert (body["status"], body["request_id"], body["compile_result"], body["files"]) == ("Success", "req-42",
                                                                                           None, {})
    run = body["run_result"]
    assert set(run) == RUN_RESULT_KEYS
    assert (run["status"], run["return_code"], run["stdout"], run["stderr"]) == ("Finished", 0, "2\n", "")
    assert isinstance(run["execution_time"], float) and 0 < run["execution_time"] < 3


def test_failing_snippet_is_failed_finished_with_its_traceback(sandbox_server: Server) -> None:
    body = post(sandbox_server, "/run_code", {"code": "x = 1\n1 / 0", "language": "python"}).json()
    assert (body["status"], body["run_result"]["status"], body["run_result"]["return_code"]) == ("Failed",
                                                                                                 "Finished", 1)
    assert body["run_result"]["stderr"].endswith('line 2, in <module>\nZeroDivisionError: division by zero\n')


def test_timeout_is_time_limit_exceeded(sandbox_server: Server) -> None:
    body = post(sandbox_server, "/run_code", py("while True: pass", run_timeout=0.3)).json()
    assert (body["status"], body["run_result"]["status"]) == ("Failed", "TimeLimitExceeded")
    assert body["run_result"]["return_code"] is None  # SandboxFusion's null, not the kill's -9


def test_unsupported_language_is_failed_naming_it(sandbox_server: Server) -> None:
    body = post(sandbox_server, "/run_code", {"code": "console.log(1)", "language": "nodejs"}).json()
    assert (body["status"], body["run_result"], body["details"]["reason"]) == ("Failed", None, "invalid_request")
    assert "'nodejs' is not supported" in body["message"]


def test_run_timeout_above_the_server_max_is_clamped_and_said(sandbox_server: Server) -> None:
    body = post(sandbox_server, "/run_code", {"language": "python", "code": "print(3)", "run_timeout": 10_000}).json()
    assert body["status"] == "Success"
    assert "clamped to the server's max_run_timeout 60 s" in body["message"]


def test_missing_code_is_rejected_naming_the_field(sandbox_server: Server) -> None:
    answer = post(sandbox_server, "/run_code", {"language": "python"})
    assert answer.status_code == 422
    assert answer.json()["detail"][0]["loc"] == ["body", "code"]


def test_run_batch_answers_in_request_order(sandbox_server: Server) -> None:
    codes = [f"import time\ntime.sleep({0.05 * (5 - i)})\nprint({i})" for i in range(5)]
    answer = post(sandbox_server, "/run_batch", {"requests": [py(c, request_id=i) for i, c in
                                                              enumerate(codes)]})
    results = answer.json()["results"]
    assert [r["run_result"]["stdout"] for r in results] == [f"{i}\n" for i in range(5)]
    assert [r["request_id"] for r in results] == list(range(5))


def test_batch_larger_than_the_queue_is_refused_with_the_fix(sandbox_server: Server) -> None:
    answer = post(sandbox_server, "/run_batch", {"requests": [py("pass")] * (QUEUE_SIZE + 1)})
    assert answer.status_code == 413
    assert "split it or raise --queue_size" in answer.json()["detail"]


def test_overload_gives_429s_no_5xx_and_answers_every_accepted_request(sandbox_server: Server) -> None:
    n = 4 * QUEUE_SIZE
    rejected_before = sandbox_server.metrics()["rejected_429"]

    async def fire() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=n)
        async with httpx.AsyncClient(limits=limits, timeout=60, trust_env=False) as http:
            return await asyncio.gather(*(http.post(sandbox_server.url + "/run_code", json=py(
                f"import time\ntime.sleep(1.0)\nprint({i})", request_id=i)) for i in range(n)))

    answers = asyncio.run(fire())
    codes = [a.status_code for a in answers]
    assert set(codes) <= {200, 429}, codes
    busy = [a for a in answers if a.status_code == 429]
    # All n arrive within the first snippets' 1 s, so most find the queue full (a few slip in as early ones end).
    assert len(busy) >= n // 2, codes
    assert all(int(a.headers["Retry-After"]) >= 1 for a in busy)
    for i, answer in enumerate(answers):
        if answer.status_code == 200:
            body = answer.json()
            assert (body["status"], body["request_id"], body["run_result"]["stdout"]) == ("Success", i, f"{i}\n")
    assert sandbox_server.metrics()["rejected_429"] - rejected_before == len(busy)


def test_health_lists_every_protection_and_the_ones_that_are_off(sandbox_server: Server) -> None:
    health = sandbox_server.health_now()
    assert health["status"] == "ok" and health["workers_alive"] == WORKERS
    expected = {"network_namespace", "mount_namespace", "minimal_root", "readonly_root", "private_tmpfs",
                "pid_namespace", "uid_drop", "rlimits", "no_new_privs"}
    assert expected <= set(health["protections"])
    minimal = health["protections"]["minimal_root"] == "on"
    assert health["filesystem_view"] == ("minimal" if minimal else "host")
    assert (health["filesystem_view_reason"] is None) == minimal  # never "host" without the reason
    assert health["protections_off"] == sorted(k for k, v in health["protections"].items() if v != "on")
    if os.geteuid() != 0:
        assert "uid_drop" in health["protections_off"]


def test_metrics_count_results_and_kills_by_reason(sandbox_server: Server) -> None:
    before = sandbox_server.metrics()
    post(sandbox_server, "/run_code", {"language": "python", "code": "import time\ntime.sleep(5)", "run_timeout": 0.2})
    post(sandbox_server, "/run_code", {"language": "python", "code": "print(1)"})
    after = sandbox_server.metrics()
    assert after["kills"].get("timeout", 0) - before["kills"].get("timeout", 0) == 1
    assert after["results"].get("ok", 0) - before["results"].get("ok", 0) == 1
    assert after["requests"]["run_code"] - before["requests"]["run_code"] == 2
    assert after["latency"]["count"] >= 2 and after["latency"]["p50_ms"] > 0


def test_per_request_memory_limit_applies(sandbox_server: Server) -> None:
    code = "x = bytearray(300 * 2**20)\nprint(len(x) // 2**20)"
    assert sandbox_server.run(code, memory_limit_mb=64).status is ExecStatus.MEMORY
    assert sandbox_server.run(code, memory_limit_mb=512).stdout == "300\n"


def test_a_killed_worker_is_replaced_and_the_service_goes_on(sandbox_server: Server) -> None:
    restarts = sandbox_server.metrics()["worker_restarts"]
    with open(f"/proc/{sandbox_server.pid}/task/{sandbox_server.pid}/children") as f:
        victim = int(f.read().split()[0])
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and sandbox_server.metrics()["worker_restarts"] == restarts:
        time.sleep(0.2)
    assert sandbox_server.metrics()["worker_restarts"] == restarts + 1
    assert sandbox_server.health_now()["workers_alive"] == WORKERS
    assert [r.stdout for r in (sandbox_server.run(f"print({i})") for i in range(4))] == ["0\n", "1\n", "2\n", "3\n"]


def test_without_isolation_the_service_starts_and_health_names_what_is_off() -> None:
    with local_sandbox(workers=1, isolate=False, preload=["math"], preamble=None, startup_timeout=60,
                       allow_imports=["*"], log_level="warning") as urls:
        health = httpx.get(urls[0] + "/health", timeout=10, trust_env=False).json()
        server = Server(urls[0], health)
        answer = post(server, "/run_code", {"language": "python", "code": "print(6 * 7)"}).json()
        nest = ("import os\nos.chmod('.', 0o500)\nos.chmod('.', 0o700)\n"
                "for _ in range(1200):\n    os.mkdir('d')\n    os.chdir('d')")
        check = "import os\nprint(oct(os.stat('.').st_mode & 0o777), os.listdir('.'))"
        answers = [post(server, "/run_code", py(code)).json()["run_result"] for code in (nest, check)]
    assert [a["stdout"] for a in answers] == ["", "0o700 []\n"], answers  # rm -rf, not a recursive walk
    assert health["protections"]["fresh_run_dir_tmpfs"] == "off: disabled by --isolate false"
    assert {"network_namespace", "pid_namespace", "readonly_root", "uid_drop"} <= set(health["protections_off"])
    assert health["protections"]["uid_drop"] == "off: disabled by --isolate false"
    assert (health["filesystem_view"], health["filesystem_view_reason"]) == ("host", "disabled by --isolate false")
    assert answer["run_result"]["stdout"] == "42\n"


@pytest.mark.parametrize(("code", "status"), [
    (BYPASS + "o.write(3, b'memory')\nprint('fine')", ExecStatus.OK),
    (BYPASS + "o.write(3, b'memory')\nraise ValueError('not memory')", ExecStatus.ERROR),
])
def test_a_forged_memory_status_is_ignored(sandbox_server: Server, code: str, status: ExecStatus) -> None:
    kills = sandbox_server.metrics()["kills"].get("memory", 0)
    assert sandbox_server.run(code).status is status
    assert sandbox_server.metrics()["kills"].get("memory", 0) == kills


def _raw_exchange(server: Server, request: bytes) -> bytes:
    """Send ``request`` on a fresh connection and return the status line of the answer."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(request)
        return conn.makefile("rb").readline()


def test_a_body_declared_over_the_limit_gets_413_before_a_byte_of_it_is_sent(sandbox_server: Server) -> None:
    head = (b"POST /run_code HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {MAX_BODY_BYTES + 1}\r\n\r\n".encode())
    assert _raw_exchange(sandbox_server, head).split()[1] == b"413"  # answered with none of the body sent


def test_a_chunked_body_over_the_limit_gets_413(sandbox_server: Server) -> None:
    def chunks() -> Iterator[bytes]:  # no Content-Length: httpx sends it chunked
        yield b'{"code": "'
        for _ in range(MAX_BODY_BYTES // 2**20 + 1):
            yield b"#" * 2**20
        yield b'"}'

    answer = httpx.post(sandbox_server.url + "/run_code", content=chunks(), timeout=60, trust_env=False,
                        headers={"content-type": "application/json"})
    assert answer.status_code == 413 and "request body over" in answer.json()["detail"], answer.text


def test_a_batch_counts_every_entry_the_unsupported_ones_too(sandbox_server: Server) -> None:
    entries = [{"code": "pass", "language": "cpp"}] * (QUEUE_SIZE + 1)
    assert post(sandbox_server, "/run_batch", {"requests": entries}).status_code == 413


def test_a_lone_surrogate_request_id_is_a_clean_422_and_runs_nothing(sandbox_server: Server) -> None:
    before = sandbox_server.metrics()["results"]
    body = b'{"code": "print(1)", "request_id": "\\ud800"}'
    answer = httpx.post(sandbox_server.url + "/run_code", content=body, timeout=30, trust_env=False,
                        headers={"content-type": "application/json"})
    assert answer.status_code == 422 and "request_id must be valid UTF-8" in answer.text, answer.text
    assert sandbox_server.metrics()["results"] == before


def test_a_batch_leaves_a_worker_for_other_requests(sandbox_server: Server) -> None:
    async def busy_while_a_batch_runs() -> set[int]:
        busy: set[int] = set()
        async with httpx.AsyncClient(timeout=60, trust_env=False) as http:
            sleepy = [{"language": "python", "code": "import time\ntime.sleep(0.2)"}] * (QUEUE_SIZE - 2)
            task = asyncio.ensure_future(http.post(sandbox_server.url + "/run_batch", json={"requests": sleepy}))
            while not task.done():  # sampled until the batch is answered: it holds at most all workers but one
                busy.add((await http.get(sandbox_server.url + "/metrics")).json()["busy_workers"])
                await asyncio.sleep(0.02)
            assert task.result().is_success
        return busy

    assert max(asyncio.run(busy_while_a_batch_runs())) == WORKERS - 1


def test_a_batch_of_queue_size_entries_leaves_room_for_run_code(sandbox_server: Server) -> None:
    """A batch takes queue room one entry at a time as each runs: reserving the whole queue at once would make
    every /run_code a 429 while a worker sits idle."""
    async def run_code_while_a_full_batch_runs() -> tuple[int, httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(timeout=60, trust_env=False) as http:
            sleepy = [{"language": "python", "code": "import time\ntime.sleep(0.3)"}] * QUEUE_SIZE
            batch = asyncio.ensure_future(http.post(sandbox_server.url + "/run_batch", json={"requests": sleepy}))
            in_flight = 0
            while not in_flight:  # the batch is running
                in_flight = (await http.get(sandbox_server.url + "/metrics")).json()["in_flight"]
            single = await http.post(sandbox_server.url + "/run_code", json=py("print(1+1)"))
            return in_flight, single, await batch

    in_flight, single, batch = asyncio.run(run_code_while_a_full_batch_runs())
    assert single.status_code == 200 and single.json()["run_result"]["stdout"] == "2\n", single.text
    assert in_flight <= batch_share(WORKERS), in_flight
    assert batch.status_code == 200 and [r["status"] for r in batch.json()["results"]] == ["Success"] * QUEUE_SIZE


def test_two_batches_at_once_leave_a_worker_for_run_code(sandbox_server: Server) -> None:
    """With a cap per batch (all workers but one), two batches at once would hold every worker; /run_code would wait."""
    async def while_two_batches_run() -> tuple[set[int], httpx.Response, list[httpx.Response]]:
        busy: set[int] = set()
        async with httpx.AsyncClient(timeout=60, trust_env=False) as http:
            async def metrics() -> dict:
                return (await http.get(sandbox_server.url + "/metrics")).json()

            done_before = sum((await metrics())["results"].values())
            sleepy = [{"language": "python", "code": "import time\ntime.sleep(0.3)"}] * (QUEUE_SIZE // 2)
            batches = [asyncio.ensure_future(http.post(sandbox_server.url + "/run_batch", json={"requests": sleepy}))
                       for _ in range(2)]
            while True:  # sampled until three batch entries have ended: both batches are under way
                now = await metrics()
                busy.add(now["busy_workers"])
                if sum(now["results"].values()) - done_before >= 3:
                    break
                await asyncio.sleep(0.02)
            single = await http.post(sandbox_server.url + "/run_code", json=py("print(1+1)"))
            return busy, single, list(await asyncio.gather(*batches))

    busy, single, batches = asyncio.run(while_two_batches_run())
    assert max(busy) <= batch_share(WORKERS), busy
    assert single.status_code == 200 and single.json()["run_result"]["stdout"] == "2\n", single.text
    assert all(b.status_code == 200 for b in batches)


def test_a_killed_zygote_loses_no_job_and_its_worker_is_replaced(sandbox_server: Server) -> None:
    restarts = sandbox_server.metrics()["worker_restarts"]
    with open(f"/proc/{sandbox_server.pid}/task/{sandbox_server.pid}/children") as f:
        worker = int(f.read().split()[0])
    with open(f"/proc/{worker}/task/{worker}/children") as f:
        os.kill(int(f.read().split()[0]), signal.SIGKILL)  # the worker's only child: its zygote
    runs = range(2 * WORKERS)  # one of them reaches the worker without a zygote, and runs on another
    assert [sandbox_server.run(f"print({i})").stdout for i in runs] == [f"{i}\n" for i in runs]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and sandbox_server.health_now()["workers_alive"] < WORKERS:
        time.sleep(0.2)
    assert sandbox_server.metrics()["worker_restarts"] == restarts + 1


OVERSIZED_BYTES = 96 * 2**20  # 6x the body limit


def _post_declared(server: Server, size: int) -> bytes:
    """POST a ``size``-byte body with its Content-Length, sending it whole unless the server hangs up first."""
    host, port = server.url.removeprefix("http://").split(":")
    head = (b"POST /run_code HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {size}\r\n\r\n".encode())
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(head)
        try:
            block = b"#" * 2**20
            for _ in range(size // len(block)):
                conn.sendall(block)
        except OSError:  # the server answered and closed the connection
            pass
        return conn.makefile("rb").readline()


def test_oversized_bodies_do_not_grow_the_servers_memory(sandbox_server: Server) -> None:
    """Two declared and two chunked 96 MiB bodies: refused before they are read whole, so the server's peak RSS
    stays within the one chunked body it buffers up to the 16 MiB limit (a margin of 40 MiB; reading one body whole
    would add at least 96 MiB)."""
    sandbox_server.reset_peak_rss()
    before = sandbox_server.peak_rss_bytes()

    def chunks() -> Iterator[bytes]:
        yield b'{"code": "'
        for _ in range(OVERSIZED_BYTES // 2**20):
            yield b"#" * 2**20
        yield b'"}'

    statuses = [_post_declared(sandbox_server, OVERSIZED_BYTES).split()[1] for _ in range(2)]
    statuses += [str(httpx.post(sandbox_server.url + "/run_code", content=chunks(), timeout=60, trust_env=False,
                                headers={"content-type": "application/json"}).status_code).encode()
                 for _ in range(2)]
    growth = sandbox_server.peak_rss_bytes() - before
    assert growth < 40 * 2**20, f"the server's peak RSS grew by {growth / 2**20:.1f} MiB"
    assert statuses == [b"413"] * 4


def test_a_connection_that_sends_no_whole_head_is_closed_and_a_slow_answer_is_not_cut() -> None:
    """uvicorn alone never closes a connection that sends nothing (or half a head): each holds a capped connection."""
    with local_sandbox(workers=1, preload=[], preamble=None, allow_imports=["*"], head_timeout=1.0,
                       startup_timeout=90, log_level="warning") as urls:
        port = int(urls[0].rsplit(":", 1)[1])
        silent = socket.create_connection(("127.0.0.1", port), timeout=30)
        half = socket.create_connection(("127.0.0.1", port), timeout=30)
        half.sendall(b"POST /run_code HTTP/1.1\r\nHost: sandbox\r\n")
        slow = httpx.post(urls[0] + "/run_code", json=py("import time\ntime.sleep(2.0)\nprint(1+1)"),
                          timeout=30, trust_env=False)  # answered after the head timeout: not cut
        with silent, half:
            assert (silent.recv(1024), half.recv(1024)) == (b"", b"")  # closed by the server, not by our timeout
        assert slow.status_code == 200 and slow.json()["run_result"]["stdout"] == "2\n", slow.text
        benign = httpx.post(urls[0] + "/run_code", json=py("print(1+1)"), timeout=30, trust_env=False)
        assert benign.json()["run_result"]["stdout"] == "2\n"
