"""The zygote: a clean copy of the warm worker that only forks snippet children, so no job's data is ever in them.

A child forked from the worker itself inherits the worker's memory, and with it what earlier jobs left there (their
code, their output, freed but not overwritten): a snippet scanning its own memory found the number the previous one
printed. So after warm-up the worker forks the zygote once, before it has seen any job, and from then on asks it
for each child over a Unix socket. The zygote never reads a job: it receives the child's four pipe ends
(``SCM_RIGHTS``; a fifth, its stdin, when the job has one), forks, gives them to the child, closes its copies
and answers the child's pid. The child reads its code and limits from its own pipe
(:func:`sandbox.child.read_job`) and writes its output to pipes whose read ends only the worker holds. The
zygote also reaps the child (it is its parent) when the worker asks, after the worker saw the exit or killed it,
and without PID namespaces kills the orphans the child left (the zygote is their subreaper).

Messages, one datagram each (``SOCK_SEQPACKET``): ``F`` with four or five fds -> ``P<pid>``; ``R<pid>`` ->
``S<status>``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import sys
import traceback

from sandbox.child import ChildPlan, run_child
from sandbox.isolation import PR_SET_CHILD_SUBREAPER, PR_SET_PDEATHSIG, PidNamespaces, prctl

_PID = struct.Struct("<q")
_FDS = 4  # the child's job pipe (read end), stdout, stderr and status pipes (write ends) ...
_MAX_FDS = 5  # ... and its stdin, when the job has one


class ZygoteGone(RuntimeError):
    """The zygote died or broke its protocol; the worker cannot run snippets any more and exits to be replaced."""


class Zygote:
    """The worker's handle on its zygote. Start it after warm-up and before the first job.

    Args:
        plan: What every child starts from (namespace, run dir, uid, fixed limits).
        pidns: Per-child PID namespaces, entered by the zygote around each fork.
        keep_fds: The worker's own fds the zygote must not keep (the protocol pipes to the server).
    """

    def __init__(self, plan: ChildPlan, pidns: PidNamespaces, keep_fds: tuple[int, ...] = ()) -> None:
        worker_end, zygote_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.pid = os.fork()
        if self.pid == 0:  # pragma: no cover - the zygote never returns
            code = 1
            try:
                worker_end.close()
                for fd in keep_fds:
                    with contextlib.suppress(OSError):
                        os.close(fd)
                code = _serve(zygote_end, plan, pidns)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.write(2, f"sandbox zygote failed:\n{traceback.format_exc()}".encode(errors="replace"))
            finally:
                os._exit(code)
        zygote_end.close()
        self.sock = worker_end

    def fork_child(self, fds: list[int]) -> int:
        """A new child holding ``fds`` (job read end, stdout, stderr, status write ends, and the stdin when
        there is one); returns its pid."""
        self._ask(b"F", fds)
        return self._answer(b"P")

    def reap(self, pid: int) -> int:
        """Reap child ``pid`` (already exited or killed by the worker) and its orphans; returns its wait status."""
        self._ask(b"R" + _PID.pack(pid), [])
        return self._answer(b"S")

    def stop(self) -> None:
        """End the zygote (it exits on the socket's end of file) and reap it."""
        self.sock.close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)

    def _ask(self, message: bytes, fds: list[int]) -> None:
        try:
            socket.send_fds(self.sock, [message], fds)
        except OSError as e:
            raise ZygoteGone(f"the zygote is gone: {e}") from e

    def _answer(self, kind: bytes) -> int:
        reply = self.sock.recv(64)
        if len(reply) != 1 + _PID.size or reply[:1] != kind:
            raise ZygoteGone(f"the zygote answered {reply!r}, expected {kind!r} and a number")
        return _PID.unpack(reply[1:])[0]


def _serve(sock: socket.socket, plan: ChildPlan, pidns: PidNamespaces) -> int:
    """The zygote's loop: fork on ``F``, reap on ``R``, exit on end of file.

    Each message is handled in a frame of its own that is gone before the next one arrives, so the loop's frame
    holds no value of any job: a child walking up its frames (``sys._getframe().f_back``) reaches this frame, and
    the previous child's wait status kept here would be an 8-bit channel from one snippet to the next.
    """
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the worker's death takes the zygote down
    prctl(PR_SET_CHILD_SUBREAPER, 1)  # without PID namespaces, a snippet's orphans come back to us to be killed
    while True:
        done = _handle_one(sock, plan, pidns)
        if done is not None:
            return done


def _handle_one(sock: socket.socket, plan: ChildPlan, pidns: PidNamespaces) -> int | None:
    """Answer one message; None to go on, else the zygote's exit code. A child forked here sees only its own
    message and fds in this frame."""
    message, fds, _, _ = socket.recv_fds(sock, 64, _MAX_FDS)
    if not message:
        return 0
    if message[:1] == b"F" and _FDS <= len(fds) <= _MAX_FDS:
        pidns.before_fork()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child never returns from run_child
            sock.close()
            run_child(plan, *fds)
        pidns.after_fork()
        for fd in fds:
            os.close(fd)
        sock.send(b"P" + _PID.pack(pid))
        return None
    if message[:1] == b"R" and len(message) == 1 + _PID.size:
        _reap(sock, _PID.unpack(message[1:])[0], pidns.enabled)
        return None
    print(f"sandbox zygote: unexpected message {message[:16]!r} with {len(fds)} fds", file=sys.stderr)
    return 1


def _reap(sock: socket.socket, pid: int, pid_namespaces: bool) -> None:
    """Wait for child ``pid`` (and, without PID namespaces, kill its orphans); send its wait status."""
    _, status = os.waitpid(pid, 0)
    if not pid_namespaces:
        _kill_adopted_orphans()
    sock.send(b"S" + _PID.pack(status))


def _kill_adopted_orphans() -> None:
    """Without PID namespaces the zygote is a child subreaper: orphans of the snippet become its children."""
    pids: set[int] = set()
    task_dir = f"/proc/{os.getpid()}/task"
    for tid in os.listdir(task_dir):
        try:
            with open(f"{task_dir}/{tid}/children") as f:
                pids.update(int(p) for p in f.read().split())
        except OSError:
            continue
    for orphan in pids:
        with contextlib.suppress(OSError):
            os.killpg(orphan, signal.SIGKILL)
        try:
            os.kill(orphan, signal.SIGKILL)
            os.waitpid(orphan, 0)
        except OSError:
            pass
