"""The server's side of the pre-forked pool: worker processes, a bounded admission count, dispatch and respawn."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import shutil
import sys
import tempfile
from collections import Counter, deque
from typing import Any

from sandbox.budget import remove_budget, server_budget
from sandbox.config import ExecConfig, WorkerSpec
from sandbox.uids import UidRange, reserve

log = logging.getLogger("sandbox")

#: Extra seconds the server waits for a worker's answer beyond the snippet's own time limit before it declares the
#: worker hung, kills it and starts a new one.
WORKER_GRACE_S = 10.0
_LINE_LIMIT = 64 * 2**20
_BASE_PREFIX = "zerotir-sandbox-"


def _remove_stale_base_dirs() -> None:
    """Remove the (empty) temp dirs of servers that were killed before they could clean up."""
    tmp = tempfile.gettempdir()
    for name in os.listdir(tmp):
        if not name.startswith(_BASE_PREFIX):
            continue
        owner = name[len(_BASE_PREFIX):].split("-", 1)[0]
        if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
            shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)


class WorkerFailure(RuntimeError):
    """A worker died, hung or broke the protocol; the worker is replaced.

    ``delivered`` is False when the job never reached the worker (it had died while idle): the pool then runs the
    job on another worker; otherwise the request gets a SandboxError.
    """

    def __init__(self, message: str, delivered: bool = True) -> None:
        super().__init__(message)
        self.delivered = delivered


def worker_env() -> dict[str, str]:
    """The whole environment of a worker: nothing of the server's (its secrets stay out of the workers' memory)."""
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONPATH": package_parent,
            "PYTHONDONTWRITEBYTECODE": "1", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1"}


class WorkerProcess:
    """One ``python -m sandbox.worker`` process and the line protocol to it."""

    def __init__(self, spec: WorkerSpec, startup_timeout: float) -> None:
        self.spec = spec
        self.startup_timeout = startup_timeout
        self.proc: asyncio.subprocess.Process | None = None
        self.handshake: dict[str, Any] = {}
        self.retired = False  # set once the pool has given up on this process (it died or misbehaved)
        self._ids = itertools.count()

    async def start(self) -> None:
        """Spawn the worker and wait for its handshake; raises RuntimeError with the reason on failure."""
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sandbox.worker", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, env=worker_env(), limit=_LINE_LIMIT)
        self.proc.stdin.write(self.spec.to_json().encode() + b"\n")
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), self.startup_timeout)
        except asyncio.TimeoutError:
            await self.kill()
            raise RuntimeError(f"sandbox worker {self.spec.index} did not become ready within "
                               f"{self.startup_timeout:.0f} s (raise --startup_timeout on a slow machine)") from None
        except asyncio.CancelledError:  # the server is shutting down: leave no half-started worker behind
            await self.kill()
            raise
        message = json.loads(line) if line else {}
        if not message.get("ready"):
            await self.kill()
            reason = message.get("error") or "it exited during start-up (see its messages above)"
            raise RuntimeError(f"sandbox worker {self.spec.index} failed to start: {reason}")
        self.handshake = message

    async def execute(self, job: dict[str, Any]) -> dict[str, Any]:
        """Send one job and wait for its result; raises WorkerFailure if the worker dies, hangs or misbehaves."""
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        job = dict(job, id=next(self._ids))
        try:
            self.proc.stdin.write(json.dumps(job).encode() + b"\n")
            await self.proc.stdin.drain()
        except ConnectionError as e:
            raise WorkerFailure(f"worker {self.spec.index} is gone: {e}", delivered=False) from None
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), job["run_timeout"] + WORKER_GRACE_S)
        except asyncio.TimeoutError:
            raise WorkerFailure(f"worker {self.spec.index} did not answer within the time limit") from None
        if not line:
            raise WorkerFailure(f"worker {self.spec.index} exited (code {await self.proc.wait()})")
        try:
            result = json.loads(line)
        except ValueError:
            raise WorkerFailure(f"worker {self.spec.index} broke the protocol: {line[:200]!r}") from None
        if result.get("id") != job["id"]:
            raise WorkerFailure(f"worker {self.spec.index} answered job {result.get('id')}, expected {job['id']}")
        if result.get("reason") == "sandbox_error":
            raise WorkerFailure(f"worker {self.spec.index}: {result.get('error')}",
                                delivered=result.get("started", True))
        return result

    async def kill(self) -> None:
        """Kill the worker (its running child follows through the parent-death signal) and reap it."""
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()

    async def stop(self, timeout: float = 3.0) -> None:
        """Ask the worker to exit (end of its input), then kill it if it does not within ``timeout``."""
        if self.proc is None or self.proc.returncode is not None:
            return
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), timeout)
        except asyncio.TimeoutError:
            await self.kill()


class WorkerPool:
    """N worker processes behind a bounded admission count (running + waiting requests).

    Args:
        config: Limits and policy for every snippet.
        workers: Number of worker processes (each runs one snippet at a time).
        queue_size: Most snippets admitted at once (running + waiting); beyond it :meth:`try_admit` says no and the
            server answers 429.
        startup_timeout: Seconds a worker may take to import its modules and report ready.
    """

    def __init__(self, config: ExecConfig, workers: int, queue_size: int, startup_timeout: float = 120.0) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if queue_size < workers:
            raise ValueError(f"queue_size ({queue_size}) must be >= workers ({workers}) or workers would sit idle")
        self.config = config
        self.size = workers
        self.queue_size = queue_size
        self.startup_timeout = startup_timeout
        self.pending = 0
        self.restarts = 0
        self.kills: Counter[str] = Counter()
        self.workers: dict[int, WorkerProcess] = {}
        _remove_stale_base_dirs()
        self.base_dir = tempfile.mkdtemp(prefix=f"{_BASE_PREFIX}{os.getpid()}-")
        os.chmod(self.base_dir, 0o755)
        self._waiting: deque[asyncio.Future[None]] = deque()  # batch entries waiting for room, first come first
        self._idle: asyncio.Queue[WorkerProcess] = asyncio.Queue()
        self._busy = 0
        self._tasks: set[asyncio.Task] = set()
        self._closing = False
        self.cgroup_subtree: dict[str, str] | None = None  # the budget spec (sandbox.budget)
        self.cgroup_off: str | None = "disabled by --isolate false"
        self.uid_range: UidRange | None = None

    async def start(self) -> None:
        """Set up the per-snippet cgroups (or say why not), then start every worker in parallel; raises RuntimeError
        (and cleans up) if any fails, or if ``require_cgroup`` is set and there are no cgroups."""
        if self.config.isolate and os.geteuid() == 0:  # the uid drop needs root: reserve this server's uids
            try:
                self.uid_range = reserve(self.size, self.config.uid_base)
            except (OSError, ValueError) as e:
                self._remove_base_dir()
                raise RuntimeError(str(e)) from None
        if self.config.isolate:
            self.cgroup_subtree, self.cgroup_off = server_budget(self.config.cgroup_root)
        if self.cgroup_off is not None and self.config.require_cgroup:
            self._remove_base_dir()
            raise RuntimeError(f"--limits.require_cgroup is set but per-snippet cgroups are unavailable: "
                               f"{self.cgroup_off}; set --limits.require_cgroup false to use per-process rlimits")
        workers = [self._new_worker(i) for i in range(self.size)]
        results = await asyncio.gather(*(w.start() for w in workers), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await asyncio.gather(*(w.kill() for w in workers))
            self._remove_base_dir()
            raise RuntimeError(str(errors[0]))
        for worker in workers:
            self._enlist(worker)

    def _enlist(self, worker: WorkerProcess) -> None:
        """Make a started worker available, and watch it so that its death, even while idle, starts a new one."""
        self.workers[worker.spec.index] = worker
        self._idle.put_nowait(worker)
        self._background(self._watch(worker))

    async def _watch(self, worker: WorkerProcess) -> None:
        assert worker.proc is not None
        code = await worker.proc.wait()
        self._retire(worker, f"worker {worker.spec.index} exited with code {code}")

    def _retire(self, worker: WorkerProcess, why: str) -> None:
        """Forget ``worker`` (once) and start its replacement."""
        if worker.retired:
            return
        worker.retired = True
        if self.workers.get(worker.spec.index) is worker:
            del self.workers[worker.spec.index]
        if not self._closing:
            log.error("sandbox: %s; starting a replacement", why)
            self._background(self._respawn(worker.spec.index))

    def _background(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _new_worker(self, index: int) -> WorkerProcess:
        work_dir = os.path.join(self.base_dir, f"w{index}")
        os.makedirs(work_dir, exist_ok=True)
        spec = WorkerSpec(index=index, exec_config=self.config, work_dir=work_dir, server_pid=os.getpid(),
                          cgroup_subtree=self.cgroup_subtree, cgroup_off=self.cgroup_off,
                          uid_base=self.uid_range.base if self.uid_range is not None else None)
        return WorkerProcess(spec, self.startup_timeout)

    @property
    def busy(self) -> int:
        """Workers running a snippet right now."""
        return self._busy

    @property
    def queue_depth(self) -> int:
        """Admitted requests waiting for a worker."""
        return max(0, self.pending - self.busy)

    def try_admit(self, n: int = 1) -> bool:
        """Reserve room for ``n`` snippets; False when the bounded queue is full (the caller answers 429).

        Batch entries waiting for room (:meth:`admit`) come first: room freed is handed to them as it is freed.
        """
        if not self.has_room(n):
            return False
        self.pending += n
        return True

    def has_room(self, n: int = 1) -> bool:
        """Whether ``n`` snippets would be admitted now."""
        return not self._closing and self.pending + n <= self.queue_size

    async def admit(self) -> None:
        """Reserve room for one snippet, waiting (first come, first served) while the queue is full.

        A batch admits its entries one at a time with this, as each is about to run, so it holds no more of the
        queue than it runs: a batch of ``queue_size`` entries no longer makes every ``/run_code`` a 429.
        """
        if self.try_admit():
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(granted)
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():  # room was handed over just as we were cancelled
                self._release()
            raise

    def _release(self) -> None:
        """One admitted snippet is done: hand its room to the first waiting batch entry, if any."""
        self.pending -= 1
        while self._waiting and self.pending < self.queue_size:
            granted = self._waiting.popleft()
            if not granted.done():
                self.pending += 1
                granted.set_result(None)

    async def run_admitted(self, job: dict[str, Any]) -> dict[str, Any]:
        """Run one admitted job (see :meth:`try_admit`). Never raises for a snippet's failure.

        The work runs in its own task, shielded from the caller's cancellation (a client that disconnects), so a
        worker is always returned to the pool with its protocol in step.
        """
        return await asyncio.shield(asyncio.ensure_future(self._run(job)))

    async def _run(self, job: dict[str, Any]) -> dict[str, Any]:
        try:
            for _ in range(self.size + 1):  # a worker found dead on delivery: try the next one
                worker = await self._next_idle()
                if worker is None:
                    return {"reason": "sandbox_error", "error": "no sandbox worker is alive (restarts keep "
                                                                "failing; see the server log)"}
                self._busy += 1
                try:
                    result = await worker.execute(job)
                except Exception as e:  # any failure on the protocol (a line over the limit, ...) loses no worker
                    self.kills["worker_failure"] += 1
                    self._retire(worker, str(e))
                    await worker.kill()
                    if not isinstance(e, WorkerFailure) or e.delivered:
                        return {"reason": "sandbox_error", "error": f"{type(e).__name__}: {e}"
                                if not isinstance(e, WorkerFailure) else str(e)}
                    continue
                finally:
                    self._busy -= 1
                self._idle.put_nowait(worker)
                if result["reason"] in ("timeout", "memory", "signal"):
                    self.kills[result["reason"]] += 1
                return result
            return {"reason": "sandbox_error", "error": "every sandbox worker was found dead"}
        finally:
            self._release()

    async def _next_idle(self) -> WorkerProcess | None:
        """The next idle worker, or None when no worker has been alive for a whole start-up timeout."""
        dead_since: float | None = None
        loop = asyncio.get_running_loop()
        while True:
            try:
                worker = await asyncio.wait_for(self._idle.get(), 1.0)
                if not worker.retired and worker.proc is not None and worker.proc.returncode is None:
                    return worker
                self._retire(worker, f"worker {worker.spec.index} died while idle")
            except asyncio.TimeoutError:
                if self.workers:
                    dead_since = None
                    continue
                dead_since = dead_since or loop.time()
                if loop.time() - dead_since > self.startup_timeout:
                    return None

    async def _respawn(self, index: int) -> None:
        delay = 0.5
        while not self._closing:
            worker = self._new_worker(index)
            try:
                await worker.start()
            except RuntimeError as e:
                log.error("sandbox: restarting worker %d failed (%s); retrying in %.0f s", index, e, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
                continue
            if self._closing:
                await worker.kill()
                return
            self.restarts += 1
            self._enlist(worker)
            return

    def layers(self) -> dict[str, str | None]:
        """Protection layers: None when on in every worker, else the reason it is off (from the first worker)."""
        merged: dict[str, str | None] = {}
        for worker in self.workers.values():
            for layer, reason in worker.handshake.get("layers", {}).items():
                if merged.get(layer) is None:
                    merged[layer] = reason
        return merged

    def filesystem(self) -> dict[str, Any]:
        """The snippets' file system view: ``minimal`` only when every worker has it, else the first ``host`` one."""
        views = [self.workers[i].handshake["filesystem"] for i in sorted(self.workers)]
        host = [v for v in views if v["view"] != "minimal"]
        if host or not views:
            return host[0] if host else {"view": "host", "reason": "no worker is alive", "read_only": [],
                                         "writable": []}
        return views[0]

    def uids(self) -> list[int]:
        """The uids snippets run as (empty when the uid drop is off)."""
        return sorted(w.handshake["uid"] for w in self.workers.values() if w.handshake.get("uid") is not None)

    async def stop(self) -> None:
        """Stop every worker and remove the pool's temp dirs."""
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*(w.stop() for w in self.workers.values()), return_exceptions=True)
        self._remove_base_dir()

    def _remove_base_dir(self) -> None:
        shutil.rmtree(self.base_dir, ignore_errors=True)
        if self.uid_range is not None:
            self.uid_range.release()
            self.uid_range = None
        if self.cgroup_subtree is not None:
            try:
                remove_budget(self.cgroup_subtree)
            except OSError as e:
                log.error("sandbox: could not remove the cgroup subtree %s: %s", self.cgroup_subtree, e)
            self.cgroup_subtree = None
