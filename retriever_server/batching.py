"""Dynamic batching with fair micro-batches: concurrent requests share encoder forwards, and one
huge request cannot hold small ones back.

Request threads ``submit`` their queries and block on a future. One worker thread keeps the
requests that still have queries to search; each step it builds one micro-batch by taking one
query from each waiting request in turn (round-robin), up to ``max_batch`` distinct queries and
``max_tokens`` padded tokens (queries × the longest one's ``cost``: an encoder pads every row to
the longest), searches it with the largest top-k asked for, and hands every request its hits.
A one-query request that arrives while a 4,096-query request is being searched therefore waits
for the micro-batch in progress and rides in the next one, whose size the token budget bounds
even when the big request's queries are long. When nothing is in progress, the first request
waits ``window_ms`` for company before its micro-batch starts.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Generic, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")
SearchFn = Callable[[Sequence[str], int], list[list[T]]]


class ShuttingDown(RuntimeError):
    """The batcher was closed before this request was searched."""


def _settle(future: Future, result: object = None, error: BaseException | None = None) -> None:
    """Resolve ``future`` unless its caller cancelled it meanwhile (timed out and left)."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:
        pass


@dataclass
class _Job(Generic[T]):
    queries: list[str]
    k: int
    todo: deque[str] = field(init=False)
    found: dict[str, list[T]] = field(default_factory=dict)
    future: Future = field(default_factory=Future)

    def __post_init__(self) -> None:
        self.todo = deque(dict.fromkeys(self.queries))

    def finish_if_done(self) -> None:
        if not self.todo:
            _settle(self.future, [self.found[q][:self.k] for q in self.queries])


class DynamicBatcher(Generic[T]):
    def __init__(self, search: SearchFn, *, window_ms: float = 5.0, max_batch: int = 64,
                 max_tokens: int | None = None, cost: Callable[[str], int] = lambda q: 1) -> None:
        if max_batch <= 0 or window_ms < 0 or (max_tokens is not None and max_tokens <= 0):
            raise ValueError("max_batch and max_tokens must be > 0 and window_ms >= 0")
        self._search, self.window, self.max_batch = search, window_ms / 1000.0, max_batch
        self.max_tokens, self._cost = max_tokens, cost
        self._q: queue.Queue[_Job | None] = queue.Queue()
        self._active: deque[_Job] = deque()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="retriever-batcher", daemon=True)
        self._thread.start()

    def submit(self, queries: Sequence[str], k: int) -> Future:
        """Queue ``queries``; the future resolves to one ranked hit list per query."""
        if self._closed:
            raise ShuttingDown("retriever is shutting down")
        job: _Job = _Job(list(queries), k)
        if not job.todo:
            job.future.set_result([])
        else:
            self._q.put(job)
        return job.future

    def close(self, timeout: float = 5.0) -> None:
        """Stop after the micro-batch in progress; requests not yet searched fail with ShuttingDown."""
        self._closed = True
        self._q.put(None)
        self._thread.join(timeout)

    def _take_new(self) -> bool:
        """Move submitted jobs to the active list; with none active, block for one and then wait
        one window for company. Returns False once close() was called."""
        deadline = None
        while True:
            try:
                if not self._active:
                    job = self._q.get()
                    deadline = time.monotonic() + self.window
                elif deadline is not None and self._pending_queries() < self.max_batch:
                    job = self._q.get(timeout=max(0.0, deadline - time.monotonic()))
                else:
                    job = self._q.get_nowait()
            except queue.Empty:
                return True
            if job is None:
                return False
            self._active.append(job)

    def _pending_queries(self) -> int:
        return sum(len(j.todo) for j in self._active)

    def _fits(self, batch: dict[str, list[_Job]], longest: int, query: str) -> bool:
        if query in batch or not batch:
            return True
        if len(batch) >= self.max_batch:
            return False
        return self.max_tokens is None or (len(batch) + 1) * max(longest, self._cost(query)) <= self.max_tokens

    def _next_batch(self) -> dict[str, list[_Job]]:
        """Distinct queries, one per active job in turn, within ``max_batch`` and ``max_tokens``
        (always at least one); query → the jobs wanting it."""
        batch: dict[str, list[_Job]] = {}
        longest = 0
        while self._active:
            job = self._active[0]
            if job.future.done():  # cancelled: its caller timed out and left
                self._active.popleft()
                continue
            q = job.todo[0]
            if not self._fits(batch, longest, q):
                break
            self._active.popleft()
            job.todo.popleft()
            batch.setdefault(q, []).append(job)
            longest = max(longest, self._cost(q))
            if job.todo:
                self._active.append(job)
        return batch

    def _loop(self) -> None:
        while self._take_new():
            self._run(self._next_batch())
        failed = list(self._active)
        while True:
            try:
                job = self._q.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                failed.append(job)
        for job in failed:  # never leave a caller hanging
            _settle(job.future, error=ShuttingDown("retriever is shutting down"))

    def _run(self, batch: dict[str, list[_Job]]) -> None:
        if not batch:
            return
        jobs = list({id(j): j for js in batch.values() for j in js}.values())
        try:
            results = self._search(list(batch), max(j.k for j in jobs))
        except Exception as e:  # the error goes to every request in the batch, the worker lives on
            log.exception("batched search failed")
            for j in jobs:
                _settle(j.future, error=e)
            self._active = deque(j for j in self._active if not j.future.done())
            return
        for (q, waiting), hits in zip(batch.items(), results):
            for j in waiting:
                j.found[q] = hits
        for j in jobs:
            j.finish_if_done()
