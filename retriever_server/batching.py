"""Dynamic batching: concurrent requests share one encoder forward and one index search.

Request threads (waitress/gunicorn workers) ``submit`` their queries and block on a future; a
single worker thread takes the first waiting job, keeps collecting for a few milliseconds (or
until ``max_batch`` queries), de-duplicates, runs one search with the largest top-k asked for,
and hands each job its slice.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable, Generic, Sequence, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")
SearchFn = Callable[[Sequence[str], int], list[list[T]]]


@dataclass
class _Job(Generic[T]):
    queries: list[str]
    k: int
    future: Future = field(default_factory=Future)


class DynamicBatcher(Generic[T]):
    def __init__(self, search: SearchFn, *, window_ms: float = 5.0, max_batch: int = 64) -> None:
        if max_batch <= 0 or window_ms < 0:
            raise ValueError("max_batch must be > 0 and window_ms >= 0")
        self._search, self.window, self.max_batch = search, window_ms / 1000.0, max_batch
        self._q: queue.Queue[_Job | None] = queue.Queue()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="retriever-batcher", daemon=True)
        self._thread.start()

    def submit(self, queries: Sequence[str], k: int) -> Future:
        """Queue ``queries``; the future resolves to one ranked hit list per query."""
        if self._closed:
            raise RuntimeError("batcher is closed")
        job: _Job = _Job(list(queries), k)
        self._q.put(job)
        return job.future

    def close(self, timeout: float = 5.0) -> None:
        self._closed = True
        self._q.put(None)
        self._thread.join(timeout)

    def _collect(self, first: _Job) -> tuple[list[_Job], bool]:
        """Gather jobs for up to one window; returns them and whether close() was seen."""
        jobs, n = [first], len(first.queries)
        deadline = time.monotonic() + self.window
        while n < self.max_batch:
            remaining = deadline - time.monotonic()
            try:
                job = self._q.get(timeout=remaining) if remaining > 0 else self._q.get_nowait()
            except queue.Empty:
                break
            if job is None:
                return jobs, True
            jobs.append(job)
            n += len(job.queries)
        return jobs, False

    def _loop(self) -> None:
        stop = False
        while not stop:
            first = self._q.get()
            if first is None:
                break
            jobs, stop = self._collect(first)
            self._run(jobs)
        while True:  # fail whatever is still queued instead of leaving callers hanging
            try:
                job = self._q.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                job.future.set_exception(RuntimeError("retriever is shutting down"))

    def _run(self, jobs: list[_Job]) -> None:
        unique = list(dict.fromkeys(q for j in jobs for q in j.queries))
        k = max(j.k for j in jobs)
        try:
            results = dict(zip(unique, self._search(unique, k)))
        except Exception as e:  # the error goes to every waiting request, the worker lives on
            log.exception("batched search failed")
            for j in jobs:
                j.future.set_exception(e)
            return
        for j in jobs:
            j.future.set_result([results[q][:j.k] for q in j.queries])
