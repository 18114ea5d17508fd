"""Hostile-by-accident snippets against a real server process: one property per test.

The last test checks the server after all the others ran (pytest keeps file order), so run this file as a whole.
"""

from __future__ import annotations

import ast
import os
import socket
import tempfile
import time

import httpx
import pytest

from sandbox import ExecStatus, format_for_model
from tests.sandbox.conftest import MAX_OUTPUT_BYTES, SECRET_VALUE, WORKERS, Server, wait_for_no_leftovers

LIMIT_SLACK_S = 0.5


def test_infinite_loop_is_killed_within_half_a_second_of_the_limit(sandbox_server: Server) -> None:
    result = sandbox_server.run("while True:\n    pass", run_timeout=1.0)
    assert result.status is ExecStatus.TIMEOUT
    assert 1.0 <= result.wall_time <= 1.0 + LIMIT_SLACK_S, result


def test_sleep_is_killed_within_half_a_second_of_the_limit(sandbox_server: Server) -> None:
    result = sandbox_server.run("import time\nprint('before', flush=True)\ntime.sleep(100)", run_timeout=1.0)
    assert result.status is ExecStatus.TIMEOUT
    assert 1.0 <= result.wall_time <= 1.0 + LIMIT_SLACK_S, result
    assert result.stdout == "before\n"  # output printed before the kill is kept


def test_10gb_allocation_is_a_memory_error_and_the_service_lives(sandbox_server: Server) -> None:
    result = sandbox_server.run("x = bytearray(10 * 2**30)\nprint(len(x))")
    assert result.status is ExecStatus.MEMORY, result
    assert sandbox_server.run("print(1 + 1)").stdout == "2\n"


def test_fork_bomb_is_contained_and_gone_two_seconds_later(sandbox_server: Server) -> None:
    sandbox_server.require("uid_drop")  # RLIMIT_NPROC only holds for a non-root uid
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    result = sandbox_server.run(bomb, run_timeout=1.0)
    assert result.status in (ExecStatus.TIMEOUT, ExecStatus.KILLED), result
    time.sleep(2.0)
    assert wait_for_no_leftovers(sandbox_server, timeout=0.0) == []


def test_connection_to_a_host_tcp_server_fails(sandbox_server: Server) -> None:
    sandbox_server.require("network_namespace")
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        code = ("import socket\n"
                "try:\n"
                f"    socket.create_connection(('127.0.0.1', {port}), timeout=1.0)\n"
                "    print('CONNECTED')\n"
                "except OSError as e:\n"
                "    print('FAILED', type(e).__name__)\n")
        result = sandbox_server.run(code)
        listener.setblocking(False)
        try:
            listener.accept()  # a completed handshake would wait here in the backlog
            reached = True
        except BlockingIOError:
            reached = False
    assert result.ok, result
    assert result.stdout.startswith("FAILED"), result
    assert not reached


def test_snippet_sees_no_interface_but_loopback(sandbox_server: Server) -> None:
    sandbox_server.require("network_namespace")
    result = sandbox_server.run("import socket\nprint(socket.if_nameindex())")
    assert result.ok, result
    assert [name for _, name in ast.literal_eval(result.stdout)] == ["lo"]


def test_write_outside_the_temp_dir_fails_and_the_target_is_unchanged(sandbox_server: Server) -> None:
    sandbox_server.require("readonly_root")
    folder = tempfile.mkdtemp(prefix="zerotir-sandbox-target-")
    target = os.path.join(folder, "target.txt")
    try:
        os.chmod(folder, 0o777)  # world-writable, so only the read-only view can stop the write
        with open(target, "w") as f:
            f.write("original")
        os.chmod(target, 0o666)
        code = (f"for path in [{target!r}, {os.path.join(folder, 'new.txt')!r}]:\n"
                "    try:\n"
                "        open(path, 'w').write('changed')\n"
                "        print('WROTE', path)\n"
                "    except OSError:\n"  # read-only (host view) or not there at all (minimal root)
                "        print('REFUSED')\n")
        result = sandbox_server.run(code)
        with open(target) as f:
            content = f.read()
        assert result.stdout.splitlines() == ["REFUSED", "REFUSED"], result
        assert content == "original"
        assert os.listdir(folder) == ["target.txt"]
    finally:
        for name in os.listdir(folder):
            os.unlink(os.path.join(folder, name))
        os.rmdir(folder)


def test_snippet_can_write_and_read_its_own_temp_dir(sandbox_server: Server) -> None:
    code = ("import os, tempfile\n"
            "path = os.path.join(tempfile.gettempdir(), 'scratch.txt')\n"
            "open(path, 'w').write('x' * 1000)\n"
            "print(len(open(path).read()), os.path.dirname(path) == os.getcwd())\n")
    result = sandbox_server.run(code)
    assert result.stdout == "1000 True\n", result


def test_a_stdlib_module_no_worker_preloaded_imports_as_the_sandbox_uid(sandbox_server: Server) -> None:
    # `wave` is in no preload list and nothing the worker imports needs it, so this reads it from disk as the uid.
    result = sandbox_server.run("import os, sys\nassert 'wave' not in sys.modules\nimport wave\n"
                                "print(wave.__name__, os.getuid() != 0)")
    assert result.stdout == "wave True\n", result


def test_server_environment_secret_is_not_visible(sandbox_server: Server) -> None:
    sandbox_server.require("uid_drop")  # without it the snippet could read the server's /proc/<pid>/environ
    code = ("import os\n"
            "print(dict(os.environ))\n"
            f"for path in ['/proc/self/environ', '/proc/1/environ', '/proc/{sandbox_server.pid}/environ']:\n"
            "    try:\n"
            "        print(open(path, 'rb').read())\n"
            "    except OSError as e:\n"
            "        print(path, type(e).__name__)\n")
    result = sandbox_server.run(code)
    assert result.ok, result
    assert "PATH" in result.stdout  # the snippet did print its environment
    assert SECRET_VALUE not in result.stdout + result.stderr
    assert SECRET_VALUE in os.environ.values()  # ...while the server was started with it


def test_killing_the_parent_takes_down_neither_worker_nor_server(sandbox_server: Server) -> None:
    restarts = sandbox_server.metrics()["worker_restarts"]
    result = sandbox_server.run("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('alive')")
    assert result.status in (ExecStatus.OK, ExecStatus.ERROR), result  # EPERM, or a no-op kill(0) as namespace init
    assert sandbox_server.run("print(1 + 1)").stdout == "2\n"
    assert sandbox_server.metrics()["worker_restarts"] == restarts


@pytest.mark.parametrize(("stream", "letter", "code"), [
    ("stdout", "x", "for _ in range(10):\n    print('x' * 1_000_000)"),
    ("stderr", "y", "import sys\nfor _ in range(10):\n    sys.stderr.write('y' * 1_000_000 + '\\n')"),
], ids=["stdout", "stderr"])
def test_10mb_of_output_returns_capped_output_with_a_marker(sandbox_server: Server, stream: str, letter: str,
                                                            code: str) -> None:
    result = sandbox_server.run(code)
    assert result.ok, result
    text, other = (result.stdout, result.stderr) if stream == "stdout" else (result.stderr, result.stdout)
    assert len(text.encode()) <= MAX_OUTPUT_BYTES + 100
    assert "bytes of output omitted by the sandbox" in text
    assert text.startswith(letter * 4) and text.endswith(letter * 4 + "\n")
    assert other == ""


def test_double_forked_daemon_does_not_survive_its_call(sandbox_server: Server) -> None:
    code = ("import os, time\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    if os.fork() == 0:\n"
            "        open('daemon_started', 'w').close()\n"
            "        time.sleep(60)\n"
            "    os._exit(0)\n"
            "while not os.path.exists('daemon_started'):\n"
            "    time.sleep(0.01)\n"
            "print('daemon running')\n")
    result = sandbox_server.run(code)
    assert result.stdout == "daemon running\n", result
    assert wait_for_no_leftovers(sandbox_server, timeout=1.0) == []


def test_disallowed_import_returns_a_clear_error(sandbox_server: Server) -> None:
    result = sandbox_server.run("import math\nimport shutil\nprint('ran')")
    assert result.status is ExecStatus.ERROR
    assert result.stdout == ""  # refused before anything ran
    shown = format_for_model(result)
    assert 'File "<snippet>", line 2' in shown
    assert "ImportError: import of module 'shutil' is not allowed in this sandbox. Allowed modules:" in shown


def test_refused_call_returns_a_clear_error(sandbox_server: Server) -> None:
    result = sandbox_server.run("print(eval('1 + 1'))")
    assert result.status is ExecStatus.ERROR
    assert "PermissionError: calling eval() is not allowed in this sandbox" in result.stderr


def test_after_the_adversarial_suite_the_server_answers_and_no_child_is_left(sandbox_server: Server) -> None:
    assert sandbox_server.run("print(1+1)").stdout == "2\n"
    assert wait_for_no_leftovers(sandbox_server, timeout=1.0) == []
    metrics = sandbox_server.metrics()
    assert metrics["busy_workers"] == 0 and metrics["in_flight"] == 0
    assert sandbox_server.health_now()["workers_alive"] == WORKERS


def test_a_600_term_sum_answers_600_with_no_worker_lost(sandbox_server: Server) -> None:
    restarts = sandbox_server.metrics()["worker_restarts"]
    result = sandbox_server.run("print(" + "+".join(["1"] * 600) + ")")
    assert (result.status, result.stdout) == (ExecStatus.OK, "600\n"), result
    assert sandbox_server.metrics()["worker_restarts"] == restarts


def test_a_sum_too_deep_to_compile_is_the_snippets_error_not_the_sandboxes(sandbox_server: Server) -> None:
    restarts = sandbox_server.metrics()["worker_restarts"]
    result = sandbox_server.run("print(" + "+".join(["1"] * 2000) + ")")
    assert result.status is ExecStatus.ERROR and "RecursionError" in result.stderr, result
    assert sandbox_server.metrics()["worker_restarts"] == restarts


def test_a_1mb_refusal_flood_answers_briefly_and_the_service_goes_on(sandbox_server: Server) -> None:
    restarts = sandbox_server.metrics()["worker_restarts"]
    for _ in range(1):  # one such request used to lose a worker for good (two: every later request hung)
        result = sandbox_server.run("import " + ",".join(["a"] * 499_000), run_timeout=10.0)  # under the 1 MB cap
        assert result.status is ExecStatus.ERROR, result
        assert result.stderr.count("Allowed modules:") == 1 and len(result.stderr) < 4096, result.stderr[:300]
        assert result.stderr.endswith("(499000 in all)\n"), result.stderr[-300:]
    assert sandbox_server.run("print(7)").stdout == "7\n"
    assert sandbox_server.metrics()["worker_restarts"] == restarts


#: Four children, each trying to fork eight more that sleep: 36 processes if each process had its own budget.
FORK_TREE = """
import os, time
r, w = os.pipe()
children = 0
for _ in range(4):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        n = 0
        for _ in range(8):
            try:
                if os.fork() == 0:
                    time.sleep(60)
                    os._exit(0)
                n += 1
            except OSError:
                pass
        os.write(w, bytes([n]))
        time.sleep(60)
        os._exit(0)
    children += 1
grandchildren = b""
while len(grandchildren) < children:
    grandchildren += os.read(r, 4)
print(children + sum(grandchildren))
"""


def test_a_snippets_forks_share_one_process_budget(sandbox_server: Server) -> None:
    """max_processes counts the snippet and everything it forks together (the snippet uid's RLIMIT_NPROC)."""
    sandbox_server.require("uid_drop")
    result = sandbox_server.run(FORK_TREE)
    max_processes = sandbox_server.health["limits"]["max_processes"]
    assert result.status is ExecStatus.OK, result
    assert 0 < int(result.stdout) <= max_processes - 1  # the snippet itself is one of them
    assert wait_for_no_leftovers(sandbox_server, timeout=1.0) == []


SPINNERS = """
import os
for _ in range(3):
    if os.fork() == 0:
        break
print("spinning", flush=True)
while True:
    pass
"""


def test_a_snippets_spinning_forks_end_with_it_at_its_time_limit(sandbox_server: Server) -> None:
    """CPU is spent on one whole-snippet budget, the time limit: at it every process of the snippet is killed, long
    before any would reach its own RLIMIT_CPU (run_timeout + 2 s of CPU each, 12 s for the four of them)."""
    result = sandbox_server.run(SPINNERS, run_timeout=1.0)
    assert result.status is ExecStatus.TIMEOUT and result.stdout.count("spinning") == 4, result
    assert result.limits_hit[:1] == ("time",)  # and "cpu" after it where a cgroup throttled the four
    assert wait_for_no_leftovers(sandbox_server, timeout=1.0) == []


#: Every int held by a local of a frame above the snippet's own: what a snippet reaches by walking up its stack.
FRAME_WALK = """
import sys
frame, found = sys._getframe().f_back, []
while frame is not None:
    found += [(frame.f_code.co_name, name, value) for name, value in frame.f_locals.items()
              if type(value) is int]
    frame = frame.f_back
print(found)
"""


def test_a_snippet_walking_its_frames_finds_nothing_of_the_previous_snippet(sandbox_server: Server) -> None:
    """A previous child's wait status kept in the zygote's loop frame is an exit code the next snippet can read."""
    for _ in range(WORKERS):  # sequential requests take the idle workers in turn: each one's last child exits 123
        assert sandbox_server.run("raise SystemExit(123)").return_code == 123
    for _ in range(WORKERS):
        result = sandbox_server.run(FRAME_WALK)
        assert result.ok, result
        found = ast.literal_eval(result.stdout)
        assert found and not [hit for hit in found if hit[2] in (123, 123 << 8)], found
    assert sandbox_server.run("print(1+1)").stdout == "2\n"


def test_a_megabyte_of_statements_spends_its_own_time_limit_not_the_workers(sandbox_server: Server) -> None:
    """1 MB of ``a;a;a;...`` costs a parser and compiler 10-18 s and ~900 MB: in the worker, with no bound, it would
    be declared hung and replaced. Compiled in the child, it ends at its own time limit (or memory budget)."""
    restarts = sandbox_server.metrics()["worker_restarts"]
    result = sandbox_server.run(";".join(["a"] * 499_000), run_timeout=1.0, memory_limit_mb=256)
    assert result.status in (ExecStatus.TIMEOUT, ExecStatus.MEMORY), result
    assert result.wall_time <= 1.0 + LIMIT_SLACK_S + 1.0, result  # + sending and reading 1 MB
    assert sandbox_server.run("print(1+1)").stdout == "2\n"
    assert sandbox_server.metrics()["worker_restarts"] == restarts


@pytest.mark.parametrize("padding", ["", "#" * 2000 + "\n"], ids=["compiled-by-the-worker", "compiled-by-the-child"])
def test_a_refusal_a_syntax_error_and_a_run_answer_alike_however_long_the_source(sandbox_server: Server,
                                                                                padding: str) -> None:
    def details(code: str) -> tuple[str, str, str]:
        body = httpx.post(sandbox_server.url + "/run_code", json={"language": "python", "code": padding + code},
                          timeout=30, trust_env=False).json()
        return body["details"]["reason"], body["run_result"]["stdout"], body["run_result"]["stderr"]

    refused, syntax, ran = details("import shutil"), details("1 +"), details("print(6 * 7)")
    assert refused[:2] == ("refused", "") and "import of module 'shutil' is not allowed" in refused[2], refused
    assert syntax[:2] == ("error", "") and "SyntaxError" in syntax[2], syntax
    assert ran == ("ok", "42\n", ""), ran
