"""SandboxFusion's own client (``sandbox-fusion`` on PyPI) against a real zerotir sandbox server: its whole
``/run_code`` API (stdin, files in, fetch_files out, timeouts, languages) and ``/v1/ping``, with the file names
confined to the snippet's run dir."""

from __future__ import annotations

import base64

import httpx
import sandbox_fusion
from sandbox_fusion import RunCodeRequest, RunCodeResponse, RunStatus, SummaryMapping

from tests.sandbox.conftest import Server


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def run(server: Server, **request: object) -> RunCodeResponse:
    """One call through SandboxFusion's client; one attempt, so an answer it would retry raises instead."""
    return sandbox_fusion.run_code(RunCodeRequest(language="python", **request), endpoint=server.url,
                                   max_attempts=1, client_timeout=30)


def test_stdin_reaches_the_snippet(sandbox_server: Server) -> None:
    answer = run(sandbox_server, code="import sys\nprint(sys.stdin.read().upper(), end='')", stdin="a b\nc\n")
    assert (answer.status, answer.run_result.return_code, answer.run_result.stdout) == (RunStatus.Success, 0,
                                                                                       "A B\nC\n")


def test_files_in_and_fetch_files_out(sandbox_server: Server) -> None:
    code = ("import os\nx, y = map(int, open('data/in.txt').read().split())\n"
            "os.makedirs('out', exist_ok=True)\nopen('out/sum.txt', 'w').write(str(x + y))\nprint('done')")
    wrapped = base64.encodebytes(b"3 4").decode()  # line-wrapped base64 (ends in a newline)
    answer = run(sandbox_server, code=code, files={"data/in.txt": wrapped, "skipped.txt": None},
                 fetch_files=["out/sum.txt", "never/written.txt"])
    assert (answer.status, answer.run_result.stdout) == (RunStatus.Success, "done\n")
    assert answer.files == {"out/sum.txt": b64("7")}  # a file the snippet did not write is left out


def test_a_timeout_has_no_return_code(sandbox_server: Server) -> None:
    answer = run(sandbox_server, code="print('started', flush=True)\nwhile True: pass", run_timeout=0.5)
    assert (answer.status, answer.run_result.status) == (RunStatus.Failed, "TimeLimitExceeded")
    assert answer.run_result.return_code is None and answer.run_result.stdout == "started\n"
    assert sandbox_fusion.summary_run_code_result(answer, SummaryMapping(RunTimeout="timeout")) == "timeout"


def test_another_language_is_failed_not_a_sandbox_error(sandbox_server: Server) -> None:
    answer = sandbox_fusion.run_code(RunCodeRequest(code="int main(){}", language="cpp"), endpoint=sandbox_server.url,
                                     max_attempts=1, client_timeout=30)
    assert (answer.status, answer.run_result, answer.compile_result) == (RunStatus.Failed, None, None)
    assert "'cpp' is not supported" in answer.message


def test_a_request_without_language_is_refused_naming_it(sandbox_server: Server) -> None:
    request = RunCodeRequest.construct(code="print(1)", run_timeout=5, files={}, fetch_files=[])  # no language
    assert "language" not in request.dict()
    answer = sandbox_fusion.run_code(request, endpoint=sandbox_server.url, max_attempts=1, client_timeout=30)
    assert (answer.status, answer.run_result) == (RunStatus.Failed, None)
    assert answer.message.startswith("language: missing")


def test_ping(sandbox_server: Server) -> None:
    answer = httpx.get(sandbox_server.url + "/v1/ping", timeout=10, trust_env=False)
    assert (answer.status_code, answer.json()) == (200, "pong")


def test_input_names_outside_the_run_dir_are_refused_before_running(sandbox_server: Server) -> None:
    for name, why in (("/tmp/x", "absolute path"), ("../x", "contains '..'"), ("a/../../x", "contains '..'")):
        answer = run(sandbox_server, code="print(1)", files={name: b64("x")})
        assert (answer.status, answer.run_result) == (RunStatus.Failed, None), name
        assert answer.message.startswith("files: ") and why in answer.message, answer.message
    answer = run(sandbox_server, code="print(1)", fetch_files=["/etc/passwd"])
    assert (answer.status, answer.run_result) == (RunStatus.Failed, None)
    assert answer.message.startswith("fetch_files: ") and "absolute path" in answer.message


def test_symlinks_out_of_the_run_dir_are_not_fetched(sandbox_server: Server) -> None:
    code = ("import os\nos.symlink('/etc/passwd', 'leak')\nos.symlink('/etc', 'etc')\n"
            "open('kept.txt', 'w').write('ok')")
    answer = run(sandbox_server, code=code, fetch_files=["leak", "etc/passwd", "kept.txt"])
    assert answer.status == RunStatus.Failed and answer.run_result.return_code == 0
    assert answer.files == {"kept.txt": b64("ok")}
    assert "'leak': is a symlink" in answer.message and "'etc/passwd': a folder on its path" in answer.message


def test_fetched_files_are_bounded_with_the_setting_named(sandbox_server: Server) -> None:
    limit = sandbox_server.health["limits"]["max_fetch_mb"] << 20
    code = f"open('big.bin', 'wb').write(b'x' * {limit + 1})\nopen('small.txt', 'w').write('s')"
    answer = run(sandbox_server, code=code, fetch_files=["small.txt", "big.bin"])
    assert answer.status == RunStatus.Failed and answer.files == {"small.txt": b64("s")}
    assert "'big.bin'" in answer.message and "--limits.max_fetch_mb" in answer.message


def test_invalid_base64_is_refused_naming_the_file(sandbox_server: Server) -> None:
    answer = run(sandbox_server, code="print(1)", files={"in.txt": "aGk=!!"})  # lenient decoding: b"hi"
    assert (answer.status, answer.run_result) == (RunStatus.Failed, None)
    assert answer.message.startswith("files['in.txt']: not valid base64")
