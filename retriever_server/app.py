"""Flask app factory: ``/retrieve`` (dense), ``/search`` (web), ``/health``, ``/metrics``
(Prometheus text) and ``/metrics.json`` (the same server's JSON snapshot, with percentiles).

Every client mistake answers 4xx ``{"error": ...}`` and the process lives on (400 for a bad body,
401 without the token when one is set, 429 past the web-search budget); unexpected failures
answer JSON 500 (logged), never an HTML page.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from flask import Flask, Response, g, jsonify, request
from werkzeug.exceptions import HTTPException

from . import auth
from .batching import ShuttingDown
from .budget import BudgetExceeded
from .config import ServerConfig
from .metrics import Metrics
from .native_heap import process_memory
from .prom import CONTENT_TYPE, PromMetrics, StateCollector
from .retriever import Retriever
from .schema import BadRequest, decode_body, format_result, parse_request
from .service import RetrievalService
from .websearch import SerperClient, WebSearchFailed, WebSearchUnavailable

log = logging.getLogger(__name__)
EXTENSION = "retriever_server"


class ServerState:
    """What the routes share; ``close()`` stops the batching thread and the web client."""

    def __init__(self, config: ServerConfig, retriever: Retriever | None, web: SerperClient) -> None:
        self.config, self.retriever, self.web = config, retriever, web
        self.metrics = Metrics()
        self.service = RetrievalService(retriever, config, self.metrics) if retriever else None
        self.auth = auth.BearerAuth(config.auth_token) if config.auth_token else None
        self.prom = PromMetrics()
        self.prom.registry.register(StateCollector(
            retriever_info=lambda: self.retriever.info() if self.retriever else None,
            memory=self.memory, cache=self.cache_stats, batch_sizes=self.metrics.batch_histogram,
            web=self.web.stats))

    def memory(self) -> dict[str, float]:
        return self.retriever.memory() if self.retriever is not None else process_memory()

    def cache_stats(self) -> dict[str, Any] | None:
        if self.service is None:
            return None
        c = self.service.cache
        return {"size": len(c), "capacity": c.capacity, "hits": c.hits, "misses": c.misses, "hit_rate": c.hit_rate}

    def answered(self, route: str, n_queries: int, seconds: float) -> None:
        """A request answered 200 with ``n_queries`` queries: the JSON counters and Prometheus'."""
        self.metrics.request(route, n_queries, seconds)
        self.prom.queries.labels(route).inc(n_queries)

    def refused(self, route: str, reason: str) -> None:
        """A request without the token: counted by reason (never with the header's content)."""
        self.prom.auth_failures.labels(reason).inc()
        self.metrics.auth_failure(reason)
        self.metrics.error(route, 401)
        log.debug("401 on %s: %s token", route, reason)

    def close(self) -> None:
        if self.service:
            self.service.close()
        self.web.close()


def _error(status: int, message: str):
    return jsonify({"error": message}), status


def create_app(config: ServerConfig, *, retriever: Retriever | None = None,
               web: SerperClient | None = None) -> Flask:
    """Build the app; loads the index from ``config.index`` unless a ``retriever`` is passed in
    (tests and benchmarks share one loaded model across apps that way)."""
    config.validate()
    if retriever is None and config.index:
        retriever = Retriever(config.index, model=config.model, device=config.device, mmap=config.mmap,
                              fp16=config.fp16, max_length=config.max_length, nprobe=config.nprobe)
        retriever.warmup(config.max_batch if config.batching else 1)
    web = web or SerperClient.from_env(cache_path=config.web_cache, retries=config.web_retries,
                                       backoff_s=config.web_backoff_s, budget=config.budget())
    state = ServerState(config, retriever, web)
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = config.http.max_body_bytes  # waitress checks first; for other servers
    app.json.sort_keys = False
    app.extensions[EXTENSION] = state
    limits = config.limits()

    def body_or_400() -> Any:
        return decode_body(request.get_data(cache=False))

    def route() -> str:
        """The matched route, never the raw path: metrics labels stay a bounded set."""
        return request.url_rule.rule if request.url_rule is not None else "<unmatched>"

    @app.before_request
    def _start_clock() -> None:
        g.t0 = time.perf_counter()

    auth.install(app, state.auth, lambda reason: state.refused(route(), reason))
    if state.auth is not None:
        log.info("every route but /health requires the bearer token (%s, fingerprint %s)",
                 config.auth_source, auth.fingerprint(config.auth_token))

    @app.after_request
    def _count(resp: Response) -> Response:
        state.prom.answered(route(), resp.status_code, time.perf_counter() - g.get("t0", time.perf_counter()))
        return resp

    @app.errorhandler(BadRequest)
    def _bad(e: BadRequest):
        state.metrics.error(route(), 400)
        return _error(400, str(e))

    @app.errorhandler(ShuttingDown)
    def _stopping(e: ShuttingDown):
        state.metrics.error(route(), 503)
        return _error(503, f"{e}; retry against another replica or later")

    @app.errorhandler(HTTPException)
    def _http(e: HTTPException):
        state.metrics.error(route(), e.code or 500)
        return _error(e.code or 500, e.description or e.name)

    @app.errorhandler(Exception)
    def _crash(e: Exception):
        log.exception("unhandled error on %s", route())
        state.metrics.error(route(), 500)
        return _error(500, f"internal error: {type(e).__name__}")

    @app.post("/retrieve")
    def retrieve():
        t0 = time.perf_counter()
        req = parse_request(body_or_400(), limits)
        if state.service is None:
            return _error(503, "no dense index loaded (start with --index DIR); use /search for web search")
        try:
            hits = state.service.retrieve(req.queries, req.topk)
        except FutureTimeout:
            return _error(503, f"retrieval took longer than {config.request_timeout_s}s; retry later")
        docs = [state.retriever.documents(h) for h in hits]
        scores = [[x.score for x in h] for h in hits]
        state.answered("/retrieve", len(req.queries), time.perf_counter() - t0)
        return jsonify(format_result(docs, scores, req.return_scores))

    @app.post("/search")
    def search():
        t0 = time.perf_counter()
        req = parse_request(body_or_400(), limits)
        try:
            hits = state.web.search_many(req.queries, req.topk)
        except WebSearchUnavailable as e:
            state.metrics.error("/search", 503)
            return _error(503, str(e))
        except BudgetExceeded as e:
            state.metrics.error("/search", 429)
            resp, code = _error(429, str(e))
            resp.headers["Retry-After"] = str(e.retry_after_s)
            return resp, code
        except WebSearchFailed as e:
            state.metrics.error("/search", 502)
            return _error(502, str(e))
        state.answered("/search", len(req.queries), time.perf_counter() - t0)
        docs = [[h["document"] for h in hs] for hs in hits]
        return jsonify(format_result(docs, [[h["score"] for h in hs] for hs in hits], req.return_scores))

    @app.get("/health")
    def health():
        info: dict[str, Any] = {"status": "ok", "web_search": state.web.enabled,
                                "batching": config.batching}
        if state.retriever is not None:
            info.update(state.retriever.info())
            info["memory"] = state.retriever.memory()
        return jsonify(info)

    @app.get("/metrics")
    def metrics():
        return Response(state.prom.exposition(), mimetype=None, content_type=CONTENT_TYPE)

    @app.get("/metrics.json")
    def metrics_json():
        snap = state.metrics.snapshot()
        if state.retriever is not None:
            snap["memory"] = state.retriever.memory()
            snap["calibration"] = state.retriever.calibration()
        cache = state.cache_stats()
        if cache is not None:
            snap["cache"] = cache
        snap["web_search"] = state.web.stats()
        return jsonify(snap)

    return app
