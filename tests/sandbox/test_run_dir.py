"""Snippets on one warm worker leave nothing to each other: a file the first one writes (in its cwd, ``HOME``,
``TMPDIR``, ``/tmp`` or any other folder it can write) is gone when the next one runs on the same worker.

In the minimal root only the run dir is writable and the worker empties it between jobs. Where the platform cannot
build that root (``/health`` says ``minimal_root`` is off), the snippets see the host's ``/tmp``, and only the run
dir (cwd, ``HOME``, ``TMPDIR``) is held to the rule."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest

from sandbox import ExecStatus, SandboxClient, local_sandbox
from tests.sandbox.conftest import BYPASS, TEST_IMPORTS, _process_table

#: Where the first snippet tries to leave files: its cwd (relative names), HOME, TMPDIR, and the shared temp folders.
PLACES = ("CWD", "HOME", "TMPDIR", "/tmp", "/var/tmp", "/dev/shm")

WRITE = BYPASS + f"""
import json
made = []
for place in {PLACES!r}:
    folder = o.getcwd() if place == "CWD" else o.environ.get(place, place)
    for name in ("left.txt", ".hidden", "sub/deep.txt"):
        path = o.path.join(folder, name)
        try:
            o.makedirs(o.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write("left by the first snippet")
            o.chmod(path, 0)  # a file its owner cannot read back must go too
            made.append(path)
        except OSError:
            pass
o.chmod(o.getcwd(), 0o500)  # and a run dir the snippet made read-only
print(json.dumps({{"made": made, "run_dir": o.getcwd()}}))
"""

SEE = BYPASS + """
import json
paths = json.loads({made!r})
print(json.dumps({{"seen": [p for p in paths if o.path.lexists(p)], "cwd": sorted(o.listdir(o.getcwd())),
                   "cwd_writable": o.access(o.getcwd(), o.W_OK)}}))
"""


@pytest.fixture(scope="module")
def one_worker() -> Iterator[tuple[str, dict]]:
    """A server with a single warm worker, so consecutive snippets run on the same one; its URL and protections."""
    with local_sandbox(workers=1, queue_size=4, allow_imports=TEST_IMPORTS, run_timeout=5.0, startup_timeout=90,
                       log_level="warning") as urls:
        yield urls[0], httpx.get(urls[0] + "/health", timeout=10, trust_env=False).json()["protections"]


def _run(url: str, code: str) -> str:
    async def once() -> str:
        async with SandboxClient(url, retries=0) as client:
            result = await client.run(code)
        assert result.status == ExecStatus.OK, result
        return result.stdout

    return asyncio.run(once())


def test_a_snippet_never_sees_a_file_an_earlier_one_wrote_on_the_same_worker(one_worker: tuple[str, dict]) -> None:
    url, protections = one_worker
    first = json.loads(_run(url, WRITE))
    made = first["made"]
    assert f"{first['run_dir']}/sub/deep.txt" in made  # the run dir is writable, so something was left there
    if protections["minimal_root"] != "on":  # the host's /tmp is shared: only the run dir is the worker's to empty
        made = [p for p in made if p.startswith(first["run_dir"] + "/")]
    seen = json.loads(_run(url, SEE.format(made=json.dumps(made))))
    assert seen == {"seen": [], "cwd": [], "cwd_writable": True}, (made, seen)


def test_a_locked_empty_run_dir_and_1200_nested_folders_do_not_reach_the_next_snippet(
        one_worker: tuple[str, dict]) -> None:
    url, _ = one_worker
    lock = BYPASS + "o.chmod(o.getcwd(), 0o500)\nprint(oct(o.stat('.').st_mode & 0o777))"
    assert _run(url, lock) == "0o500\n"  # left empty: only its mode carries the change
    check = BYPASS + "print(oct(o.stat('.').st_mode & 0o777), o.listdir('.'), o.access('.', o.W_OK))"
    assert _run(url, check) == "0o700 [] True\n"
    nest = BYPASS + "for _ in range(1200):\n    o.mkdir('d')\n    o.chdir('d')\nprint('made')"
    assert _run(url, nest) == "made\n"
    assert _run(url, check) == "0o700 [] True\n"
    assert _run(url, "print(1)") == "1\n"


#: Scans the snippet's own writable memory for ``p`` followed by ``s`` (never written side by side by this snippet).
SCAN = BYPASS + """
import ctypes
ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: the uid drop made /proc/self/mem unreadable to itself
p, s = {p!r}, {s!r}
found = 0
with open('/proc/self/maps') as maps:
    regions = [line.split()[:2] for line in maps.read().splitlines()]
with open('/proc/self/mem', 'rb', 0) as mem:
    for span, perms in regions:
        if not perms.startswith('rw'):
            continue
        lo, hi = (int(x, 16) for x in span.split('-'))
        try:
            mem.seek(lo)
            data = mem.read(hi - lo)
        except (OSError, OverflowError, ValueError):
            continue
        at = data.find(p)
        while at >= 0:
            found += data[at + len(p):at + len(p) + len(s)] == s
            at = data.find(p, at + 1)
print(found)
"""


def test_a_snippets_memory_holds_nothing_an_earlier_one_printed(one_worker: tuple[str, dict]) -> None:
    url, _ = one_worker
    printed = _run(url, "import random\nprint(''.join(random.choice('123456789') for _ in range(40)))").strip()
    assert len(printed) == 40
    for _ in range(2):  # the next snippet, and the one after
        assert _run(url, SCAN.format(p=printed[:20].encode(), s=printed[20:].encode())) == "0\n"


def test_unseeded_random_draws_differ_between_snippets_on_one_worker(one_worker: tuple[str, dict]) -> None:
    url, _ = one_worker
    draw = "import random, numpy\nprint(random.random(), numpy.random.random(), numpy.random.randint(1 << 30))"
    first, second = (_run(url, draw).split() for _ in range(2))
    assert all(a != b for a, b in zip(first, second)), (first, second)


def _worker_mounts(server_pid: int) -> list[tuple[str, str]]:
    """(mount point, filesystem type) of each mount of the server's one worker, in its own mount namespace, but its
    ``proc`` mounts: those of finished children pile up on /proc by design and are detached in batches
    (``sandbox.rootfs.PROC_BATCH``)."""
    children = [pid for pid, (ppid, _) in _process_table().items() if ppid == server_pid]
    assert len(children) == 1, f"the server {server_pid} should have one worker, it has {children}"
    with open(f"/proc/{children[0]}/mountinfo") as f:
        mounts = [(line.split()[4], line.split(" - ")[1].split()[0]) for line in f]
    return [(point, kind) for point, kind in mounts if kind != "proc"]


def test_a_finished_snippets_tmpfs_is_gone_from_its_worker(one_worker: tuple[str, dict]) -> None:
    """Each snippet gets a tmpfs on the run dir; the worker detaches it when the snippet ends (before it answers), so
    the worker's mounts do not grow with the snippets it ran (a leak would keep every snippet's files in memory)."""
    url, protections = one_worker
    if protections.get("fresh_run_dir_tmpfs") != "on":
        pytest.skip(f"no tmpfs per snippet on this machine (needs root and a mount namespace): "
                    f"fresh_run_dir_tmpfs {protections.get('fresh_run_dir_tmpfs')}")
    server_pid = httpx.get(url + "/health", timeout=10, trust_env=False).json()["server_pid"]
    run_dir = _run(url, "import os\nprint(os.getcwd())").strip()
    before = _worker_mounts(server_pid)
    for _ in range(4):
        assert _run(url, "open('kept.txt', 'w').write('x')\nprint('ok')") == "ok\n"
    after = _worker_mounts(server_pid)
    assert after == before, (run_dir, before, after)
    assert not [point for point, _ in after if point == run_dir or point.startswith(run_dir + "/")]
