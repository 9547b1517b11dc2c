"""Client for the local retriever (Search-R1 `/retrieve` schema), with request coalescing.

Many trajectories search at once; each calls `search(query)` and the client merges calls that
arrive within `window_s` (up to `max_batch`) into one `{"queries": [...]}` request, because the
retriever encodes and searches a batch far faster than the same queries one by one.
"""

from __future__ import annotations

import asyncio

from agent_env.observations import Doc, doc_from_contents
from agent_env.tools.http import JsonHttp, ToolError


def _schema_error(what: str) -> ToolError:
    return ToolError(f"retriever answer is not the /retrieve schema: {what}")


def parse_retrieve_response(data: dict, n_queries: int) -> list[list[Doc]]:
    """`{"result": [[{"document": {...}, "score": s} | {"id", "contents"}, ...], ...]}` → docs.

    Anything else, a 200 included, is a ToolError naming what is wrong: a body outside the
    schema must become a counted failure, never empty passages shown as if the search found them.
    """
    result = data.get("result") if isinstance(data, dict) else None
    if not isinstance(result, list) or len(result) != n_queries:
        raise _schema_error(f"'result' is {type(result).__name__}"
                            + (f" of {len(result)} lists" if isinstance(result, list) else "")
                            + f" for {n_queries} queries")
    out = []
    for hits in result:
        if not isinstance(hits, list):
            raise _schema_error(f"a query's hits are {type(hits).__name__}, not a list")
        docs = []
        for hit in hits:
            doc = hit.get("document", hit) if isinstance(hit, dict) else None
            if not isinstance(doc, dict) or not isinstance(doc.get("contents"), str):
                raise _schema_error(f"a hit has no 'contents' string ({str(hit)[:80]})")
            docs.append(doc_from_contents(doc.get("id", ""), doc["contents"]))
        out.append(docs)
    return out


class RetrieverClient:
    """`await search(query)` → top-k Docs; concurrent calls share batched HTTP requests."""

    def __init__(self, url: str, http: JsonHttp, topk: int = 3, window_s: float = 0.005, max_batch: int = 64):
        self.url, self.http, self.topk = url, http, topk
        self.window_s, self.max_batch = window_s, max_batch
        self._pending: list[tuple[str, asyncio.Future]] = []
        self._timer: asyncio.TimerHandle | None = None
        self.batches_sent = 0

    async def search(self, query: str) -> list[Doc]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()
        self._pending.append((query, fut))
        if len(self._pending) >= self.max_batch:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self.window_s, self._flush)
        return await fut

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._pending = self._pending, []
        if batch:
            asyncio.ensure_future(self._send(batch))

    async def _send(self, batch: list[tuple[str, asyncio.Future]]) -> None:
        self.batches_sent += 1
        queries = [q for q, _ in batch]
        try:
            data = await self.http.post(self.url, {"queries": queries, "topk": self.topk, "return_scores": True})
            results = parse_retrieve_response(data, len(queries))
        except ToolError as err:
            results = [err] * len(batch)
        except Exception as err:  # noqa: BLE001 - any failure must reach the waiting episodes
            results = [ToolError(f"{type(err).__name__}: {err}")] * len(batch)
        for (_, fut), res in zip(batch, results):
            if fut.done():
                continue
            if isinstance(res, Exception):
                fut.set_exception(res)
            else:
                fut.set_result(res)
