"""Bounded admission: at most `max_concurrency` running and `max_queue` waiting, else 429.

Training sends bursts of hundreds of `<code>` calls; an unbounded queue would turn a burst into
timeouts for everyone, so excess requests are refused at once with Retry-After and counted,
never dropped silently. On shutdown `close()` lets the running finish and turns every waiting
and later request away (503), so no run is cut and no client waits for nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class QueueFull(RuntimeError):
    """No room to run or wait; the caller answers 429."""


class Closed(RuntimeError):
    """The service is draining for shutdown; the caller answers 503."""


class Admission:
    def __init__(self, max_concurrency: int, max_queue: int) -> None:
        if max_concurrency < 1 or max_queue < 0:
            raise ValueError(f"max_concurrency={max_concurrency} must be >= 1 and max_queue={max_queue} >= 0")
        self.max_concurrency = max_concurrency
        self.max_queue = max_queue
        self._cond = threading.Condition()
        self.running = 0
        self.waiting = 0
        self.rejected = 0
        self.closed = False

    @contextmanager
    def slot(self) -> Iterator[None]:
        """Hold one execution slot for the duration of the block, or raise QueueFull / Closed."""
        with self._cond:
            if self.closed:
                raise Closed("the sandbox is shutting down")
            if self.running + self.waiting >= self.max_concurrency + self.max_queue:
                self.rejected += 1
                raise QueueFull(f"{self.running} running and {self.waiting} queued")
            self.waiting += 1
            while self.running >= self.max_concurrency and not self.closed:
                self._cond.wait()
            self.waiting -= 1
            if self.closed:
                raise Closed("the sandbox is shutting down")
            self.running += 1
        try:
            yield
        finally:
            with self._cond:
                self.running -= 1
                self._cond.notify()

    def close(self) -> None:
        """Refuse new and waiting requests from now on; running ones keep their slot."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()
