"""Web search through Google (Serper), answered in the same shape as ``/retrieve``: the one Serper
client of the repository, behind ``POST /search``.

Why the proxy owns it and the agent does not: on a cluster the agent runs inside every Ray
rollout worker. A Serper client there puts the API key into every worker's environment (and
the job spec), gives every worker its own sqlite cache (the same query is paid for once per
worker, and sqlite on a shared filesystem locks writers out) and lets N uncoordinated clients
hit Serper's rate limit. Behind ``/search`` there is one key (``SERPER_API_KEY`` in this
server's environment only), one cache all workers share, one retry policy; and since ``/search``
answers like ``/retrieve``, the agent's ``web`` backend is its ``/retrieve`` client pointed at
``/search`` (``agent_env.tools.RetrieverClient``): one wire format, over HTTP only, so this
package still ships alone.

``SERPER_URL`` overrides the endpoint (tests point it at ``tests/fake_serper.py``).
Answers are cached in sqlite (repeated rollout queries cost nothing); 429 and 5xx are retried with
exponential backoff (``Retry-After`` honoured, capped).
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests

from .corpora import make_contents

log = logging.getLogger(__name__)

DEFAULT_SERPER_URL = "https://google.serper.dev/search"
RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
MAX_RETRY_AFTER_S = 30.0


class WebSearchUnavailable(RuntimeError):
    """No API key configured: HTTP 503."""


class WebSearchFailed(RuntimeError):
    """Upstream kept failing or refused the request: HTTP 502."""


def default_cache_path() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "retriever_server" / "serper.sqlite"


class SqliteCache:
    """(query, k) → JSON hits; one connection guarded by a lock (writes are rare and tiny)."""

    def __init__(self, path: str | Path) -> None:
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False)
        self._db.execute("CREATE TABLE IF NOT EXISTS serper (key TEXT PRIMARY KEY, value TEXT, t REAL)")
        self._lock = threading.Lock()

    def get(self, key: str) -> Any | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM serper WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def put(self, key: str, value: Any) -> None:
        with self._lock, self._db:
            self._db.execute("INSERT OR REPLACE INTO serper VALUES (?, ?, ?)",
                             (key, json.dumps(value), time.time()))


def organic_to_hits(payload: dict[str, Any], k: int) -> list[dict[str, Any]]:
    """Serper's ``organic`` list → ``[{"document": {"id", "contents"}, "score"}]`` (score = 1/rank)."""
    hits = []
    for rank, item in enumerate(payload.get("organic") or [], start=1):
        if not isinstance(item, dict):
            continue
        title, snippet = str(item.get("title", "")), str(item.get("snippet", ""))
        doc = {"id": str(item.get("link", f"serper-{rank}")), "contents": make_contents(title, snippet)}
        hits.append({"document": doc, "score": 1.0 / rank})
        if len(hits) == k:
            break
    return hits


class SerperClient:
    def __init__(self, api_key: str | None, *, url: str | None = None, cache_path: str | Path | None = None,
                 retries: int = 3, backoff_s: float = 0.5, timeout_s: float = 10.0) -> None:
        self.api_key = api_key
        self.url = url or DEFAULT_SERPER_URL
        self.retries, self.backoff_s, self.timeout_s = retries, backoff_s, timeout_s
        self.cache = SqliteCache(cache_path or default_cache_path()) if api_key else None
        self._session = requests.Session()
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="serper")
        self.upstream_calls = 0

    @classmethod
    def from_env(cls, cache_path: str | Path | None = None, **kw: Any) -> SerperClient:
        return cls(os.environ.get("SERPER_API_KEY") or None, url=os.environ.get("SERPER_URL") or None,
                   cache_path=cache_path, **kw)

    @property
    def enabled(self) -> bool:
        return bool(self.api_key)

    def search_many(self, queries: Sequence[str], k: int) -> list[list[dict[str, Any]]]:
        if not self.enabled:
            raise WebSearchUnavailable("web search is disabled: set SERPER_API_KEY (a serper.dev key) "
                                       "in the server's environment")
        return list(self._pool.map(lambda q: self.search(q, k), queries))

    def search(self, query: str, k: int) -> list[dict[str, Any]]:
        assert self.cache is not None
        key = json.dumps([query, k])
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        hits = organic_to_hits(self._post(query, k), k)
        self.cache.put(key, hits)
        return hits

    def _post(self, query: str, k: int) -> dict[str, Any]:
        headers = {"X-API-KEY": str(self.api_key), "Content-Type": "application/json"}
        last = "no attempt"
        for attempt in range(self.retries + 1):
            delay = self.backoff_s * (2 ** attempt)
            try:
                self.upstream_calls += 1
                r = self._session.post(self.url, json={"q": query, "num": k}, headers=headers,
                                       timeout=self.timeout_s)
            except requests.RequestException as e:
                last = f"{type(e).__name__}: {e}"
            else:
                if r.status_code == 200:
                    try:
                        return r.json()
                    except ValueError:
                        raise WebSearchFailed("Serper answered 200 with a body that is not JSON") from None
                last = f"HTTP {r.status_code}"
                if r.status_code not in RETRY_STATUS:
                    raise WebSearchFailed(f"Serper refused the request: {last} {r.text[:200]}")
                delay = _retry_after(r.headers.get("Retry-After"), delay)
            if attempt < self.retries:
                log.warning("Serper %s, retry %d/%d in %.2fs", last, attempt + 1, self.retries, delay)
                time.sleep(delay)
        raise WebSearchFailed(f"Serper failed after {self.retries + 1} attempts (last: {last})")

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        self._session.close()


def _retry_after(header: str | None, default: float) -> float:
    try:
        return min(max(float(header), 0.0), MAX_RETRY_AFTER_S) if header else default
    except ValueError:
        return default
