"""The sandbox at cluster scale, on one machine: K simulated engines against one shared server and against one
server per (simulated) node on the same cores, side by side in one run.

    python -m benchmarks.sandbox_scale --engines 4 --nodes 2 --workers 2
    python -m benchmarks.sandbox_scale --quick

Each engine is a ``SandboxClient`` sending a stream of typical snippets (``print(1+1)`` and a sympy ``solve``, in
turn) with ``--concurrency`` calls in flight, as an engine's rows do. The layouts share the ``--workers`` worker
processes of this machine:

- ``shared``: one server of W workers; every engine's client sends to it.
- ``per-node``: N servers of W / N workers each (``model.hosts.sandbox_per_node``); engine k sends to server
  k mod N only, as an engine reaches its own node's server.
- ``pool``: the same N servers, each engine's client given all of them (``model.tool.sandbox.urls`` with several
  URLs: least-loaded routing, ``sandbox.client_pool``).

Printed per layout: calls/s, and the p50 / p99 wait of one call (client side, queueing included). Then fairness on
the shared server: the single calls' waits alone, and beside one batch-heavy client looping ``run_many`` over
``--batch`` snippets (the server's fair share keeps a single call from waiting behind the whole batch). Then the
routing's own cost: ``ServerPool`` acquire + release per call, in microseconds and as a share of a call's p50.

On one machine capacity cannot grow with nodes (the layouts share the same cores); what the per-node layout
changes is where the queueing happens (N queues of W / N workers instead of one of W) and that no call crosses the
network between nodes. On a real cluster each node's server brings that node's cores, so capacity grows with the
nodes that host engines.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
from collections.abc import Iterator

import numpy as np

from benchmarks.sandbox_throughput import TRIVIAL, sympy_snippet
from sandbox import SandboxClient, local_sandbox
from sandbox.client_pool import ServerPool


def snippets(engine: int, count: int) -> list[str]:
    """Engine ``engine``'s stream: ``print(1+1)`` and a sympy ``solve`` in turn, coefficients per call."""
    return [TRIVIAL if i % 2 == 0 else sympy_snippet(1000 * engine + i) for i in range(count)]


def split_workers(workers: int, nodes: int) -> list[int]:
    """``workers`` shared out over ``nodes`` servers (at least one each; the first ones take the remainder)."""
    if nodes < 1 or workers < nodes:
        raise ValueError(f"--workers {workers} over --nodes {nodes}: need at least one worker per node")
    return [workers // nodes + (1 if k < workers % nodes else 0) for k in range(nodes)]


def summary(waits: list[float], seconds: float) -> dict[str, float]:
    """Calls per second over ``seconds``, and the p50 / p99 wait in milliseconds."""
    ms = np.asarray(waits) * 1000.0
    return {"calls": len(waits), "per_s": len(waits) / seconds, "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99))}


@contextlib.contextmanager
def servers(sizes: list[int]) -> Iterator[list[str]]:
    """One local server per entry of ``sizes`` (its worker count), sympy importable; their URLs."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(local_sandbox(workers=n, log_level="warning"))[0] for n in sizes]


async def _engine(client: SandboxClient, codes: list[str], concurrency: int, waits: list[float]) -> int:
    """Send ``codes`` with ``concurrency`` in flight; each call's wait into ``waits``; the failures."""
    queue = list(reversed(codes))
    failed = 0

    async def lane() -> None:
        nonlocal failed
        while queue:
            code = queue.pop()
            start = time.perf_counter()
            result = await client.run(code, run_timeout=10.0)
            waits.append(time.perf_counter() - start)
            failed += not result.ok

    await asyncio.gather(*(lane() for _ in range(concurrency)))
    return failed


async def run_engines(urls_of: list[list[str]], calls: int, concurrency: int) -> dict[str, float]:
    """Engine k sends ``calls`` snippets to ``urls_of[k]``, all engines at once; the layout's summary."""
    waits: list[float] = []
    clients = [SandboxClient(urls, retries=3) for urls in urls_of]
    start = time.perf_counter()
    failed = await asyncio.gather(*(_engine(c, snippets(k, calls), concurrency, waits)
                                    for k, c in enumerate(clients)))
    seconds = time.perf_counter() - start
    for client in clients:
        await client.aclose()
    if sum(failed):
        raise RuntimeError(f"{sum(failed)} snippet(s) failed: the benchmark measures working calls only")
    return summary(waits, seconds)


async def beside_a_batch(url: str, engines: int, calls: int, concurrency: int, batch: int) -> dict[str, float]:
    """The single calls of ``engines`` engines on ``url`` while one more client loops ``run_many`` over
    ``batch`` snippets until they are done; the single calls' summary, and the batches' snippets per second."""
    stop = asyncio.Event()
    batched = [0]

    async def batch_client() -> None:
        async with SandboxClient(url) as client:
            while not stop.is_set():
                results = await client.run_many(snippets(99, batch), run_timeout=10.0)
                batched[0] += sum(r.ok for r in results)

    task = asyncio.ensure_future(batch_client())
    start = time.perf_counter()
    try:
        out = await run_engines([[url]] * engines, calls, concurrency)
    finally:
        stop.set()
        await task
    out["batch_per_s"] = batched[0] / (time.perf_counter() - start)
    return out


async def routing_cost_us(nodes: int, rounds: int = 20000) -> float:
    """Microseconds of one ``ServerPool`` acquire + release over ``nodes`` servers (median of 5 runs)."""
    pool = ServerPool([f"http://10.0.0.{k}:8080" for k in range(nodes)], max_per_server=64)
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(rounds):
            async with pool.slot():
                pass
        runs.append((time.perf_counter() - start) / rounds * 1e6)
    return float(np.median(runs))


def row(name: str, s: dict[str, float]) -> str:
    return f"| {name} | {s['calls']} | {s['per_s']:.1f} | {s['p50_ms']:.1f} | {s['p99_ms']:.1f} |"


async def measure(args: argparse.Namespace) -> list[str]:
    """Every layout, the fairness pair and the routing cost; the report's lines."""
    sizes = split_workers(args.workers, args.nodes)
    lines = [f"{args.engines} engines x {args.calls} calls ({args.concurrency} in flight each), {args.workers} "
             f"workers; load {os.getloadavg()[0]:.1f}", "",
             "| layout | calls | calls/s | p50 wait ms | p99 wait ms |", "|---|---:|---:|---:|---:|"]
    with servers([args.workers]) as shared:
        alone = await run_engines([shared] * args.engines, args.calls, args.concurrency)
        lines.append(row(f"shared: 1 server x {args.workers} workers", alone))
        beside = await beside_a_batch(shared[0], args.engines, args.calls, args.concurrency, args.batch)
    with servers(sizes) as node_urls:
        per_node = [[node_urls[k % len(node_urls)]] for k in range(args.engines)]
        lines.append(row(f"per-node: {args.nodes} servers x {sizes} workers",
                         await run_engines(per_node, args.calls, args.concurrency)))
        lines.append(row(f"pool: {args.nodes} servers, every URL, least loaded",
                         await run_engines([node_urls] * args.engines, args.calls, args.concurrency)))
    cost = await routing_cost_us(args.nodes)
    lines += ["", "| single calls on the shared server | p50 wait ms | p99 wait ms |", "|---|---:|---:|",
              f"| alone | {alone['p50_ms']:.1f} | {alone['p99_ms']:.1f} |",
              f"| beside a client looping run_many({args.batch}) ({beside['batch_per_s']:.1f} snippets/s) | "
              f"{beside['p50_ms']:.1f} | {beside['p99_ms']:.1f} |", "",
              f"routing (ServerPool acquire + release, {args.nodes} servers): {cost:.1f} us per call, "
              f"{100 * cost / 1000 / alone['p50_ms']:.3f}% of a call's p50 ({alone['p50_ms']:.1f} ms; target < 2%)"]
    return lines


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", type=int, default=4, help="simulated engines (one client each)")
    parser.add_argument("--nodes", type=int, default=2, help="servers of the per-node layout")
    parser.add_argument("--workers", type=int, default=2, help="worker processes in every layout, all servers")
    parser.add_argument("--calls", type=int, default=40, help="snippets per engine")
    parser.add_argument("--concurrency", type=int, default=2, help="calls in flight per engine")
    parser.add_argument("--batch", type=int, default=32, help="snippets per run_many of the batch-heavy client")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 engines x 4 calls, batches of 4")
    args = parser.parse_args(argv)
    if args.quick:
        args.engines, args.calls, args.batch = 2, 4, 4
    return args


def main(argv: list[str] | None = None) -> list[str]:
    lines = asyncio.run(measure(parse(argv)))
    print("\n".join(lines))
    return lines


if __name__ == "__main__":
    main()
