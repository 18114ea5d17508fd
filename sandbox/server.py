"""The HTTP service: ``POST /run_code`` and ``GET /v1/ping`` (SandboxFusion's API), ``POST /run_batch``,
``GET /health``, ``GET /metrics``.

A SandboxFusion client can point at this server unchanged, and :class:`sandbox.client.SandboxClient` can point at a
real SandboxFusion. The response adds two keys SandboxFusion does not have and its clients ignore: ``request_id``
(echoed from the request, as the paper's client requires) and ``details`` (``reason``, ``output_truncated`` and
``limits_hit``: which limits the snippet ran into).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from sandbox.body import BodyParser, RunCodeRequest
from sandbox.bounds import BodyLimit, batch_share, validation_error
from sandbox.budget import budget_kind
from sandbox.config import ExecConfig
from sandbox.fairshare import FairShare
from sandbox.files import check_io
from sandbox.metrics import Metrics
from sandbox.pool import WorkerPool

log = logging.getLogger("sandbox")
_PYTHON = {"python", "python3"}
#: Layers ``--require_isolation`` does not require: the cgroup budget has a setting of its own (``require_cgroup``).
REQUIRED_SEPARATELY = frozenset({"cgroup_budget"})


def _resolve(req: RunCodeRequest, config: ExecConfig) -> tuple[dict[str, Any] | None, str]:
    """(job for the pool or None, message): the message explains a refusal, or notes a clamped limit."""
    if req.language is None:
        return None, "language: missing; SandboxFusion's API requires it: send \"language\": \"python\""
    if req.language.lower() not in _PYTHON:
        return None, f"language {req.language!r} is not supported by this sandbox; use 'python'"
    why = check_io(req.stdin, req.files, req.fetch_files, config.max_stdin_mb << 20, config.tmpfs_size_mb << 20)
    if why is not None:
        return None, why
    notes = []
    timeout = req.run_timeout if req.run_timeout and req.run_timeout > 0 else config.run_timeout
    if timeout > config.max_run_timeout:
        notes.append(f"run_timeout {timeout:g} s clamped to the server's max_run_timeout {config.max_run_timeout:g} s")
        timeout = config.max_run_timeout
    memory = req.memory_limit_MB if req.memory_limit_MB and req.memory_limit_MB > 0 else config.memory_limit_mb
    if memory > config.max_memory_limit_mb:
        notes.append(f"memory_limit_MB {memory} clamped to the server's max_memory_limit_mb "
                     f"{config.max_memory_limit_mb}")
        memory = config.max_memory_limit_mb
    job: dict[str, Any] = {"code": req.code, "run_timeout": timeout, "memory_limit_mb": memory}
    if req.stdin is not None:
        job["stdin"] = req.stdin
    if req.files:
        job["files"] = req.files
    if req.fetch_files:
        job["fetch_files"] = req.fetch_files
    return job, "; ".join(notes)


def to_sandboxfusion(result: dict[str, Any], request_id: str | int | None, message: str = "") -> dict[str, Any]:
    """Turn a worker's result into SandboxFusion's ``/run_code`` response.

    A request that cannot run (another language, no language, a bad file name, too much input) is ``Failed``
    with the reason in ``message`` and neither ``compile_result`` nor ``run_result``, as SandboxFusion answers
    what it will not run: ``SandboxError`` would make SandboxFusion's client retry it. A timeout's ``return_code``
    is null, as in SandboxFusion.
    """
    reason = result["reason"]
    base = {"compile_result": None, "executor_pod_name": None, "files": {}, "request_id": request_id}
    if reason in ("sandbox_error", "invalid_request"):
        status = "SandboxError" if reason == "sandbox_error" else "Failed"
        return {**base, "status": status, "message": result.get("error") or message, "run_result": None,
                "details": {"reason": reason, "output_truncated": False, "limits_hit": []}}
    timed_out = reason == "timeout"
    run_result = {
        "status": "TimeLimitExceeded" if timed_out else "Finished",
        "execution_time": result["execution_time"],
        "return_code": None if timed_out else result["return_code"],
        "stdout": result["stdout"],
        "stderr": result["stderr"],
    }
    problems = result.get("fetch_problems") or []
    if problems:
        message = "; ".join([*filter(None, [message]), "fetch_files: not fetched: " + "; ".join(problems)])
    status = "Success" if reason == "ok" and not problems else "Failed"
    return {**base, "status": status, "message": message, "run_result": run_result,
            "files": result.get("files") or {},
            "details": {"reason": reason, "output_truncated": result["output_truncated"],
                        "limits_hit": result["limits_hit"]}}


class SandboxService:
    """The request handlers, over one worker pool and one set of metrics."""

    def __init__(self, config: ExecConfig, pool: WorkerPool, metrics: Metrics) -> None:
        self.config = config
        self.pool = pool
        self.metrics = metrics
        self.batch_slots = FairShare(batch_share(pool.size))  # all batches together never hold every worker
        self.parser = BodyParser()

    def _busy(self) -> JSONResponse:
        self.metrics.record_rejected()
        typical = self.metrics.latency_summary()["p50_ms"] / 1000.0 or self.config.run_timeout
        retry_after = min(30, max(1, math.ceil(self.pool.queue_depth * typical / self.pool.size)))
        return JSONResponse({"detail": f"sandbox queue is full ({self.pool.queue_size} snippets admitted); "
                                       "retry later"}, status_code=429, headers={"Retry-After": str(retry_after)})

    async def _execute(self, req: RunCodeRequest, job: dict[str, Any] | None, message: str,
                       admit: bool = False) -> dict[str, Any]:
        """Run an admitted job (``admit``: take its room in the queue first, waiting for it if need be)."""
        if job is None:
            return to_sandboxfusion({"reason": "invalid_request", "error": message}, req.request_id)
        if admit:
            await self.pool.admit()
        start = time.perf_counter()
        result = await self.pool.run_admitted(job)
        self.metrics.record_result(result["reason"], time.perf_counter() - start)
        return to_sandboxfusion(result, req.request_id, message)

    async def _parse(self, kind: str, request: Request) -> Any:
        """The body as ``kind``'s request model, or a 413 response; a 422 is raised, as FastAPI would
        (:class:`sandbox.body.BodyParser`: a large body is parsed off the event loop)."""
        status, value = await self.parser.parse(kind, await request.body(), self.pool.queue_size)
        if status == 422:
            raise RequestValidationError(value)
        return JSONResponse({"detail": value}, status_code=413) if status == 413 else value

    async def run_code(self, request: Request) -> JSONResponse:
        """``POST /run_code``: one snippet, SandboxFusion's shape; 429 with Retry-After when the queue is full."""
        self.metrics.record_request("run_code")
        req = await self._parse("run_code", request)
        if isinstance(req, JSONResponse):
            return req
        job, message = _resolve(req, self.config)
        if job is not None and not self.pool.try_admit():
            return self._busy()
        return JSONResponse(await self._execute(req, job, message))

    async def run_batch(self, request: Request) -> JSONResponse:
        """``POST /run_batch``: several snippets, answered in the same order.

        Accepted when the queue has room for one snippet now (429 otherwise, 413 beyond ``queue_size`` entries);
        its entries then take room one at a time as each is about to run, so a batch holds no more of the queue
        than the workers it uses and ``/run_code`` requests still fit beside it. All batches together run at most
        :func:`batch_share` entries at once, the clients taking freed slots in turn (:class:`FairShare`).
        """
        self.metrics.record_request("run_batch")
        batch = await self._parse("run_batch", request)  # 413 beyond queue_size entries, before validating one
        if isinstance(batch, JSONResponse):
            return batch
        resolved = [_resolve(req, self.config) for req in batch.requests]
        if any(job is not None for job, _ in resolved) and not self.pool.has_room():
            return self._busy()
        client = request.client.host if request.client is not None else ""

        async def one(req: RunCodeRequest, job: dict[str, Any] | None, message: str) -> dict[str, Any]:
            if job is None:  # answered at once: takes no slot
                return await self._execute(req, job, message)
            async with self.batch_slots.slot(client):
                return await self._execute(req, job, message, admit=True)

        pairs = zip(batch.requests, resolved, strict=True)
        results = await asyncio.gather(*(one(req, job, msg) for req, (job, msg) in pairs))
        return JSONResponse({"results": results})

    async def health(self) -> dict[str, Any]:
        """``GET /health``: workers, every protection layer (on, or off with the reason), the file system view
        (``minimal`` with the exposed paths, or ``host`` with the reason), limits."""
        self.metrics.record_request("health")
        pool, config = self.pool, self.config
        layers = pool.layers()
        view = pool.filesystem()
        alive = len(pool.workers)
        return {
            "status": "ok" if alive == pool.size else ("degraded" if alive else "down"),
            "workers": pool.size, "workers_alive": alive, "queue_size": pool.queue_size,
            "protections": {k: ("on" if v is None else f"off: {v}") for k, v in sorted(layers.items())},
            "protections_off": sorted(k for k, v in layers.items() if v is not None),
            "filesystem_view": view["view"], "filesystem_view_reason": view["reason"],
            "exposed_paths": {"read_only": view["read_only"], "writable": view["writable"]},
            "sandbox_uids": pool.uids(), "server_pid": os.getpid(), "budget": budget_kind(pool.cgroup_subtree),
            "limits": {"run_timeout": config.run_timeout, "max_run_timeout": config.max_run_timeout,
                       "memory_limit_mb": config.memory_limit_mb, "max_memory_limit_mb": config.max_memory_limit_mb,
                       "max_output_bytes": config.max_output_bytes, "max_processes": config.max_processes,
                       "max_file_size_mb": config.max_file_size_mb, "tmpfs_size_mb": config.tmpfs_size_mb,
                       "max_stdin_mb": config.max_stdin_mb, "max_fetch_mb": config.max_fetch_mb},
            "static_check": config.static_check, "preamble": config.preamble is not None,
        }

    async def metrics_view(self) -> dict[str, Any]:
        """``GET /metrics``: requests, results by reason, 429s, latency percentiles, queue depth, kills by reason."""
        metrics, pool = self.metrics, self.pool
        return {
            "uptime_s": round(time.time() - metrics.started, 3),
            "requests": dict(metrics.requests), "results": dict(metrics.results),
            "rejected_429": metrics.rejected, "latency": metrics.latency_summary(),
            "in_flight": pool.pending, "busy_workers": pool.busy, "queue_depth": pool.queue_depth,
            "kills": dict(pool.kills), "worker_restarts": pool.restarts,
        }


def create_app(config: ExecConfig, workers: int, queue_size: int, startup_timeout: float = 120.0) -> FastAPI:
    """Build the FastAPI application; the worker pool starts and stops with the application's lifespan."""
    pool = WorkerPool(config, workers=workers, queue_size=queue_size, startup_timeout=startup_timeout)
    service = SandboxService(config, pool, Metrics())

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await pool.start()
        try:
            _report_layers(pool, config)
            yield
        finally:
            service.parser.close()
            await pool.stop()

    app = FastAPI(title="zerotir sandbox", lifespan=lifespan)
    app.add_middleware(BodyLimit)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.state.service = service
    app.add_api_route("/run_code", service.run_code, methods=["POST"])
    app.add_api_route("/run_batch", service.run_batch, methods=["POST"])
    app.add_api_route("/health", service.health, methods=["GET"])
    app.add_api_route("/metrics", service.metrics_view, methods=["GET"])
    app.add_api_route("/v1/ping", ping, methods=["GET"])
    return app


async def ping() -> str:
    """``GET /v1/ping``: SandboxFusion's liveness check, answered ``"pong"`` (``/health`` says more)."""
    return "pong"


def _report_layers(pool: WorkerPool, config: ExecConfig) -> None:
    layers = pool.layers()
    off = {k: v for k, v in layers.items() if v is not None}
    log.info("sandbox: %d workers ready; protections on: %s", pool.size,
             ", ".join(sorted(k for k, v in layers.items() if v is None)))
    for layer, reason in sorted(off.items()):
        log.warning("sandbox: protection OFF: %s (%s)", layer, reason)
    view = pool.filesystem()
    if view["view"] == "minimal":
        log.info("sandbox: filesystem view: minimal; snippets read %s and write %s", ", ".join(view["read_only"]),
                 ", ".join(view["writable"]))
    else:
        log.warning("sandbox: filesystem view: host (%s): snippets can read every world-readable host file",
                    view["reason"])
    required = sorted(set(off) - REQUIRED_SEPARATELY)
    if required and config.require_isolation:
        raise RuntimeError(f"--require_isolation is set but these protections are off: {required}")
