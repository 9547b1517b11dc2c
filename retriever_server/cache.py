"""Thread-safe LRU cache: query → the best hits seen for it (reused for any smaller top-k)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Generic, TypeVar

T = TypeVar("T")


class LRUCache(Generic[T]):
    """Maps a query to its ranked hits; a hit list for k answers any request with topk ≤ k."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._d: OrderedDict[str, list[T]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, query: str, k: int, index_size: int) -> list[T] | None:
        """The top-``k`` hits if cached (a shorter list is enough when the index is that small)."""
        if self.capacity <= 0:
            return None
        with self._lock:
            got = self._d.get(query)
            if got is not None and (len(got) >= k or len(got) >= index_size):
                self._d.move_to_end(query)
                self.hits += 1
                return got[:k]
            self.misses += 1
            return None

    def put(self, query: str, hits: Sequence[T]) -> None:
        if self.capacity <= 0:
            return
        with self._lock:
            old = self._d.get(query)
            if old is None or len(hits) >= len(old):
                self._d[query] = list(hits)
            self._d.move_to_end(query)
            while len(self._d) > self.capacity:
                self._d.popitem(last=False)

    def __len__(self) -> int:
        return len(self._d)

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0
