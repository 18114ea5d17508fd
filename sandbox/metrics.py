"""Counters and latency percentiles behind ``GET /metrics`` (in-process, reset when the server restarts)."""

from __future__ import annotations

import time
from collections import Counter, deque

import numpy as np

#: Latencies kept for the percentiles (a sliding window of the most recent snippets).
LATENCY_WINDOW = 4096


class Metrics:
    """What the server counts: requests per endpoint, results per reason, 429s, and per-snippet latency."""

    def __init__(self) -> None:
        self.started = time.time()
        self.requests: Counter[str] = Counter()
        self.results: Counter[str] = Counter()
        self.rejected = 0
        self.latencies: deque[float] = deque(maxlen=LATENCY_WINDOW)

    def record_request(self, endpoint: str) -> None:
        """Count one HTTP request to ``endpoint``."""
        self.requests[endpoint] += 1

    def record_result(self, reason: str, latency_s: float) -> None:
        """Count one finished snippet (``reason`` as in the worker's result) and its server-side latency."""
        self.results[reason] += 1
        self.latencies.append(latency_s)

    def record_rejected(self) -> None:
        """Count one request answered 429 because the queue was full."""
        self.rejected += 1

    def latency_summary(self) -> dict[str, float | int]:
        """p50 / p95 / p99 / max in milliseconds over the window (zeros before the first snippet)."""
        if not self.latencies:
            return {"count": 0, "p50_ms": 0.0, "p95_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
        values = np.fromiter(self.latencies, dtype=float) * 1000.0
        p50, p95, p99 = np.percentile(values, [50, 95, 99])
        return {"count": int(values.size), "p50_ms": round(float(p50), 3), "p95_ms": round(float(p95), 3),
                "p99_ms": round(float(p99), 3), "max_ms": round(float(values.max()), 3)}
