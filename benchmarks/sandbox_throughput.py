"""Sandbox throughput and latency through HTTP, against a fresh ``python -c`` per call, measured in one run.

    python -m benchmarks.sandbox_throughput --workers 2
    python -m benchmarks.sandbox_throughput --workers 2 --compare 4f6f0c1

``--layers`` prints instead what each per-snippet layer costs on its own (root only): entering an IPC
namespace and loading the seccomp filter, timed inside children forked from this process (numpy and sympy loaded,
like a worker), and mounting + detaching the run dir's tmpfs (in a private mount namespace); medians of 200.

``--compare REV`` also measures the sandbox of git revision ``REV`` in the same run (its ``sandbox/`` extracted to a
temp dir, served and measured by a child run of this script that imports it), and prints its rows beside today's.

Starts a real server (``sandbox.local_sandbox``), sends ``print(1+1)`` and a sympy ``solve`` (different coefficients
per call, so no cache helps) through ``SandboxClient`` with ``--concurrency`` requests in flight, and runs the same
snippets as ``python -c`` subprocesses with ``--workers`` in flight (the baseline gets no HTTP overhead, which
favours it). Prints a Markdown table, the ratios, and the targets (150/s trivial, 40/s sympy, sympy >= 10x baseline).

The machine may be shared, so it also counts the CPU time every process involved spent per call (server, workers,
snippet children, this client; or this process and its ``python -c`` children for the baseline) and prints the
throughput that CPU time allows on the cores of this machine when nothing else runs: ``cores / cpu_per_call``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

import httpx

from sandbox import SandboxClient, local_sandbox

TRIVIAL = "print(1+1)"
TARGETS = {"trivial": 150.0, "sympy": 40.0}


def sympy_snippet(i: int) -> str:
    """A small symbolic solve whose coefficients change with ``i``: roots ``i + 1`` and ``i + 2``."""
    a, b = i + 1, i + 2
    return f"import sympy as sp\nx = sp.symbols('x')\nprint(sp.solve(x**2 - {a + b}*x + {a * b}, x))"


_TICK = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and of its children it has reaped (for a worker: every finished snippet)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[11:15]) / _TICK


def children(pid: int) -> list[int]:
    """The child processes of ``pid``."""
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


class CpuMeter:
    """CPU seconds spent by this process, its reaped children, and (optionally) a sandbox server and its workers."""

    def __init__(self, server_pid: int | None = None) -> None:
        self.pids = [server_pid] if server_pid else []
        if server_pid:  # the workers, and their zygotes (which reap the snippet children)
            self.pids += children(server_pid)
            self.pids += [zygote for worker in self.pids[1:] for zygote in children(worker)]

    def total(self) -> float:
        own = sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
                  for f in ("ru_utime", "ru_stime"))
        return own + sum(process_cpu(pid) for pid in self.pids)


@dataclass
class Measure:
    """Throughput, latency and CPU cost of one configuration."""

    name: str
    calls: int
    seconds: float
    latencies: list[float]
    failures: int
    cpu_seconds: float

    @property
    def per_second(self) -> float:
        return self.calls / self.seconds

    @property
    def cpu_ms_per_call(self) -> float:
        return self.cpu_seconds / self.calls * 1000

    def row(self) -> str:
        p50, p95 = np.percentile(np.array(self.latencies) * 1000, [50, 95])
        capacity = (os.cpu_count() or 1) * 1000 / self.cpu_ms_per_call
        return (f"| {self.name} | {self.calls} | {self.per_second:.1f} | {p50:.1f} | {p95:.1f} | "
                f"{self.cpu_ms_per_call:.1f} | {capacity:.0f} | {self.failures} |")


async def measure(name: str, codes: list[str], concurrency: int, call: Callable[[str], Awaitable[bool]],
                  meter: CpuMeter) -> Measure:
    """Run ``call`` on every code with at most ``concurrency`` in flight; time each call, the whole, the CPU."""
    limit = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    failures = 0

    async def one(code: str) -> None:
        nonlocal failures
        async with limit:
            start = time.perf_counter()
            ok = await call(code)
            latencies.append(time.perf_counter() - start)
            failures += not ok

    cpu_start = meter.total()
    start = time.perf_counter()
    await asyncio.gather(*(one(code) for code in codes))
    seconds = time.perf_counter() - start
    return Measure(name, len(codes), seconds, latencies, failures, meter.total() - cpu_start)


async def fresh_python(code: str) -> bool:
    """The baseline: a new interpreter per snippet."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    await proc.communicate()
    return proc.returncode == 0


async def run_all(url: str, args: argparse.Namespace) -> list[Measure]:
    server_pid = httpx.get(url + "/health", trust_env=False).json()["server_pid"]
    meter, own = CpuMeter(server_pid), CpuMeter()
    async with SandboxClient(url, max_concurrency=args.concurrency, run_timeout=10.0) as client:

        async def sandboxed(code: str) -> bool:
            return (await client.run(code)).ok

        await measure("warm-up", [TRIVIAL] * 50 + [sympy_snippet(-50 - i) for i in range(20)], args.concurrency,
                      sandboxed, meter)
        trivial = await measure("sandbox, print(1+1)", [TRIVIAL] * args.calls, args.concurrency, sandboxed, meter)
        sympy = await measure("sandbox, sympy solve", [sympy_snippet(i) for i in range(args.sympy_calls)],
                              args.concurrency, sandboxed, meter)
    if args.rows_only:
        return [trivial, sympy]
    base_trivial = await measure("fresh python -c, print(1+1)", [TRIVIAL] * args.baseline_calls, args.workers,
                                 fresh_python, own)
    base_sympy = await measure("fresh python -c, sympy solve", [sympy_snippet(i) for i in range(args.baseline_calls)],
                               args.workers, fresh_python, own)
    return [trivial, sympy, base_trivial, base_sympy]


def _timed_in_child(step: Callable[[], None]) -> float:
    """Seconds ``step`` takes inside a freshly forked child."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        start = time.perf_counter()
        step()
        os.write(write_fd, repr(time.perf_counter() - start).encode())
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as f:
        seconds = float(f.read())
    os.waitpid(pid, 0)
    return seconds


def layer_costs(rounds: int = 200) -> None:
    """Print the median cost of each per-snippet layer (see the module docstring)."""
    import statistics

    import sympy  # noqa: F401  a warm process, like a worker

    from sandbox.isolation import (CLONE_NEWIPC, CLONE_NEWNS, MNT_DETACH, MS_NODEV, MS_NOSUID, MS_PRIVATE, MS_REC,
                                   PR_SET_NO_NEW_PRIVS, mount, prctl, umount, unshare)
    from sandbox.seccomp import Filter, build_filter

    seccomp = Filter(build_filter())

    def filtered() -> None:
        prctl(PR_SET_NO_NEW_PRIVS, 1)
        seccomp.install()

    def tmpfs() -> None:
        unshare(CLONE_NEWNS)
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        with tempfile.TemporaryDirectory() as run_dir:
            times = []
            for _ in range(rounds):
                start = time.perf_counter()
                mount("tmpfs", run_dir, "tmpfs", MS_NOSUID | MS_NODEV, "mode=700,size=64m,nr_inodes=16384")
                umount(run_dir, MNT_DETACH)
                times.append(time.perf_counter() - start)
        print(f"run dir tmpfs, mount + detach (in the worker): {statistics.median(times) * 1e6:.0f} us")

    for name, step in (("IPC namespace, unshare (in the child)", lambda: unshare(CLONE_NEWIPC)),
                       ("seccomp, no_new_privs + load (in the child)", filtered)):
        print(f"{name}: {statistics.median(_timed_in_child(step) for _ in range(rounds)) * 1e6:.0f} us")
    _timed_in_child(tmpfs)  # in a child: the private mount namespace stays there


def compare_rows(revision: str, args: argparse.Namespace) -> list[str]:
    """Measure the sandbox of git ``revision`` in a child run of this script; its two table rows, labelled."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory(prefix="sandbox-rev-") as tmp:
        archive = subprocess.run(["git", "-C", root, "archive", revision, "sandbox"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        os.chmod(tmp, 0o755)
        argv = [sys.executable, "-m", "benchmarks.sandbox_throughput", "--rows_only", "--workers", str(args.workers),
                "--concurrency", str(args.concurrency), "--calls", str(args.calls), "--sympy_calls",
                str(args.sympy_calls)]
        env = {**os.environ, "PYTHONPATH": root}  # cwd comes first in the import path: `import sandbox` finds the old copy
        out = subprocess.run(argv, cwd=tmp, env=env, check=True, capture_output=True, text=True).stdout
    rows = [line for line in out.splitlines() if line.startswith("| sandbox")]
    return [row.replace("| sandbox", f"| sandbox at {revision}", 1) for row in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="sandbox workers (and baseline processes in flight)")
    parser.add_argument("--concurrency", type=int, default=8,
                        help="client requests in flight (latency includes the wait behind the others)")
    parser.add_argument("--calls", type=int, default=1000, help="print(1+1) calls through the sandbox")
    parser.add_argument("--sympy_calls", type=int, default=400, help="sympy calls through the sandbox")
    parser.add_argument("--baseline_calls", type=int, default=20, help="calls of each kind for the baseline")
    parser.add_argument("--compare", metavar="REV", help="also measure the sandbox of this git revision")
    parser.add_argument("--layers", action="store_true", help="print each per-snippet layer's cost instead (root)")
    parser.add_argument("--rows_only", action="store_true", help=argparse.SUPPRESS)  # the --compare child run
    args = parser.parse_args()
    if args.layers:
        print(f"1-min load average {os.getloadavg()[0]:.1f}")
        layer_costs()
        return
    load_before = os.getloadavg()[0]
    with local_sandbox(workers=args.workers, log_level="warning") as urls:
        measures = asyncio.run(run_all(urls[0], args))
    if args.rows_only:
        for m in measures:
            print(m.row())
        return
    trivial, sympy, base_trivial, base_sympy = measures
    compared = compare_rows(args.compare, args) if args.compare else []
    load_after = os.getloadavg()[0]
    print(f"\n{os.cpu_count()} CPUs, {args.workers} workers, {args.concurrency} requests in flight; "
          f"1-min load average {load_before:.1f} before, {load_after:.1f} after\n")
    print("| configuration | calls | executions/s | p50 ms | p95 ms | CPU ms/call | /s if the CPUs were free | "
          "failures |")
    print("|---|---|---|---|---|---|---|---|")
    for row in [trivial.row(), sympy.row(), *compared, base_trivial.row(), base_sympy.row()]:
        print(row)
    print()
    ratios = {"trivial": trivial.per_second / base_trivial.per_second,
              "sympy": sympy.per_second / base_sympy.per_second}
    cores = os.cpu_count() or 1
    for kind, m in (("trivial", trivial), ("sympy", sympy)):
        verdict = "met" if m.per_second >= TARGETS[kind] else "NOT met"
        free = cores * 1000 / m.cpu_ms_per_call
        print(f"{kind}: {m.per_second:.1f}/s through HTTP (target {TARGETS[kind]:.0f}/s: {verdict} as measured; "
              f"{free:.0f}/s from its CPU cost on {cores} free cores); {ratios[kind]:.1f}x the fresh-interpreter "
              f"baseline")
    print(f"sympy speed-up target (>= 10x): {'met' if ratios['sympy'] >= 10 else 'NOT met'}")


if __name__ == "__main__":
    main()
