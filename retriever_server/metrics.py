"""Request counters, batch-size histogram, latency percentiles and process memory for
``GET /metrics.json`` (the JSON snapshot; ``GET /metrics`` is Prometheus text, ``prom.py``).

Labels are bounded: callers pass route names, never raw request paths.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from typing import Any

import numpy as np

from .native_heap import process_memory

LATENCY_WINDOW = 10_000  # percentiles over the most recent requests


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started = time.time()
        self.requests: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.queries = 0
        self.batches = 0
        self.batch_sizes: Counter[int] = Counter()
        self.auth_failures: Counter[str] = Counter()  # 401s by reason (missing, malformed, wrong)
        self._latency: dict[str, deque[float]] = {}

    def request(self, endpoint: str, n_queries: int, seconds: float) -> None:
        with self._lock:
            self.requests[endpoint] += 1
            self.queries += n_queries
            self._latency.setdefault(endpoint, deque(maxlen=LATENCY_WINDOW)).append(seconds)

    def error(self, endpoint: str, status: int) -> None:
        with self._lock:
            self.errors[f"{endpoint} {status}"] += 1

    def batch(self, size: int) -> None:
        """One encoder forward + index search over ``size`` distinct queries."""
        with self._lock:
            self.batches += 1
            self.batch_sizes[size] += 1

    def batch_histogram(self) -> dict[int, int]:
        """Forwards per batch size (a copy, for the Prometheus exposition)."""
        with self._lock:
            return dict(self.batch_sizes)

    def auth_failure(self, reason: str) -> None:
        with self._lock:
            self.auth_failures[reason] += 1

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            lat = {}
            for ep, d in self._latency.items():
                a = np.asarray(d) * 1000.0
                lat[ep] = {"count": len(a), "p50_ms": float(np.percentile(a, 50)),
                           "p90_ms": float(np.percentile(a, 90)), "p99_ms": float(np.percentile(a, 99)),
                           "mean_ms": float(a.mean())}
            sizes = self.batch_sizes
            total = sum(s * c for s, c in sizes.items())
            return {
                "uptime_s": time.time() - self.started,
                "requests": dict(self.requests), "errors": dict(self.errors), "queries": self.queries,
                "batches": self.batches,
                "batch_size": {"mean": total / self.batches if self.batches else 0.0,
                               "max": max(sizes) if sizes else 0,
                               "histogram": {str(k): v for k, v in sorted(sizes.items())}},
                "latency": lat,
                "auth_failures": dict(self.auth_failures),
                "memory": process_memory(),
            }
