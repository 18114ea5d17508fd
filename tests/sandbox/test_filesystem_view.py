"""The minimal root against a real server process: what a snippet can and cannot see, one property per test.

Every snippet steps around the static check first (``BYPASS``): the file system view must hold on its own.
"""

from __future__ import annotations

import ast
import os
import stat

import pytest

from sandbox.rootfs import PROC_BATCH, RUN_DIR
from tests.sandbox.conftest import BYPASS, CHECKOUT, HostFiles, Server

CANARIES = ("tmp_canary", "cwd_canary", "data_file")


@pytest.fixture
def minimal(sandbox_server: Server) -> Server:
    """The server, after skipping the test (with the reason) where the platform cannot build the minimal root."""
    sandbox_server.require("minimal_root")
    return sandbox_server


def _attempts(path: str) -> str:
    """A snippet that tries to read ``path`` and to list its folder, printing one word for each."""
    return (BYPASS
            + f"for what, act in (('read', lambda: open({path!r}).read()),\n"
            + f"                  ('list', lambda: o.listdir({os.path.dirname(path)!r}))):\n"
            + "    try:\n"
            + "        print(what, 'GOT', act())\n"
            + "    except OSError as e:\n"
            + "        print(what, 'FAILED', type(e).__name__)\n")


def test_health_reports_the_minimal_view_without_the_checkout_or_host_tmp(minimal: Server,
                                                                           host_files: HostFiles) -> None:
    health = minimal.health_now()
    assert (health["filesystem_view"], health["filesystem_view_reason"]) == ("minimal", None)
    exposed = [p.split(" ")[0] for p in health["exposed_paths"]["read_only"]]
    assert host_files.extra_ro in exposed
    for hidden in (CHECKOUT, os.path.dirname(host_files.tmp_canary), "/tmp", "/home", "/sys"):
        assert not any(hidden == p or hidden.startswith(p.rstrip("/") + "/") for p in exposed), (hidden, exposed)
    assert health["exposed_paths"]["writable"] == [f"{RUN_DIR} (tmpfs, {health['limits']['tmpfs_size_mb']} MB)"]


@pytest.mark.parametrize("canary", CANARIES)
def test_host_file_is_not_readable_and_its_folder_not_listable(minimal: Server, host_files: HostFiles,
                                                               canary: str) -> None:
    path = getattr(host_files, canary)
    mode = os.stat(path).st_mode
    assert mode & stat.S_IROTH and os.stat(os.path.dirname(path)).st_mode & stat.S_IXOTH  # readable on the host
    if canary == "cwd_canary":
        assert os.readlink(f"/proc/{minimal.pid}/cwd") == os.path.dirname(path)  # it is the server's cwd
    result = minimal.run(_attempts(path))
    assert result.ok, result
    assert result.stdout.splitlines() == ["read FAILED FileNotFoundError", "list FAILED FileNotFoundError"], result
    assert host_files.canary_text not in result.stdout


def test_root_holds_only_the_tops_of_the_exposed_paths(minimal: Server) -> None:
    exposed = [p.split(" ")[0] for p in minimal.health["exposed_paths"]["read_only"]]
    allowed = {p.strip("/").split("/")[0] for p in exposed} | {"tmp"}
    allowed |= {name for name in os.listdir("/") if os.path.islink("/" + name)}  # /lib -> usr/lib and the like
    result = minimal.run(BYPASS + "print(sorted(o.listdir('/')))")
    listing = ast.literal_eval(result.stdout)
    assert set(listing) <= allowed, listing
    assert not {"home", "sys", "var", "opt", "run"} & set(listing)


def test_proc_shows_only_the_snippets_own_processes(minimal: Server) -> None:
    code = (BYPASS + "import time\n"
            "child = o.fork()\n"
            "if child == 0:\n"
            "    time.sleep(5)\n"
            "    o._exit(0)\n"
            "print(sorted(int(p) for p in o.listdir('/proc') if p.isdigit()), o.getpid(), child)\n")
    result = minimal.run(code)
    assert result.ok, result
    assert result.stdout == "[1, 2] 1 2\n", result  # the snippet (its namespace's init) and its child


def test_proc_shows_no_host_command_line(minimal: Server) -> None:
    with open(f"/proc/{minimal.pid}/cmdline", "rb") as f:
        server_cmdline = f.read().replace(b"\0", b" ").decode().strip()
    code = (BYPASS
            + "for p in sorted(o.listdir('/proc')):\n"
            + "    try:\n"
            + "        print(p, open(f'/proc/{p}/cmdline', 'rb').read().replace(b'\\0', b' ').decode())\n"
            + "    except OSError as e:\n"
            + "        print(p, type(e).__name__)\n"
            + f"for path in ['/proc/{minimal.pid}/cmdline', '/proc/cmdline']:\n"
            + "    print(path, o.path.exists(path))\n")
    result = minimal.run(code)
    assert result.ok, result
    assert "sandbox serve" in server_cmdline and server_cmdline not in result.stdout
    assert "sandbox serve" not in result.stdout and "pytest" not in result.stdout
    assert minimal.pid > 2 and f"/proc/{minimal.pid}/cmdline False" in result.stdout
    assert "/proc/cmdline False" in result.stdout  # subset=pid: no kernel command line either


def test_sympy_numpy_scipy_mpmath_import_and_compute(minimal: Server) -> None:
    code = ("import sympy, numpy, scipy.special, scipy.linalg, mpmath\n"
            "x = sympy.Symbol('x')\n"
            "print(sympy.solve(x**2 - 5*x + 6, x), int(numpy.arange(5).sum()), float(scipy.special.gamma(5)),\n"
            "      round(float(scipy.linalg.det(numpy.diag([2.0, 3.0]))), 6), mpmath.nstr(mpmath.sqrt(2), 8))\n")
    result = minimal.run(code, run_timeout=30.0)  # the imports, not the speed: a loaded machine took over 5 s
    assert result.stdout == "[2, 3] 10 24.0 6.0 1.4142136\n", result


def test_print_of_one_plus_one_gives_two(minimal: Server) -> None:
    assert minimal.run("print(1+1)").stdout == "2\n"


def test_extra_ro_folder_is_readable(minimal: Server, host_files: HostFiles) -> None:
    path = os.path.join(host_files.extra_ro, "shared.txt")
    result = minimal.run(BYPASS + f"print(o.listdir({host_files.extra_ro!r}), open({path!r}).read())")
    assert result.stdout == "['shared.txt'] shared on purpose\n", result


def test_extra_ro_file_is_readable_and_its_folder_shows_nothing_else(minimal: Server,
                                                                      host_files: HostFiles) -> None:
    folder = os.path.dirname(host_files.extra_ro_file)
    assert sorted(os.listdir(folder)) == ["answers.jsonl", "constants.json"]  # on the host, a canary beside it
    result = minimal.run(BYPASS + f"print(o.listdir({folder!r}), open({host_files.extra_ro_file!r}).read())")
    assert result.stdout == "['constants.json'] {\"g\": 9.81}\n", result


def test_extra_ro_folder_is_not_writable(minimal: Server, host_files: HostFiles) -> None:
    targets = [os.path.join(host_files.extra_ro, "shared.txt"), os.path.join(host_files.extra_ro, "new.txt")]
    code = (f"for path in {targets!r}:\n"
            "    try:\n"
            "        open(path, 'a').write('changed')\n"
            "        print('WROTE')\n"
            "    except OSError as e:\n"
            "        print(type(e).__name__, e.errno)\n")
    result = minimal.run(code)
    assert result.stdout.splitlines() == ["OSError 30", "OSError 30"], result  # EROFS: the mount is read-only
    assert sorted(os.listdir(host_files.extra_ro)) == ["shared.txt"]
    with open(targets[0]) as f:
        assert f.read() == "shared on purpose"


def test_the_visible_runtime_refuses_writes(minimal: Server) -> None:
    code = (BYPASS + "import sys\n"
            "for path in ['/etc/passwd', sys.prefix + '/new.txt', sys.base_prefix + '/new.txt', '/tmp/new.txt',\n"
            "             '/new.txt', '/dev/new']:\n"
            "    try:\n"
            "        open(path, 'a').write('x')\n"
            "        print('WROTE', path)\n"
            "    except OSError:\n"
            "        print('REFUSED')\n"
            "open('/dev/null', 'w').write('the bit bucket still works')\n")
    result = minimal.run(code)
    assert result.ok, result
    assert result.stdout.splitlines() == ["REFUSED"] * 6, result


def test_snippet_gets_its_passwd_entry_and_four_devices(minimal: Server) -> None:
    result = minimal.run(BYPASS + "pwd = getattr(__builtins__, '__imp' + 'ort__')('pwd')\n"
                                  "print(pwd.getpwuid(o.getuid()).pw_name, o.getcwd(), sorted(o.listdir('/dev')))")
    assert result.stdout == f"sandbox {RUN_DIR} ['null', 'random', 'urandom', 'zero']\n", result


def test_stale_proc_mounts_do_not_pile_up(minimal: Server) -> None:
    # Each line: the worker (by the snippet's uid) and how many proc mounts are stacked on /proc (its own included).
    code = (BYPASS + "print(o.getuid(), sum(line.split()[4] == '/proc' for line in open('/proc/self/mountinfo')))")
    stacks: dict[int, list[int]] = {}
    for _ in range(2 * PROC_BATCH + 8):  # so at least one worker runs more than a batch
        uid, stacked = map(int, minimal.run(code).stdout.split())
        stacks.setdefault(uid, []).append(stacked)
    assert max(len(s) for s in stacks.values()) > PROC_BATCH
    assert all(1 <= n <= PROC_BATCH for s in stacks.values() for n in s), stacks
