"""`/metrics` in Prometheus' text format through `prometheus_client`, the library vLLM uses.

Why the library and not hand-written text: the exposition is then the one Prometheus and every
scraper expect (escaping, `# HELP`/`# TYPE`, histogram buckets), and the process collector comes
with it (`process_resident_memory_bytes`, open fds, CPU seconds). Conventional names: `_total`
counters, `_seconds` units, a `sandbox_` prefix.

Every label set is bounded: HTTP codes outside a fixed list count as "other", run outcomes and
auth refusal reasons are enums, so no request (a random path, an odd status, a junk header) can
grow the exposition or the memory. The admission and pool gauges are read at scrape time from
callables the app passes in (a name ending in `_total` is exposed as a counter).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
HTTP_CODES = frozenset({200, 400, 401, 404, 405, 413, 415, 429, 431, 500, 503})
# `*_created` gauges (OpenMetrics start times) would double the series for a value nobody here
# reads; the switch is prometheus_client's own and process-wide (this service is its own process).
disable_created_metrics()
# what each scrape-time value means; a backend's pool names carry its prefix (`local_`, `docker_`)
HELP = {"running": "runs executing now (at most --max-concurrency)",
        "queued": "requests waiting for a free slot (at most --max-queue)",
        "rejected_total": "requests refused 429 because running and queued were full",
        "draining": "1 while the service shuts down (new requests get 503)",
        "max_concurrency": "--max-concurrency: runs at once", "max_queue": "--max-queue: requests allowed to wait",
        "pool_free": "warm sandboxes idle now", "sandboxes": "warm sandboxes alive",
        "recycled_total": "sandboxes proved clean after a run and reused",
        "replaced_total": "sandboxes dropped after a run (unclean, killed, died) and started afresh",
        "cgroup_slots": "cgroup slots of the local backend", "cgroup_version": "cgroup version in use (1 or 2)"}


def _help(name: str) -> str:
    return HELP.get(name) or next((text for key, text in HELP.items() if name.endswith("_" + key)), name)


class _ScrapeTimeGauges(Collector):
    """`gauges()` at each scrape: `{name: value}` → `sandbox_<name>` (a counter if `*_total`)."""

    def __init__(self, gauges: Callable[[], dict[str, float]]) -> None:
        self._gauges = gauges

    def collect(self) -> Iterator[Metric]:
        for name, value in sorted(self._gauges().items()):
            if name.endswith("_total"):
                yield CounterMetricFamily(f"sandbox_{name[:-len('_total')]}", _help(name), value=value)
            else:
                yield GaugeMetricFamily(f"sandbox_{name}", _help(name), value=value)


class Metrics:
    def __init__(self, gauges: Callable[[], dict[str, float]] = dict, outcomes: Iterable[str] = (),
                 auth_reasons: Iterable[str] = ()) -> None:
        """`outcomes` and `auth_reasons`: the label values, created at zero so dashboards see them."""
        self.registry = CollectorRegistry()
        self.requests = Counter("sandbox_http_requests", "HTTP answers by status code", ["code"],
                                registry=self.registry)
        self.runs = Counter("sandbox_runs", "finished runs by outcome", ["outcome"], registry=self.registry)
        self.execution = Histogram("sandbox_execution_seconds", "run time of the code, as reported",
                                   buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self.auth_failures = Counter("sandbox_auth_failures", "requests refused 401, by reason", ["reason"],
                                     registry=self.registry)
        for outcome in outcomes:
            self.runs.labels(outcome)
        for reason in auth_reasons:
            self.auth_failures.labels(reason)
        ProcessCollector(registry=self.registry)
        self.registry.register(_ScrapeTimeGauges(gauges))

    def observe_request(self, http_code: int) -> None:
        self.requests.labels(str(http_code) if http_code in HTTP_CODES else "other").inc()

    def observe_run(self, outcome: str, seconds: float) -> None:
        self.runs.labels(outcome).inc()
        self.execution.observe(seconds)

    def auth_failure(self, reason: str) -> None:
        self.auth_failures.labels(reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
