"""Run one snippet in a forked child and supervise it: drain output, enforce the wall time, clean up everything.

Used inside a worker process (:mod:`sandbox.worker`), one job at a time. The worker has already imported the heavy
modules, so ``fork`` gives the child a warm interpreter in a few milliseconds. The worker compiles only short
snippets (:data:`sandbox.child.WORKER_COMPILE_MAX_CHARS`, at a bounded cost); a longer one the child compiles,
under the snippet's own limits (:mod:`sandbox.child`).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from dataclasses import dataclass, field
from types import CodeType
from typing import Any

from sandbox.budget import SnippetCgroupsV1
from sandbox.cgroup import SnippetCgroups
from sandbox.child import (STATUS_MEMORY, STATUS_REFUSED, WORKER_COMPILE_MAX_CHARS, ChildJob, ChildPlan,
                           build_namespace, compile_snippet)
from sandbox.config import ExecConfig
from sandbox.files import decode_inputs, read_outputs, stdin_fd, write_inputs
from sandbox.isolation import PidNamespaces
from sandbox.policy import Policy
from sandbox.rootfs import FreshProc
from sandbox.rundir import RunDir
from sandbox.zygote import Zygote

#: Time allowed after the child's exit for its output pipes to reach end-of-file. Only a surviving grandchild that
#: holds a pipe open makes this wait; the worker then closes the pipe and moves on.
DRAIN_GRACE_S = 0.2
_READ_CHUNK = 1 << 16


class CappedBuffer:
    """Keeps the first and last ``cap // 2`` bytes of a stream and counts what it drops in between."""

    def __init__(self, cap: int) -> None:
        self.head_cap = cap - cap // 2
        self.tail_cap = cap // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def feed(self, data: bytes) -> None:
        """Append a chunk read from the pipe."""
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            excess = len(self.tail) - self.tail_cap
            if excess > 0:
                self.dropped += excess
                del self.tail[:excess]

    def text(self) -> str:
        """Decoded output with a marker where bytes were dropped."""
        head = self.head.decode("utf-8", errors="replace")
        tail = self.tail.decode("utf-8", errors="replace")
        if not self.dropped:
            return head + tail
        return f"{head}\n[... {self.dropped} bytes of output omitted by the sandbox ...]\n{tail}"


@dataclass
class Job:
    """One snippet to run, with its limits already resolved by the server."""

    id: int
    code: str
    run_timeout: float
    memory_limit_mb: int
    stdin: str | None = None  # the child's fd 0 (a sealed memfd); None: /dev/null
    files: dict[str, str | None] = field(default_factory=dict)  # name -> base64, written into the run dir
    fetch_files: list[str] = field(default_factory=list)  # names read back from the run dir after the run

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Job:
        """Build from the JSON message the server sends."""
        return cls(id=int(raw["id"]), code=str(raw["code"]), run_timeout=float(raw["run_timeout"]),
                   memory_limit_mb=int(raw["memory_limit_mb"]), stdin=raw.get("stdin"),
                   files=dict(raw.get("files") or {}), fetch_files=list(raw.get("fetch_files") or []))


class Executor:
    """Runs jobs for one worker.

    Args:
        config: Limits and policy.
        run_dir: The private temp dir given to each child as cwd, HOME and TMPDIR (new for every job).
        uid: The uid children drop to, or None when the worker cannot drop privileges.
        pid_namespaces: Per-child PID namespaces (possibly disabled).
        fresh_proc: Each child's own /proc in the minimal root, or None (the host view: no /proc is mounted).
        cgroups: Per-snippet cgroups (a budget for the snippet and all it forks), or None (per-process rlimits).
    """

    def __init__(self, config: ExecConfig, run_dir: RunDir, uid: int | None, pid_namespaces: PidNamespaces,
                 fresh_proc: FreshProc | None = None, cgroups: SnippetCgroups | SnippetCgroupsV1 | None = None) -> None:
        self.config = config
        self.run_dir = run_dir
        self.uid = uid
        self.pidns = pid_namespaces
        self.fresh_proc = fresh_proc
        self.cgroups = cgroups
        policy = Policy(config.allow_imports, config.refused_calls) if config.static_check else None
        self.plan = ChildPlan(namespace=build_namespace(config.preamble),  # raises here if the preamble is broken
                              run_dir=run_dir.path, uid=uid, max_processes=config.max_processes,
                              max_open_files=config.max_open_files, max_file_size_mb=config.max_file_size_mb,
                              proc_options=fresh_proc.options if fresh_proc else None, policy=policy)
        self.zygote: Zygote | None = None

    def start_zygote(self, close_in_zygote: tuple[int, ...]) -> None:
        """Fork the zygote (once, after warm-up and before the first job); it does not keep ``close_in_zygote``."""
        self.zygote = Zygote(self.plan, self.pidns, close_in_zygote)

    def run(self, job: Job) -> dict[str, Any]:
        """Run ``job`` and return the result message (``reason``, ``return_code``, ``stdout``, ``stderr``, ...)."""
        code: CodeType | str = job.code  # a long source goes to the child as it is: the child compiles it
        if len(job.code) <= WORKER_COMPILE_MAX_CHARS:
            compiled, message, reason = compile_snippet(job.code, self.plan.policy)
            if compiled is None:  # answered without a fork
                return _result(job, "error" if reason == "memory" else reason, 1, "", message, 0.0)
            code = compiled
        inputs, why = decode_inputs(job.files)
        if why is not None:
            return {"id": job.id, "reason": "invalid_request", "error": why}
        self.run_dir.prepare()
        try:
            why = write_inputs(self.run_dir.path, inputs, self.uid) if inputs else None
            if why is not None:
                return {"id": job.id, "reason": "invalid_request", "error": why}
            result = self._run_in_cgroup(job, code)
            if job.fetch_files:  # the snippet and all it started are gone: nothing changes the files any more
                result["files"], result["fetch_problems"] = read_outputs(self.run_dir.path, job.fetch_files,
                                                                         self.config.max_fetch_mb << 20)
            return result
        finally:
            self.run_dir.clear()

    def _run_in_cgroup(self, job: Job, code: CodeType | str) -> dict[str, Any]:
        """Run in a cgroup of its own where there are cgroups: made before the child exists, and removed after
        (``cgroup.kill`` first: whatever the snippet left, at its end or its time limit, dies with it)."""
        if self.cgroups is None:
            return self._run_child(job, code, None)
        cgroup = self.cgroups.create(job.id, job.memory_limit_mb, self.config.max_processes)
        try:
            return self._run_child(job, code, cgroup)
        finally:
            self.cgroups.remove(cgroup)

    def _run_child(self, job: Job, code: CodeType | str, cgroup: str | None) -> dict[str, Any]:
        assert self.zygote is not None, "start_zygote() before the first job"
        job_r, job_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        st_r, st_w = os.pipe()
        child_fds = [job_r, out_w, err_w, st_w]
        start = time.monotonic()
        try:
            if job.stdin is not None:
                child_fds.append(stdin_fd(job.stdin))
            pid = self.zygote.fork_child(child_fds)
        except BaseException:
            for fd in (job_w, out_r, err_r, st_r):
                os.close(fd)
            raise
        finally:
            for fd in child_fds:
                os.close(fd)
        try:
            if cgroup is not None:
                self._enter_or_kill(cgroup, pid, job_w)
            _write_all(job_w, ChildJob(code, job.run_timeout, job.memory_limit_mb).encode())
            status, timed_out, out, err = self._supervise(pid, out_r, err_r, start + job.run_timeout)
            elapsed = time.monotonic() - start
            claim = _read_status(st_r)
            hit = self.cgroups.limits_hit(cgroup) if self.cgroups is not None and cgroup is not None else []
        finally:
            for fd in (out_r, err_r, st_r):
                os.close(fd)
        if self.fresh_proc is not None:
            self.fresh_proc.done()
        return_code = os.waitstatus_to_exitcode(status)
        if timed_out:
            reason, hit = "timeout", ["time", *hit]
        elif "memory" in hit or (claim == STATUS_MEMORY and return_code == 1 and _ends_in_memory_error(err)):
            reason, hit = "memory", sorted({"memory", *hit})
        elif return_code < 0:
            reason = "signal"
        elif claim == STATUS_REFUSED and return_code == 1 and not out.head:  # the snippet's own label, if it wrote it
            reason = "refused"
        else:
            reason = "ok" if return_code == 0 else "error"
        truncated = bool(out.dropped or err.dropped)
        return _result(job, reason, return_code, out.text(), err.text(), elapsed, truncated, hit)

    def _enter_or_kill(self, cgroup: str, pid: int, job_w: int) -> None:
        """Move the child into its cgroup before it has its code (so all it forks is counted), or end it."""
        assert self.cgroups is not None
        try:
            self.cgroups.enter(cgroup, pid)
        except BaseException:
            os.close(job_w)  # the child reads an empty job and exits; it is reaped here
            self._kill_and_reap(pid)
            raise

    def _supervise(self, pid: int, out_r: int, err_r: int,
                   deadline: float) -> tuple[int, bool, CappedBuffer, CappedBuffer]:
        """Drain both pipes until the child exits (or is killed at ``deadline``) and the pipes close."""
        cap = self.config.max_output_bytes
        buffers = {out_r: CappedBuffer(cap), err_r: CappedBuffer(cap)}
        pidfd = os.pidfd_open(pid)
        poller = select.poll()
        for fd in (out_r, err_r, pidfd):
            poller.register(fd, select.POLLIN)
        open_pipes = {out_r, err_r}
        status: int | None = None
        timed_out = False
        drain_until = 0.0
        try:
            while True:
                now = time.monotonic()
                if status is None and now >= deadline:
                    timed_out = True
                    status = self._kill_and_reap(pid)
                    poller.unregister(pidfd)
                    drain_until = time.monotonic() + DRAIN_GRACE_S
                if status is not None and (not open_pipes or now >= drain_until):
                    break
                wait_s = (deadline if status is None else drain_until) - now
                for fd, _ in poller.poll(max(0.0, wait_s) * 1000):
                    if fd == pidfd:
                        status = self._kill_and_reap(pid)
                        poller.unregister(pidfd)
                        drain_until = time.monotonic() + DRAIN_GRACE_S
                        continue
                    data = os.read(fd, _READ_CHUNK)
                    if data:
                        buffers[fd].feed(data)
                    else:
                        poller.unregister(fd)
                        open_pipes.discard(fd)
        finally:
            os.close(pidfd)
        return status, timed_out, buffers[out_r], buffers[err_r]

    def _kill_and_reap(self, pid: int) -> int:
        """Kill the child's whole process group and anything it left behind; return its wait status.

        With PID namespaces, the child is its namespace's init: killing it (or its normal exit) makes the kernel
        kill every process in the namespace, including double-forked daemons that left the process group. With
        cgroups, removing the snippet's cgroup then kills whatever of it is left, namespaces or not.
        """
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        assert self.zygote is not None
        return self.zygote.reap(pid)  # the zygote is the parent (and, without PID namespaces, kills the orphans)

def _read_status(fd: int) -> bytes:
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 64)
    except BlockingIOError:
        return b""


def _ends_in_memory_error(err: CappedBuffer) -> bool:
    """Whether the stderr the worker captured ends in a MemoryError traceback.

    The status pipe is advisory: the snippet can write on it too (``os.write(3, b"memory")``), so a memory claim
    counts only when what the worker observed agrees: the child exited 1 with a MemoryError as its last line.
    """
    tail = bytes(err.tail or err.head).rstrip().rsplit(b"\n", 1)[-1]
    return tail.startswith(b"MemoryError")


def _write_all(fd: int, data: bytes) -> None:
    """Write the child's job and close the pipe; a child that died first (its set-up failed) is reported by its
    exit, not here."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except BrokenPipeError:
        pass
    finally:
        os.close(fd)


def _result(job: Job, reason: str, return_code: int, stdout: str, stderr: str, elapsed: float,
            truncated: bool = False, limits_hit: list[str] | None = None) -> dict[str, Any]:
    """The worker's answer; ``limits_hit`` names the limits the snippet ran into (time, memory, pids, cpu)."""
    return {"id": job.id, "reason": reason, "return_code": return_code, "stdout": stdout, "stderr": stderr,
            "execution_time": round(elapsed, 6), "output_truncated": truncated, "limits_hit": limits_hit or []}
