"""Per-snippet cgroups against a fake cgroupfs (a tmp folder whose ``mkdir`` / ``rmdir`` act as the kernel's), and
against the host's cgroup v2 where it has one.

The fake kernel makes a cgroup's control files on ``mkdir`` and refuses ``rmdir`` while a live process is listed in
its ``cgroup.procs``. It records every operation, so a test can check the order: the cgroup exists with its limits
before the child is given its code, and is gone after. The snippets themselves play the kernel's part where the
kernel would act during the run (an out-of-memory group kill, a refused fork): they write the event counter, then
behave as the kernel would make them.
"""

from __future__ import annotations

import errno
import io
import os
import shutil
import sys
from collections.abc import Iterator

import pytest

import sandbox.cgroup as cgroup_module
from sandbox.budget import remove_budget, server_budget
from sandbox.cgroup import CgroupFs, SnippetCgroups, server_subtree
from sandbox.config import ExecConfig
from sandbox.executor import Executor, Job
from sandbox.isolation import PidNamespaces
from sandbox.rundir import RunDir
from tests.sandbox.conftest import Server

#: The control files the kernel makes in a new cgroup, with their values before anything ran in it.
CONTROL_FILES = {
    "cgroup.procs": "", "cgroup.kill": "", "cgroup.controllers": "cpu memory pids\n", "cgroup.subtree_control": "",
    "memory.max": "max\n", "memory.swap.max": "max\n", "memory.oom.group": "0\n",
    "memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
    "pids.max": "max\n", "pids.events": "max 0\n", "cpu.max": "max 100000\n",
    "cpu.stat": "usage_usec 0\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n",
}


class FakeKernelFs(CgroupFs):
    """A tmp folder acting as cgroupfs; ``log`` holds (operation, path, text) in the order they happened."""

    log: list[tuple[str, str, str]] = []

    def mkdir(self, name: str) -> None:
        super().mkdir(name)
        for file, text in CONTROL_FILES.items():
            with open(os.path.join(self.path, name, file), "w") as f:
                f.write(text)
        self.log.append(("mkdir", name, ""))

    def rmdir(self, name: str) -> None:
        folder = os.path.join(self.path, name)
        with open(os.path.join(folder, "cgroup.procs")) as f:
            if any(_alive(int(pid)) for pid in f.read().split()):
                raise OSError(errno.EBUSY, "Device or resource busy")
        shutil.rmtree(folder)
        self.log.append(("rmdir", name, ""))

    def write(self, rel: str, text: str) -> None:
        super().write(rel, text)
        self.log.append(("write", rel, text))


def _alive(pid: int) -> bool:
    """A process the kernel would still count in a cgroup (a zombie is no longer in one)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _root(tmp_path: str, own: str) -> str:
    """A fake cgroupfs root whose cgroup ``own`` (the server's) has the three controllers."""
    for folder in {tmp_path, os.path.join(tmp_path, own.lstrip("/"))}:
        os.makedirs(folder, exist_ok=True)
        for file in ("cgroup.controllers", "cgroup.subtree_control", "cgroup.procs"):
            with open(os.path.join(folder, file), "w") as f:
                f.write("cpu memory pids\n" if file == "cgroup.controllers" else "")
    return tmp_path


@pytest.fixture
def fake_root(tmp_path: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(cgroup_module, "own_cgroup", lambda: "/system.slice/sandbox.service")
    FakeKernelFs.log = []
    return _root(str(tmp_path), "/system.slice/sandbox.service")


def test_the_server_hands_the_controllers_down_to_a_subtree_of_its_own(fake_root: str) -> None:
    subtree, why = server_subtree(fake_root, fs=FakeKernelFs)
    own = os.path.join(fake_root, "system.slice", "sandbox.service")
    assert why is None and subtree == os.path.join(own, f"zerotir-sandbox-{os.getpid()}")
    for folder in (own, subtree):
        with open(os.path.join(folder, "cgroup.subtree_control")) as f:
            assert f.read() == "+cpu +memory +pids"


def test_without_cgroup_v2_or_a_delegated_controller_the_reason_says_which(fake_root: str, tmp_path: str) -> None:
    assert server_subtree(os.path.join(str(tmp_path), "v1-only"))[1].startswith("no cgroup v2 hierarchy at")
    with open(os.path.join(fake_root, "system.slice", "sandbox.service", "cgroup.controllers"), "w") as f:
        f.write("cpu\n")
    subtree, why = server_subtree(fake_root, fs=FakeKernelFs)
    assert subtree is None and "lacks the memory, pids controller(s)" in why


def test_a_kernel_without_cgroup_kill_leaves_the_layer_off_and_nothing_behind(fake_root: str,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(CONTROL_FILES, "cgroup.kill")  # Linux before 5.14
    subtree, why = server_subtree(fake_root, fs=FakeKernelFs)
    assert subtree is None and "no cgroup.kill (Linux >= 5.14)" in why
    assert not [e for e in os.listdir(os.path.join(fake_root, "system.slice", "sandbox.service")) if "zerotir" in e]


def test_a_snippet_cgroup_gets_its_limits_and_is_removed(fake_root: str) -> None:
    cgroups = SnippetCgroups(fake_root, worker=1, cpu_cores=0.5, fs=FakeKernelFs)
    name = cgroups.create(job_id=7, memory_limit_mb=256, max_processes=16)
    assert name == f"w1-{os.getpid()}-7"
    written = {rel.split("/", 1)[1]: text for op, rel, text in FakeKernelFs.log if op == "write"}
    assert written == {"memory.max": str(256 * 2**20), "memory.swap.max": "0", "memory.oom.group": "1",
                       "pids.max": "16", "cpu.max": "50000 100000"}
    cgroups.remove(name)
    assert not os.path.exists(os.path.join(fake_root, name))
    assert FakeKernelFs.log[-2:] == [("write", f"{name}/cgroup.kill", "1"), ("rmdir", name, "")]


@pytest.fixture
def executor(fake_root: str, tmp_path: str) -> Iterator[Executor]:
    """A real executor (no namespaces, no uid drop) whose snippets run in cgroups of the fake kernel."""
    config = ExecConfig(preamble=None, static_check=False, run_timeout=1.0)
    run_dir = RunDir(os.path.join(str(tmp_path), "run"), None, 16, "a test: no mount namespace")
    executor = Executor(config, run_dir, None, PidNamespaces(enabled=False), None,
                        SnippetCgroups(fake_root, 0, 1.0, fs=FakeKernelFs))
    with pytest.MonkeyPatch.context() as streams:  # the children's streams, as the worker sets them up
        for name, fd in (("stdout", 1), ("stderr", 2)):
            streams.setattr(sys, name, io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), line_buffering=True))
        executor.start_zygote(())
    yield executor
    executor.zygote.stop()


def _events(name: str) -> list[tuple[str, str]]:
    """The log without the cgroup's name: (operation, control file or '')."""
    return [(op, rel.split("/", 1)[1] if "/" in rel else "") for op, rel, _ in FakeKernelFs.log]


def test_the_snippet_runs_inside_its_cgroup_made_before_and_removed_after(executor: Executor,
                                                                          fake_root: str) -> None:
    name = f"w0-{os.getpid()}-3"
    code = f"import os\nprint(os.getpid(), open({fake_root!r} + '/{name}/cgroup.procs').read())"
    result = executor.run(Job(id=3, code=code, run_timeout=1.0, memory_limit_mb=64))
    assert result["reason"] == "ok" and result["limits_hit"] == [], result["stderr"]
    pid, listed = result["stdout"].split()
    assert pid == listed  # the child itself was in its cgroup when its code ran
    ops = _events(name)
    assert ops[0] == ("mkdir", "") and ops[-1] == ("rmdir", "")
    assert ops.index(("write", "pids.max")) < ops.index(("write", "cgroup.procs")) < ops.index(("write", "cgroup.kill"))
    assert not os.path.exists(os.path.join(fake_root, name))


def test_a_timeout_kills_the_whole_cgroup_and_says_time(executor: Executor) -> None:
    result = executor.run(Job(id=4, code="while True: pass", run_timeout=0.3, memory_limit_mb=64))
    assert result["reason"] == "timeout" and result["limits_hit"] == ["time"]
    assert ("write", "cgroup.kill") in _events(f"w0-{os.getpid()}-4")


KERNEL_OOM_KILL = """
import glob, os, signal
for events in glob.glob({root!r} + "/w0-*/memory.events"):
    open(events, "w").write("max 12\\noom 1\\noom_kill 1\\n")
os.kill(os.getpid(), signal.SIGKILL)  # memory.oom.group: the kernel kills every process of the cgroup
"""

KERNEL_REFUSED_FORK = """
import glob
for events in glob.glob({root!r} + "/w0-*/pids.events"):
    open(events, "w").write("max 3\\n")
print("forks refused, carried on")
"""


@pytest.mark.parametrize(("code", "reason", "hit"), [(KERNEL_OOM_KILL, "memory", ["memory"]),
                                                     (KERNEL_REFUSED_FORK, "ok", ["pids"])])
def test_the_result_names_the_cgroup_limit_the_snippet_hit(executor: Executor, fake_root: str, code: str,
                                                           reason: str, hit: list[str]) -> None:
    result = executor.run(Job(id=5, code=code.format(root=fake_root), run_timeout=2.0, memory_limit_mb=64))
    assert (result["reason"], result["limits_hit"]) == (reason, hit), result["stderr"]


HOST_HAS_V2 = os.path.exists("/sys/fs/cgroup/cgroup.controllers")


@pytest.mark.skipif(not HOST_HAS_V2, reason="the host has no cgroup v2 hierarchy at /sys/fs/cgroup (this VM: v1)")
def test_on_a_cgroup_v2_host_forked_children_share_one_memory_budget() -> None:
    """4 children of 100 MB each under a 256 MB budget: per process each fits, for the snippet as a whole not."""
    import httpx

    from sandbox import local_sandbox

    code = ("import os, time\npids = []\nfor _ in range(4):\n    pid = os.fork()\n    if pid == 0:\n"
            "        b = bytearray(100 * 2**20)\n        b[::4096] = b'x' * len(b[::4096])\n        time.sleep(5)\n"
            "        os._exit(0)\n    pids.append(pid)\nfor pid in pids:\n    os.waitpid(pid, 0)\n")
    with local_sandbox(workers=1, allow_imports=["*"], refused_calls=[], log_level="warning") as urls:
        layer = httpx.get(urls[0] + "/health", timeout=10, trust_env=False).json()["protections"]["cgroup_budget"]
        if layer != "on":
            pytest.skip(f"per-snippet cgroups are unavailable on this host: {layer}")
        answer = httpx.post(urls[0] + "/run_code", json={"language": "python", "code": code, "memory_limit_MB": 256,
                                                        "run_timeout": 10}, timeout=60, trust_env=False).json()
    assert answer["details"]["reason"] == "memory" and "memory" in answer["details"]["limits_hit"], answer


def test_without_cgroups_health_says_why_and_what_holds_instead(sandbox_server: Server) -> None:
    layer = sandbox_server.health["protections"]["cgroup_budget"]
    if layer != "on":
        assert "each process has its own budget instead" in layer and "max_processes=16" in layer, layer


def test_require_cgroup_refuses_to_start_without_them_naming_the_setting() -> None:
    from sandbox import local_sandbox

    spec, _ = server_budget("/sys/fs/cgroup")
    if spec is not None:
        remove_budget(spec)
        pytest.skip("this host has per-snippet cgroups (v2 or v1): require_cgroup starts")
    with pytest.raises(RuntimeError, match=r"--limits\.require_cgroup is set but per-snippet cgroups are "
                                           r"unavailable: no cgroup v2 hierarchy"):
        with local_sandbox(workers=1, require_cgroup=True, startup_timeout=30, log_level="warning"):
            pass


def test_require_cgroup_without_isolation_is_a_config_error_naming_both() -> None:
    with pytest.raises(ValueError, match="ExecConfig.require_cgroup needs isolate"):
        ExecConfig(isolate=False, require_cgroup=True)
