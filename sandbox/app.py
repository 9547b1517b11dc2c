"""Flask app factory: `/run_code`, `/health`, `/metrics` over any Backend."""

from __future__ import annotations

import logging
import time
from typing import Any

from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import HTTPException

from .admission import Admission, QueueFull
from .api import DEFAULT_MAX_OUTPUT_BYTES, RequestError, parse_run_request, to_response
from .backends.base import Backend, Guarantees
from .metrics import Metrics

log = logging.getLogger(__name__)
RETRY_AFTER_S = 1


def create_app(backend: Backend, guarantees: Guarantees, max_concurrency: int = 4, max_queue: int = 64,
               max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES) -> Flask:
    """Build the service around an already-probed backend (the caller owns its lifetime)."""
    app = Flask("sandbox")
    admission = Admission(max_concurrency, max_queue)
    metrics = Metrics()
    started = time.time()
    app.extensions["sandbox"] = {"backend": backend, "admission": admission, "metrics": metrics}

    def reply(body: dict[str, Any], code: int, headers: dict[str, str] | None = None) -> Response:
        metrics.observe_request(code)
        resp = jsonify(body)
        resp.status_code = code
        for k, v in (headers or {}).items():
            resp.headers[k] = v
        return resp

    @app.post("/run_code")
    def run_code() -> Response:
        payload = request.get_json(silent=True)
        if payload is None:
            return reply({"status": "Failed", "message": "body must be JSON (Content-Type: application/json)"},
                         400)
        try:
            run_request = parse_run_request(payload)
        except RequestError as err:
            return reply({"status": "Failed", "message": str(err)}, 400)
        try:
            with admission.slot():
                result = backend.run(run_request, max_output_bytes)
        except QueueFull as err:
            return reply({"status": "SandboxError", "message": f"sandbox busy: {err}; retry later"}, 429,
                         {"Retry-After": str(RETRY_AFTER_S)})
        except Exception as err:  # a backend fault is reported, never a bare 500 page
            log.exception("backend failure")
            return reply({"status": "SandboxError", "message": f"{type(err).__name__}: {err}",
                          "compile_result": None, "run_result": None, "files": {}}, 500)
        metrics.observe_run(result.status if result.sandbox_error is None else "SandboxError",
                            result.execution_time)
        return reply(to_response(result), 200)

    @app.get("/health")
    def health() -> Response:
        body = {"status": "ok" if not guarantees.missing else "degraded", "backend": backend.name,
                "guarantees": guarantees.as_dict(), "max_concurrency": admission.max_concurrency,
                "max_queue": admission.max_queue, "uptime_s": round(time.time() - started, 1)}
        return reply(body, 200)

    @app.get("/metrics")
    def metrics_view() -> Response:
        gauges = {"running": admission.running, "queued": admission.waiting,
                  "rejected_total": admission.rejected, **backend.stats()}
        return Response(metrics.render(gauges), mimetype="text/plain; version=0.0.4")

    @app.errorhandler(HTTPException)
    def http_error(err: HTTPException) -> Response:
        return reply({"status": "Failed", "message": f"{err.code} {err.name}: {err.description}"},
                     err.code or 500)

    return app
