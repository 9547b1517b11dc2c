"""The web-search bill: how many queries ``/search`` may send to the provider per minute and per day.

Why: the proxy keeps the Serper key off the workers, but whoever can call ``/search`` spends its
credits, and a runaway rollout loop spends a month's in an afternoon. ``--max-queries-per-minute``
and ``--max-queries-per-day`` cap the queries that reach the provider; a cache hit costs nothing
and is never refused. A request whose uncached queries do not fit is refused whole, before any is
sent (``BudgetExceeded``: the app answers 429 with ``Retry-After``, the seconds until enough of
the window's spend has aged out), so a refusal never spends.

The windows roll (the last 60 s, the last 24 h) and count in fixed buckets (1 s, 1 min): memory is
bounded whatever the limits, and the day window errs on the side of the bill (a query counts for up
to a minute longer than 24 h). Past spend is passed in at start (the web cache keeps it), so a
restart does not hand out a fresh day.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

MINUTE_S, DAY_S = 60, 86_400
WINDOWS = ("minute", "day")  # bounded: the metrics' label values


class BudgetExceeded(RuntimeError):
    """The request's provider queries do not fit a window; ``retry_after_s`` says when they would."""

    def __init__(self, message: str, window: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.window, self.retry_after_s = window, retry_after_s


class RollingCount:
    """Events in the last ``span_s`` seconds, kept per ``bucket_s`` bucket."""

    def __init__(self, span_s: int, bucket_s: int) -> None:
        self.bucket_s, self.n_buckets = bucket_s, span_s // bucket_s
        self._buckets: deque[list[int]] = deque()  # [bucket index, count], oldest first
        self._total = 0

    def _expire(self, now: float) -> None:
        first = int(now // self.bucket_s) - self.n_buckets + 1
        while self._buckets and self._buckets[0][0] < first:
            self._total -= self._buckets.popleft()[1]

    def total(self, now: float) -> int:
        self._expire(now)
        return self._total

    def add(self, n: int, now: float) -> None:
        idx = int(now // self.bucket_s)
        if self._buckets and self._buckets[-1][0] >= idx:  # same bucket (or a clock that stepped back)
            self._buckets[-1][1] += n
        else:
            self._buckets.append([idx, n])
        self._total += n
        self._expire(now)

    def wait_for_room(self, n: int, limit: int, now: float) -> float:
        """Seconds until ``n`` more fit under ``limit`` (0: now; inf: never, ``n > limit``)."""
        excess = self.total(now) + n - limit
        if excess <= 0:
            return 0.0
        if n > limit:
            return math.inf
        freed = 0
        for idx, count in self._buckets:
            freed += count
            if freed >= excess:
                return (idx + self.n_buckets) * self.bucket_s - now
        return self.n_buckets * self.bucket_s  # unreachable: the buckets hold the whole total


@dataclass(frozen=True)
class Limits:
    per_minute: int | None = None
    per_day: int | None = None

    def validate(self) -> None:
        for name, value in (("--max-queries-per-minute", self.per_minute), ("--max-queries-per-day", self.per_day)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")


class QueryBudget:
    """``charge(n)`` before sending ``n`` queries to the provider: either all fit, or none is taken."""

    def __init__(self, limits: Limits = Limits(), *, spent: Iterable[float] = (),
                 clock: Callable[[], float] = time.time) -> None:
        limits.validate()
        self.limits, self.clock = limits, clock
        self._windows = {"minute": (RollingCount(MINUTE_S, 1), limits.per_minute),
                         "day": (RollingCount(DAY_S, 60), limits.per_day)}
        self._lock = threading.Lock()
        self.rejected: Counter[str] = Counter()
        now = clock()
        for t in sorted(spent):
            if now - t < DAY_S:
                for count, _ in self._windows.values():
                    count.add(1, t)

    def charge(self, n: int) -> None:
        """Count ``n`` provider queries, or raise BudgetExceeded without counting any."""
        if n <= 0:
            return
        with self._lock:
            now = self.clock()
            for window, (count, limit) in self._windows.items():
                if limit is None:
                    continue
                wait = count.wait_for_room(n, limit, now)
                if wait > 0:
                    self.rejected[window] += 1
                    raise BudgetExceeded(_refusal(window, n, limit, count.total(now), wait), window,
                                         _retry_after(wait, window))
            for count, _ in self._windows.values():
                count.add(n, now)

    def usage(self) -> dict[str, dict[str, int | None]]:
        """Per window: queries sent to the provider in it and the limit (None: unlimited)."""
        with self._lock:
            now = self.clock()
            return {w: {"used": count.total(now), "limit": limit, "rejected": self.rejected[w]}
                    for w, (count, limit) in self._windows.items()}


def _retry_after(wait_s: float, window: str) -> int:
    span = MINUTE_S if window == "minute" else DAY_S
    return span if math.isinf(wait_s) else max(1, math.ceil(wait_s))


def _refusal(window: str, n: int, limit: int, used: int, wait_s: float) -> str:
    flag = f"--max-queries-per-{window}"
    if math.isinf(wait_s):
        return (f"web-search budget: this request needs {n} provider queries, more than {flag} {limit} "
                f"allows at once; send at most {limit} uncached queries per request")
    return (f"web-search budget spent: {used} of {flag} {limit} queries reached the provider in the last "
            f"{window}; {n} more fit in {math.ceil(wait_s)} s")
