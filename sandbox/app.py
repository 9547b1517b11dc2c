"""Flask app factory: `/run_code`, `/health`, `/metrics` over any Backend.

Every answer is JSON (Prometheus text for /metrics): a run's outcome is a 200 with SandboxFusion's
body, whatever it was; a client mistake is a 4xx `{"error": ...}` naming the field; a request
without the token (when one is set) a 401; a full queue is a 429 and a draining service a 503,
both with Retry-After.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

from . import auth
from .admission import Admission, Closed, QueueFull
from .api import (
    DEFAULT_MAX_OUTPUT_BYTES,
    ExecResult,
    Outcome,
    RequestError,
    RequestLimits,
    parse_run_request,
    to_response,
)
from .backends.base import Backend, Guarantees
from .metrics import CONTENT_TYPE, Metrics

log = logging.getLogger(__name__)
RETRY_AFTER_S = 1


def create_app(backend: Backend, guarantees: Guarantees, admission: Admission,
               max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES, limits: RequestLimits = RequestLimits(),
               token: bytes | None = None) -> Flask:
    """Build the service around an already-probed backend (the caller owns its lifetime and the
    admission, which it closes to drain). With `token`, every route but /health requires it."""
    app = Flask("sandbox")

    def gauges() -> dict[str, float]:
        return {"running": admission.running, "queued": admission.waiting, "rejected_total": admission.rejected,
                "draining": float(admission.closed), "max_concurrency": admission.max_concurrency,
                "max_queue": admission.max_queue, **backend.stats()}

    metrics = Metrics(gauges, outcomes=[o.value for o in Outcome], auth_reasons=auth.REFUSALS)
    started = time.time()
    app.extensions["sandbox"] = {"backend": backend, "admission": admission, "metrics": metrics}

    def reply(body: dict[str, Any], code: int, headers: dict[str, str] | None = None) -> Response:
        metrics.observe_request(code)
        return Response(json.dumps(body), status=code, mimetype="application/json", headers=headers)

    def error(message: str, code: int, retry: bool = False) -> Response:
        return reply({"error": message}, code, {"Retry-After": str(RETRY_AFTER_S)} if retry else None)

    def refused(reason: str) -> Response:
        metrics.auth_failure(reason)
        return reply({"error": auth.REFUSALS[reason]}, 401, {"WWW-Authenticate": 'Bearer realm="sandbox"'})

    auth.guard(app, token, refused)

    @app.post("/run_code")
    def run_code() -> Response:
        try:
            payload = json.loads(request.get_data(cache=False))
        except RecursionError:
            return error("the body is JSON nested too deeply", 400)
        except ValueError as err:  # JSONDecodeError, UnicodeDecodeError, an over-long integer
            return error(f"the body is not valid JSON: {err}", 400)
        try:
            run_request = parse_run_request(payload, limits)
        except RequestError as err:
            return error(str(err), 400)
        try:
            with admission.slot():
                result = backend.run(run_request, max_output_bytes)
        except QueueFull as err:
            return error(f"sandbox busy: {err}; retry later", 429, retry=True)
        except Closed as err:
            return error(f"{err}; retry on another replica", 503, retry=True)
        except Exception as err:  # a backend fault is the sandbox's error, answered as SandboxFusion does
            log.exception("backend failure")
            result = ExecResult(Outcome.SANDBOX_ERROR, None, "", "", 0.0, sandbox_error=f"{type(err).__name__}: {err}")
        metrics.observe_run(result.outcome.value, result.execution_time)
        return reply(to_response(result), 200)

    @app.get("/health")
    def health() -> Response:
        body = {"status": "ok" if not guarantees.missing else "degraded", "backend": backend.name,
                "guarantees": guarantees.as_dict(), "max_concurrency": admission.max_concurrency,
                "max_queue": admission.max_queue, "draining": admission.closed,
                "uptime_s": round(time.time() - started, 1)}
        return reply(body, 503 if admission.closed else 200)

    @app.get("/metrics")
    def metrics_view() -> Response:
        metrics.observe_request(200)
        return Response(metrics.render(), content_type=CONTENT_TYPE)

    @app.errorhandler(HTTPException)
    def http_error(err: HTTPException) -> Response:
        return error(f"{err.code} {err.name}: {err.description}", err.code or 500)

    @app.errorhandler(Exception)
    def unexpected(err: Exception) -> Response:
        log.exception("unhandled error")
        return error(f"internal error ({type(err).__name__})", 500)

    return app
