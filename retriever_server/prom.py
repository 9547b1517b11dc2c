"""``GET /metrics`` in Prometheus' text format, through ``prometheus_client`` (what vLLM uses).

Why: cluster dashboards scrape Prometheus (vLLM and Ray expose it), and a JSON endpoint is
invisible to them. The JSON snapshot stays at ``/metrics.json`` for the benchmarks and tests
that read percentiles from it (``retriever_server.metrics``).

Names follow Prometheus' conventions (``_total`` counters, base units: ``_seconds``, ``_bytes``)
and every label takes values from a fixed set, so no request can grow the exposition: ``route`` is
the app's rule for the path (``<unmatched>`` for any other), ``code`` an HTTP status from
``HTTP_CODES`` (else ``other``), ``reason``/``window``/``source``/``kind`` enums. What the server
already counts elsewhere (the cache, the batcher, the web search, memory, the index) is read at
scrape time by :class:`StateCollector`; HTTP answers are counted here as they are sent. The
process collector adds ``process_*`` (RSS, open fds, CPU seconds).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from .auth import REASONS

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
HTTP_CODES = frozenset({200, 400, 401, 404, 405, 408, 413, 429, 431, 500, 502, 503})
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
QUERY_ROUTES = ("/retrieve", "/search")
MB = 1 << 20
# prometheus_client adds a ``*_created`` gauge beside every counter and histogram (OpenMetrics'
# start time), doubling the series a scrape stores for a number no dashboard here reads. The switch
# is the library's and process-wide: where vLLM shares the process (single-machine runs), its
# counters lose that gauge too, and nothing of ours or theirs reads it.
disable_created_metrics()


def code_label(status: int) -> str:
    return str(status) if status in HTTP_CODES else "other"


class PromMetrics:
    """One registry per app (several apps share a test process), with the process collector."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.http_requests = Counter("retriever_http_requests", "HTTP answers by route and status code",
                                     ["route", "code"], registry=self.registry)
        self.latency = Histogram("retriever_http_request_duration_seconds", "time to answer, by route",
                                 ["route"], buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self.queries = Counter("retriever_queries", "queries in answered requests, by route", ["route"],
                               registry=self.registry)
        self.auth_failures = Counter("retriever_auth_failures", "requests refused 401, by reason", ["reason"],
                                     registry=self.registry)
        for route in QUERY_ROUTES:  # the series exist from the first scrape
            self.queries.labels(route)
            self.latency.labels(route)
        for reason in REASONS:
            self.auth_failures.labels(reason)
        ProcessCollector(registry=self.registry)

    def answered(self, route: str, status: int, seconds: float) -> None:
        self.http_requests.labels(route, code_label(status)).inc()
        self.latency.labels(route).observe(seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def _gauge(name: str, doc: str, value: float | None, labels: dict[str, str] | None = None) -> Iterator[Metric]:
    if value is None:
        return
    g = GaugeMetricFamily(name, doc, labels=list(labels or {}))
    g.add_metric(list((labels or {}).values()), float(value))
    yield g


class StateCollector(Collector):
    """What the server holds, read when Prometheus scrapes: each source is a callable that returns
    the same dicts ``/health`` and ``/metrics.json`` show (None where the part is absent)."""

    def __init__(self, *, retriever_info: Callable[[], dict[str, Any] | None],
                 memory: Callable[[], dict[str, float]], cache: Callable[[], dict[str, Any] | None],
                 batch_sizes: Callable[[], dict[int, int]], web: Callable[[], dict[str, Any]]) -> None:
        self._info, self._memory, self._cache, self._batches, self._web = retriever_info, memory, cache, batch_sizes, web

    def collect(self) -> Iterator[Metric]:
        yield from self._index()
        yield from self._cache_metrics()
        yield from self._batch_histogram()
        yield from self._memory_metrics()
        yield from self._web_metrics()

    def _index(self) -> Iterator[Metric]:
        info = self._info()
        if info is None:
            return
        yield from _gauge("retriever_index_passages", "passages in the served index", info.get("index_size"))
        yield from _gauge("retriever_index_nprobe", "IVF lists searched per query (the serving nprobe)",
                          info.get("nprobe"))
        yield from _gauge("retriever_index_k_factor", "re-rank depth: shortlist = k x this",
                          info.get("k_factor"))
        cal = info.get("calibration") or {}
        yield from _gauge("retriever_calibrated_nprobe", "the nprobe the build's calibration chose", cal.get("nprobe"))
        yield from _gauge("retriever_calibration_target_recall", "the recall the calibration aimed at",
                          cal.get("target"))
        yield from _gauge("retriever_calibrated_recall",
                          "recall@k against exact search that the build measured at the serving nprobe",
                          cal.get("recall_at_serving_nprobe"))

    def _cache_metrics(self) -> Iterator[Metric]:
        c = self._cache()
        if c is None:
            return
        yield from _gauge("retriever_cache_entries", "queries held by the LRU cache", c["size"])
        yield from _gauge("retriever_cache_capacity_entries", "the LRU cache's capacity (--cache-size)", c["capacity"])
        for name, key in (("retriever_cache_hits", "hits"), ("retriever_cache_misses", "misses")):
            yield CounterMetricFamily(name, f"dense queries the LRU cache {'answered' if key == 'hits' else 'missed'}",
                                      value=c[key])

    def _batch_histogram(self) -> Iterator[Metric]:
        sizes = self._batches()
        buckets = [(str(float(bound)), sum(n for s, n in sizes.items() if s <= bound)) for bound in BATCH_BUCKETS]
        buckets.append(("+Inf", sum(sizes.values())))
        yield HistogramMetricFamily("retriever_batch_size_queries", "distinct queries per encoder forward",
                                    buckets=buckets, sum_value=float(sum(s * n for s, n in sizes.items())))

    def _memory_metrics(self) -> Iterator[Metric]:
        mem = self._memory()
        g = GaugeMetricFamily("retriever_memory_bytes", "memory by kind: rss_anon is private (must fit the "
                              "machine), index_mapped the index's page cache, heap_* glibc's heap", labels=["kind"])
        for key, mb in sorted(mem.items()):
            if key.endswith("_mb"):
                g.add_metric([key[:-3]], float(mb) * MB)
        yield g

    def _web_metrics(self) -> Iterator[Metric]:
        web = self._web()
        yield from _gauge("retriever_websearch_enabled", "1 when /search has a provider key", float(web["enabled"]))
        q = CounterMetricFamily("retriever_websearch_queries", "/search queries by where the answer came from",
                                labels=["source"])
        q.add_metric(["cache"], web.get("cache_hits", 0))
        q.add_metric(["provider"], web.get("provider_queries", 0))
        yield q
        yield CounterMetricFamily("retriever_websearch_provider_requests",
                                  "HTTP requests sent to the provider (retries included)",
                                  value=web.get("provider_requests", 0))
        used = GaugeMetricFamily("retriever_websearch_budget_used_queries",
                                 "provider queries in the rolling window (the spend --max-queries-per-* caps)",
                                 labels=["window"])
        limit = GaugeMetricFamily("retriever_websearch_budget_limit_queries",
                                  "--max-queries-per-minute / --max-queries-per-day (absent: no limit)",
                                  labels=["window"])
        rejected = CounterMetricFamily("retriever_websearch_budget_rejected",
                                       "/search requests refused 429 by the budget, by window", labels=["window"])
        for window, u in web.get("budget", {}).items():
            used.add_metric([window], u["used"])
            if u["limit"] is not None:
                limit.add_metric([window], u["limit"])
            rejected.add_metric([window], u["rejected"])
        yield used
        yield limit
        yield rejected
