"""Google web search through Serper, with an on-disk sqlite cache keyed by query.

Reruns of the same questions (evaluation, seeds, debugging) then cost no API calls.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
from pathlib import Path

from agent_env.observations import Doc
from agent_env.tools.http import JsonHttp, ToolError

API_KEY_ENV = "SERPER_API_KEY"


class QueryCache:
    """Tiny sqlite key/value store: (query, num) → raw JSON answer."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).expanduser()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(self.path), check_same_thread=False)
        self._db.execute("CREATE TABLE IF NOT EXISTS cache (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        self._db.commit()

    @staticmethod
    def _key(query: str, num: int) -> str:
        return json.dumps([query.strip(), num])

    def get(self, query: str, num: int) -> dict | None:
        row = self._db.execute("SELECT value FROM cache WHERE key = ?", (self._key(query, num),)).fetchone()
        return json.loads(row[0]) if row else None

    def put(self, query: str, num: int, value: dict) -> None:
        self._db.execute("INSERT OR REPLACE INTO cache VALUES (?, ?)", (self._key(query, num), json.dumps(value)))
        self._db.commit()


def parse_serper(data: dict, topk: int) -> list[Doc]:
    """Organic results → Docs (id = link, text = snippet)."""
    organic = data.get("organic") if isinstance(data, dict) else None
    if not isinstance(organic, list):
        raise ToolError("web search answer has no 'organic' list")
    return [Doc(str(r.get("link", "")), str(r.get("title", "")), str(r.get("snippet", ""))) for r in organic[:topk]]


class WebSearchClient:
    """`await search(query)` → top-k Docs from Serper, served from the cache when possible."""

    def __init__(self, url: str, http: JsonHttp, cache_path: str, topk: int = 3, api_key: str | None = None):
        self.url, self.http, self.topk = url, http, topk
        self.api_key = api_key if api_key is not None else os.environ.get(API_KEY_ENV, "")
        self.cache = QueryCache(cache_path)
        self._lock = asyncio.Lock()

    async def search(self, query: str) -> list[Doc]:
        cached = self.cache.get(query, self.topk)
        if cached is not None:
            return parse_serper(cached, self.topk)
        if not self.api_key:
            raise ToolError(f"${API_KEY_ENV} is not set")
        data = await self.http.post(self.url, {"q": query, "num": self.topk},
                                    headers={"X-API-KEY": self.api_key, "Content-Type": "application/json"})
        docs = parse_serper(data, self.topk)
        async with self._lock:
            self.cache.put(query, self.topk, data)
        return docs
