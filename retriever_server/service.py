"""Dense retrieval behind the cache and the dynamic batcher; what the Flask routes call."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import TimeoutError as FutureTimeout

from .batching import DynamicBatcher
from .cache import LRUCache
from .config import ServerConfig
from .metrics import Metrics
from .native_heap import HeapTrimmer
from .retriever import Hit, Retriever


class RetrievalService:
    def __init__(self, retriever: Retriever, config: ServerConfig, metrics: Metrics) -> None:
        self.retriever, self.config, self.metrics = retriever, config, metrics
        self.cache: LRUCache[Hit] = LRUCache(config.cache_size)
        self.heap = HeapTrimmer(config.malloc_trim_interval_s)
        self.batcher = (DynamicBatcher(self._search, window_ms=config.batch_window_ms, max_batch=config.max_batch,
                                       max_tokens=config.max_batch_tokens, cost=retriever.estimate_tokens)
                        if config.batching else None)

    def _search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        self.metrics.batch(len(queries))
        hits = self.retriever.search(queries, k)
        self.heap.maybe_trim()
        return hits

    def _search_unbatched(self, queries: list[str], k: int) -> list[list[Hit]]:
        """The baseline: this request alone, in forwards of at most ``max_batch`` queries."""
        step = self.config.max_batch
        return [hits for i in range(0, len(queries), step) for hits in self._search(queries[i:i + step], k)]

    def retrieve(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """Ranked hits per query: cached ones directly, the rest searched (batched)."""
        queries = [self.retriever.clip(q) for q in queries]  # the cache keys too: bounded memory
        out: list[list[Hit] | None] = [self.cache.get(q, k, self.retriever.size) for q in queries]
        todo = list(dict.fromkeys(q for q, r in zip(queries, out) if r is None))
        if todo:
            if self.batcher is not None:
                future = self.batcher.submit(todo, k)
                try:
                    found = future.result(timeout=self.config.request_timeout_s)
                except FutureTimeout:
                    future.cancel()  # the batcher drops what this request has not searched yet
                    raise
            else:
                found = self._search_unbatched(todo, k)
            fresh = dict(zip(todo, found))
            for q, hits in fresh.items():
                self.cache.put(q, hits)
            out = [r if r is not None else fresh[q][:k] for q, r in zip(queries, out)]
        return [r or [] for r in out]

    def close(self) -> None:
        if self.batcher is not None:
            self.batcher.close()
