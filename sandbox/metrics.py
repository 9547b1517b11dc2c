"""Counters for `/metrics` in Prometheus text format (no client library needed).

Every label set is bounded: HTTP codes outside a fixed list count as "other" and run outcomes are
an enum, so no request (a random path, an odd status) can grow the exposition or the memory.
"""

from __future__ import annotations

import threading
from collections import Counter

LATENCY_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
HTTP_CODES = frozenset({200, 400, 404, 405, 413, 415, 429, 431, 500, 503})


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[str] = Counter()  # by HTTP code
        self.runs: Counter[str] = Counter()  # by outcome
        self.buckets = [0] * (len(LATENCY_BUCKETS_S) + 1)
        self.exec_seconds = 0.0

    def observe_request(self, http_code: int) -> None:
        with self._lock:
            self.requests[str(http_code) if http_code in HTTP_CODES else "other"] += 1

    def observe_run(self, outcome: str, seconds: float) -> None:
        with self._lock:
            self.runs[outcome] += 1
            self.exec_seconds += seconds
            idx = next((i for i, b in enumerate(LATENCY_BUCKETS_S) if seconds <= b), len(LATENCY_BUCKETS_S))
            self.buckets[idx] += 1

    def render(self, gauges: dict[str, float]) -> str:
        """Prometheus exposition text; `gauges` come from admission and the backend."""
        with self._lock:
            lines = ["# TYPE sandbox_requests_total counter"]
            lines += [f'sandbox_requests_total{{code="{c}"}} {n}' for c, n in sorted(self.requests.items())]
            lines.append("# TYPE sandbox_runs_total counter")
            lines += [f'sandbox_runs_total{{outcome="{s}"}} {n}' for s, n in sorted(self.runs.items())]
            lines.append("# TYPE sandbox_execution_seconds histogram")
            cumulative = 0
            for bound, count in zip((*LATENCY_BUCKETS_S, "+Inf"), self.buckets):
                cumulative += count
                lines.append(f'sandbox_execution_seconds_bucket{{le="{bound}"}} {cumulative}')
            lines.append(f"sandbox_execution_seconds_sum {self.exec_seconds:.6f}")
            lines.append(f"sandbox_execution_seconds_count {cumulative}")
        for name, value in sorted(gauges.items()):
            lines.append(f"# TYPE sandbox_{name} gauge")
            lines.append(f"sandbox_{name} {value}")
        return "\n".join(lines) + "\n"
