"""What happens inside the forked child that runs one snippet. Never returns: it always ends in ``os._exit``.

Children are forked by the zygote (:mod:`sandbox.zygote`), a copy of the warm worker that never holds a job; a
child reads its job (code and limits) from its own pipe. Every page a child writes costs a copy-on-write fault (~5 us
in a VM), so whatever can be prepared once is prepared in the worker by :func:`prepare_worker_process` (environment,
standard streams) before the zygote is forked, and the preamble's namespace is built once: each child runs in its
own copy-on-write copy of that dict.

Order matters: resource limits are set while still root (an unprivileged process cannot raise them back), then the
uid is dropped (which also makes the process non-dumpable: its /proc entries become unreadable to itself), then
``no_new_privs`` and the parent-death signal (the uid change clears a parent-death signal set earlier), and the
seccomp filter last (it refuses ``unshare`` and ``mount``, which the set-up uses: its own IPC namespace and /proc).

A source longer than :data:`WORKER_COMPILE_MAX_CHARS` is parsed, checked and compiled by the child, after all of
that: a hostile one (1 MB of ``a;a;a;...`` costs the compiler seconds and most of a gigabyte; string constant
folding grows quadratically with the source) then spends its own time and memory budget, not the worker's, which
must answer the next job. A shorter one (nearly every snippet a model writes) the worker compiles, at a bounded cost:
in the child the same work costs ~0.8 ms more (copy-on-write faults on the pages the parser, the check and the
compiler touch), a tenth of a trivial snippet's whole cost.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import io
import marshal
import os
import random
import resource
import signal
import struct
import sys
import tempfile
import traceback
from dataclasses import dataclass
from types import CodeType, TracebackType
from typing import Any

from sandbox.isolation import CLONE_NEWIPC, PR_SET_NO_NEW_PRIVS, PR_SET_PDEATHSIG, prctl, unshare
from sandbox.policy import SNIPPET_FILENAME, Policy
from sandbox.rootfs import mount_fresh_proc
from sandbox.seccomp import Filter

#: Bytes the child writes on its status pipe when the snippet died of a MemoryError.
STATUS_MEMORY = b"memory"
#: Bytes the child writes on its status pipe when the static check refused the snippet (nothing of it ran).
STATUS_REFUSED = b"refused"
#: Longest source the worker compiles itself: at most ~35 ms and ~9 MB of its time and memory for the costliest
#: source of this size measured (``a;a;...``, folded string constants), on a loaded 2-core VM.
WORKER_COMPILE_MAX_CHARS = 1024
_STATUS_FD = 3
_JOB_HEADER = struct.Struct("<dI?")  # run_timeout (s), memory_limit_mb, whether the body is compiled code


@dataclass
class ChildPlan:
    """What every child starts from; built once by the worker, before the zygote is forked (so it holds no job)."""

    namespace: dict[str, Any]
    run_dir: str
    uid: int | None
    max_processes: int
    max_open_files: int
    max_file_size_mb: int
    proc_options: str | None = None  # mount a fresh /proc (the minimal root) with these options; None: mount none
    ipc_namespace: bool = False  # enter a new IPC namespace (SysV and POSIX IPC of its own, gone when it ends)
    seccomp: Filter | None = None  # loaded last: refuses namespaces, mounts, keyrings, IPC, memfd, ptrace, ...
    policy: Policy | None = None  # the static check run on the snippet's syntax tree before it is compiled


@dataclass
class ChildJob:
    """One job as its child reads it from its own pipe: the snippet (compiled by the worker, or its source for the
    child to compile) and the job's limits."""

    code: CodeType | str
    run_timeout: float
    memory_limit_mb: int

    def encode(self) -> bytes:
        """The bytes the worker writes on the child's job pipe (a lone surrogate passes through, as in JSON)."""
        compiled = isinstance(self.code, CodeType)
        body = marshal.dumps(self.code) if compiled else self.code.encode("utf-8", "surrogatepass")
        return _JOB_HEADER.pack(self.run_timeout, self.memory_limit_mb, compiled) + body


def read_job(fd: int) -> ChildJob:
    """In the child: read the job its worker wrote on ``fd`` (to end of file)."""
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    os.close(fd)
    data = b"".join(chunks)
    run_timeout, memory_limit_mb, compiled = _JOB_HEADER.unpack_from(data)
    body = data[_JOB_HEADER.size:]
    code = marshal.loads(body) if compiled else body.decode("utf-8", "surrogatepass")
    return ChildJob(code, run_timeout, memory_limit_mb)


def run_child(plan: ChildPlan, job_fd: int, stdout_fd: int, stderr_fd: int, status_fd: int,
              stdin_fd: int | None = None) -> None:
    """Set up the child and run the snippet (``stdin_fd`` its stdin, else /dev/null); exits the process with the
    snippet's exit code."""
    exit_code = 1
    try:
        job = read_job(job_fd)
        _enter_sandbox(plan, job, (stdin_fd, stdout_fd, stderr_fd), status_fd)
        exit_code = (_run_snippet(plan, job.code) if isinstance(job.code, CodeType)
                     else _compile_and_run(plan, job.code))
    except BaseException:  # a failure of the set-up itself: report it, never return to the zygote
        with contextlib.suppress(OSError):
            os.write(2, f"sandbox child set-up failed:\n{traceback.format_exc()}".encode(errors="replace"))
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # a closed or broken stream must not keep the child alive
            pass
        os._exit(exit_code)


def _enter_sandbox(plan: ChildPlan, job: ChildJob, std_fds: tuple[int | None, int, int],
                   status_fd: int) -> None:
    os.setsid()  # own session and process group: the worker kills the group at the time limit
    if plan.ipc_namespace:
        unshare(CLONE_NEWIPC)
    reseed()  # forked from the zygote, every child would draw what the first one drew
    if plan.proc_options is not None:
        mount_fresh_proc(plan.proc_options)  # as root, before the limits read /proc/self/statm
    stdin_fd, stdout_fd, stderr_fd = std_fds
    os.dup2(os.open(os.devnull, os.O_RDONLY) if stdin_fd is None else stdin_fd, 0)
    os.dup2(stdout_fd, 1)
    os.dup2(stderr_fd, 2)
    os.dup2(status_fd, _STATUS_FD)
    os.closerange(_STATUS_FD + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    os.chdir(plan.run_dir)
    _set_limits(plan, job)
    if plan.uid is not None:
        os.setgroups([])
        os.setresgid(plan.uid, plan.uid, plan.uid)
        os.setresuid(plan.uid, plan.uid, plan.uid)
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if plan.seccomp is not None:
        plan.seccomp.install()


def prepare_worker_process(run_dir: str) -> None:
    """Once per worker: make its environment and standard streams exactly what every child should start with.

    The worker keeps fds 0-2 as /dev/null and its stderr; a child's ``dup2`` onto fds 0-2 then redirects these same
    stream objects to its pipes, so no child builds streams or an environment of its own.
    """
    os.environ.clear()
    os.environ.update(PATH="/usr/local/bin:/usr/bin:/bin", HOME=run_dir, TMPDIR=run_dir, LANG="C.UTF-8",
                      OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    tempfile.tempdir = None  # recomputed from TMPDIR on next use
    # Line-buffered so output printed before a timeout kill still reaches the worker.
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", line_buffering=True)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.argv = [SNIPPET_FILENAME]
    sys.set_int_max_str_digits(0)  # math snippets print 10**5-digit integers; the 4300-digit guard only gets in the way


def build_namespace(preamble: str | None) -> dict[str, Any]:
    """The globals every snippet starts from: ``__main__``'s basics plus whatever the preamble defines."""
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    if preamble:
        exec(compile(preamble, "<preamble>", "exec"), namespace)  # trusted server configuration
    return namespace


def reseed() -> None:
    """In each child: new random state, as a fresh interpreter would have.

    Every child is forked from the same zygote, so without this they would all draw what the first one drew.
    (``random`` reseeds itself in a forked child; this does it again explicitly, and numpy's global generator does
    not reseed itself at all.) A 32-bit seed from os.urandom: ``numpy.random.seed()`` without one costs three times
    as much.
    """
    random.seed(os.urandom(16))
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(int.from_bytes(os.urandom(4), "little"))


def _set_limits(plan: ChildPlan, job: ChildJob) -> None:
    page = os.sysconf("SC_PAGE_SIZE")
    with open("/proc/self/statm") as f:
        current = int(f.read().split()[0]) * page
    address_space = current + job.memory_limit_mb * 2**20  # a budget on top of the worker's own size
    cpu = int(job.run_timeout) + 2  # a backstop only: the worker's wall-time kill comes first
    limits = {
        resource.RLIMIT_AS: (address_space, address_space),
        resource.RLIMIT_CPU: (cpu, cpu + 1),
        resource.RLIMIT_FSIZE: (plan.max_file_size_mb * 2**20,) * 2,
        resource.RLIMIT_NOFILE: (plan.max_open_files,) * 2,
        resource.RLIMIT_CORE: (0, 0),
    }
    if plan.uid is not None:  # root ignores RLIMIT_NPROC, so it only means something after the uid drop
        limits[resource.RLIMIT_NPROC] = (plan.max_processes, plan.max_processes)
    for which, value in limits.items():
        resource.setrlimit(which, value)


def compile_snippet(source: str, policy: Policy | None) -> tuple[CodeType | None, str, str]:
    """(code object or None, error message, reason): reason is ``error`` for code Python cannot compile (``memory``
    when that was a MemoryError), ``refused`` when the static check refuses the snippet.

    Anything raised here is the snippet's error, reported as ``python`` would: a 2000-term sum makes the compiler
    raise RecursionError.
    """
    try:
        tree = ast.parse(source, filename=SNIPPET_FILENAME)
        if policy is not None:
            refusals = policy.check(tree)
            if refusals:
                return None, policy.report(refusals), "refused"
        return compile(tree, SNIPPET_FILENAME, "exec"), "", "ok"
    except Exception as e:  # SyntaxError, ValueError (NUL bytes), RecursionError, MemoryError, ...
        reason = "memory" if isinstance(e, MemoryError) else "error"
        return None, "".join(traceback.format_exception_only(type(e), e)), reason


def _compile_and_run(plan: ChildPlan, source: str) -> int:
    """Compile ``source`` under the child's limits (a refusal or a MemoryError marked on the status pipe), then run
    it; returns the exit code."""
    code, message, reason = compile_snippet(source, plan.policy)
    if code is None:
        if reason in ("refused", "memory"):
            with contextlib.suppress(OSError):
                os.write(_STATUS_FD, STATUS_REFUSED if reason == "refused" else STATUS_MEMORY)
        sys.stderr.write(message)
        return 1
    return _run_snippet(plan, code)


def _run_snippet(plan: ChildPlan, code: CodeType) -> int:
    try:
        exec(code, plan.namespace)  # this is the sandbox (the dict is this child's own copy)
        return 0
    except SystemExit as e:
        return _exit_code_of(e)
    except BaseException as e:  # every snippet failure is reported, like the interpreter does
        if isinstance(e, MemoryError):
            with contextlib.suppress(OSError):
                os.write(_STATUS_FD, STATUS_MEMORY)
        _print_snippet_traceback(e)
        return 1


def _exit_code_of(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code & 0xFF
    print(e.code, file=sys.stderr)
    return 1


def _print_snippet_traceback(e: BaseException) -> None:
    """Print the traceback starting at the snippet's own frame (the sandbox's frames mean nothing to the model)."""
    tb: TracebackType | None = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != SNIPPET_FILENAME:
        tb = tb.tb_next
    traceback.print_exception(type(e), e, tb if tb is not None else e.__traceback__, file=sys.stderr)
