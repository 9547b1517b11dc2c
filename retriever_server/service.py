"""Dense retrieval behind the cache and the dynamic batcher; what the Flask routes call."""

from __future__ import annotations

from typing import Sequence

from .batching import DynamicBatcher
from .cache import LRUCache
from .config import ServerConfig
from .metrics import Metrics
from .retriever import Hit, Retriever


class RetrievalService:
    def __init__(self, retriever: Retriever, config: ServerConfig, metrics: Metrics) -> None:
        self.retriever, self.config, self.metrics = retriever, config, metrics
        self.cache: LRUCache[Hit] = LRUCache(config.cache_size)
        self.batcher = (DynamicBatcher(self._search, window_ms=config.batch_window_ms,
                                       max_batch=config.max_batch) if config.batching else None)

    def _search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        self.metrics.batch(len(queries))
        return self.retriever.search(queries, k)

    def retrieve(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """Ranked hits per query: cached ones directly, the rest in one (batched) search."""
        out: list[list[Hit] | None] = [self.cache.get(q, k, self.retriever.size) for q in queries]
        todo = list(dict.fromkeys(q for q, r in zip(queries, out) if r is None))
        if todo:
            if self.batcher is not None:
                found = self.batcher.submit(todo, k).result(timeout=self.config.request_timeout_s)
            else:
                found = self._search(todo, k)
            fresh = dict(zip(todo, found))
            for q, hits in fresh.items():
                self.cache.put(q, hits)
            out = [r if r is not None else fresh[q][:k] for q, r in zip(queries, out)]
        return [r or [] for r in out]

    def close(self) -> None:
        if self.batcher is not None:
            self.batcher.close()
