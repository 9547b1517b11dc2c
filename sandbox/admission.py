"""Bounded admission: at most `max_concurrency` running and `max_queue` waiting, else 429.

Training sends bursts of hundreds of `<code>` calls; an unbounded queue would turn a burst into
timeouts for everyone, so excess requests are refused at once with Retry-After and counted,
never dropped silently.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator


class QueueFull(RuntimeError):
    """No room to run or wait; the caller answers 429."""


class Admission:
    def __init__(self, max_concurrency: int, max_queue: int) -> None:
        if max_concurrency < 1 or max_queue < 0:
            raise ValueError(f"max_concurrency={max_concurrency} must be >= 1 and max_queue={max_queue} >= 0")
        self.max_concurrency = max_concurrency
        self.max_queue = max_queue
        self._lock = threading.Lock()
        self._slots = threading.Semaphore(max_concurrency)
        self.running = 0
        self.waiting = 0
        self.rejected = 0

    @contextmanager
    def slot(self) -> Iterator[None]:
        """Hold one execution slot for the duration of the block, or raise QueueFull."""
        with self._lock:
            if self.running + self.waiting >= self.max_concurrency + self.max_queue:
                self.rejected += 1
                raise QueueFull(f"{self.running} running and {self.waiting} queued")
            self.waiting += 1
        self._slots.acquire()
        with self._lock:
            self.waiting -= 1
            self.running += 1
        try:
            yield
        finally:
            with self._lock:
                self.running -= 1
            self._slots.release()
