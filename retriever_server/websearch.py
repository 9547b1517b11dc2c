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
exponential backoff (``Retry-After`` honoured, capped). The queries that miss the cache are
charged to a budget first (``retriever_server.budget``: per minute, per day), whose spend the same
sqlite file keeps across restarts.
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

from .budget import DAY_S, Limits, QueryBudget
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
    """(query, k) → JSON hits, and when queries reached the provider (the budget's spend, so that a
    restart does not forget it); one connection guarded by a lock (writes are rare and tiny)."""

    def __init__(self, path: str | Path) -> None:
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False)
        self._db.execute("CREATE TABLE IF NOT EXISTS serper (key TEXT PRIMARY KEY, value TEXT, t REAL)")
        self._db.execute("CREATE TABLE IF NOT EXISTS spend (t REAL, n INTEGER)")
        self._lock = threading.Lock()

    def record_spend(self, n: int, t: float) -> None:
        with self._lock, self._db:
            self._db.execute("INSERT INTO spend VALUES (?, ?)", (t, n))

    def spend_since(self, t0: float) -> list[float]:
        """One timestamp per provider query since ``t0``; older rows are dropped."""
        with self._lock, self._db:
            self._db.execute("DELETE FROM spend WHERE t < ?", (t0,))
            rows = self._db.execute("SELECT t, n FROM spend").fetchall()
        return [t for t, n in rows for _ in range(int(n))]

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
                 retries: int = 3, backoff_s: float = 0.5, timeout_s: float = 10.0,
                 budget: Limits = Limits()) -> None:
        self.api_key = api_key
        self.url = url or DEFAULT_SERPER_URL
        self.retries, self.backoff_s, self.timeout_s = retries, backoff_s, timeout_s
        self.cache = SqliteCache(cache_path or default_cache_path()) if api_key else None
        spent = self.cache.spend_since(time.time() - DAY_S) if self.cache else []
        self.budget = QueryBudget(budget, spent=spent)
        self._session = requests.Session()
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="serper")
        self._lock = threading.Lock()
        self.upstream_calls = 0  # HTTP requests sent to the provider (retries included)
        self.provider_queries = 0  # queries that missed the cache and were charged to the budget
        self.cache_hits = 0  # queries answered from the cache

    @classmethod
    def from_env(cls, cache_path: str | Path | None = None, **kw: Any) -> SerperClient:
        return cls(os.environ.get("SERPER_API_KEY") or None, url=os.environ.get("SERPER_URL") or None,
                   cache_path=cache_path, **kw)

    @property
    def enabled(self) -> bool:
        return bool(self.api_key)

    def search_many(self, queries: Sequence[str], k: int) -> list[list[dict[str, Any]]]:
        """Hits per query: cached ones from sqlite, the rest from the provider once the budget
        took them all (BudgetExceeded otherwise, before anything is sent)."""
        if not self.enabled:
            raise WebSearchUnavailable("web search is disabled: set SERPER_API_KEY (a serper.dev key) "
                                       "in the server's environment")
        assert self.cache is not None
        keys = [json.dumps([q, k]) for q in queries]
        found = {key: self.cache.get(key) for key in dict.fromkeys(keys)}
        todo = [key for key, hits in found.items() if hits is None]
        self.budget.charge(len(todo))
        with self._lock:
            self.cache_hits += len(keys) - sum(found[key] is None for key in keys)
            self.provider_queries += len(todo)
        if todo:
            self.cache.record_spend(len(todo), time.time())
            found.update(zip(todo, self._pool.map(lambda key: self._fetch(json.loads(key)[0], k, key), todo)))
        return [found[key] for key in keys]

    def search(self, query: str, k: int) -> list[dict[str, Any]]:
        return self.search_many([query], k)[0]

    def _fetch(self, query: str, k: int, key: str) -> list[dict[str, Any]]:
        hits = organic_to_hits(self._post(query, k), k)
        assert self.cache is not None
        self.cache.put(key, hits)
        return hits

    def stats(self) -> dict[str, Any]:
        """What ``/metrics`` reports of the web search: queries by source, provider requests, budget."""
        with self._lock:
            out: dict[str, Any] = {"enabled": self.enabled, "cache_hits": self.cache_hits,
                                   "provider_queries": self.provider_queries,
                                   "provider_requests": self.upstream_calls}
        out["budget"] = self.budget.usage()
        return out

    def _post(self, query: str, k: int) -> dict[str, Any]:
        headers = {"X-API-KEY": str(self.api_key), "Content-Type": "application/json"}
        last = "no attempt"
        for attempt in range(self.retries + 1):
            delay = self.backoff_s * (2 ** attempt)
            try:
                with self._lock:
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
