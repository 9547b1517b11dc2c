"""Flask app factory: ``/retrieve`` (dense), ``/search`` (web), ``/health``, ``/metrics``.

Every client mistake answers 400 ``{"error": ...}`` and the process lives on; unexpected
failures answer JSON 500 (logged), never an HTML page.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from flask import Flask, jsonify, request
from werkzeug.exceptions import HTTPException

from .batching import ShuttingDown
from .config import ServerConfig
from .metrics import Metrics
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
                                       backoff_s=config.web_backoff_s)
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
        state.metrics.request("/retrieve", len(req.queries), time.perf_counter() - t0)
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
        except WebSearchFailed as e:
            state.metrics.error("/search", 502)
            return _error(502, str(e))
        state.metrics.request("/search", len(req.queries), time.perf_counter() - t0)
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
        snap = state.metrics.snapshot()
        if state.retriever is not None:
            snap["memory"] = state.retriever.memory()
            snap["calibration"] = state.retriever.calibration()
        if state.service is not None:
            c = state.service.cache
            snap["cache"] = {"size": len(c), "capacity": c.capacity, "hits": c.hits, "misses": c.misses,
                             "hit_rate": c.hit_rate}
        return jsonify(snap)

    return app
