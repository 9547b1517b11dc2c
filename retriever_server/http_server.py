"""The HTTP layer: waitress configured for a cluster's many agents, JSON 4xx errors, a clean stop.

Why waitress: one I/O thread (poll) reads each request, headers and body, into a buffer and only
a complete request reaches a worker thread, so idle, slow and half-open clients cost a socket and
a few KB, never a worker (``tests/test_retriever_http.py`` holds hundreds of them open and still
gets answers). What is configured here, and why:

* ``--idle-timeout-s``: a connection with nothing in flight closes after this long idle (checked
  every second), and a request that has not fully arrived this long after its first byte is
  answered 408 and closed (a client trickling bytes would otherwise never count as idle).
* ``--connection-limit``: waitress stops accepting beyond it (the kernel backlog then queues);
  sized for hundreds of agent processes, served with ``poll`` (``select`` stops at fd 1024), and
  the open-file limit is raised to fit.
* ``--max-body-bytes`` and a 64 KiB header limit: checked by waitress's parser before the app.
* waitress's own parser errors (malformed request, headers or body too large, an unsupported
  ``Transfer-Encoding``) answer 4xx ``{"error": ...}`` instead of 400/413/431/501 plain text: a
  5xx invites retries that can never succeed for a malformed request.
* ``Expect: 100-continue`` with no body: waitress 3.0.2 sends ``100 Continue`` and then waits for
  a body that will never come; here such a request is answered at once.
* Stop (``serve`` returns once ``stop`` is set): the listening socket closes, idle connections
  close, in-flight requests get up to ``drain_s`` to finish; then everything closes.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import resource
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from waitress import wasyncore
from waitress.channel import HTTPChannel
from waitress.server import create_server
from waitress.task import ErrorTask
from waitress.utilities import BadRequest as WaitressBadRequest
from waitress.utilities import RequestEntityTooLarge, RequestHeaderFieldsTooLarge, ServerNotImplemented

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 64 << 10
LOOP_TICK_S = 0.2  # how often the I/O loop looks at the stop flag
FD_HEADROOM = 64  # open files the process needs besides client sockets (index, docstore, pipes)


@dataclass(frozen=True)
class HttpSettings:
    threads: int = 64
    max_body_bytes: int = 8 << 20
    idle_timeout_s: float = 30.0  # longer than clients' keep-alive (aiohttp: 15 s) to avoid races
    connection_limit: int = 4096
    drain_s: float = 8.0  # finishes inside `docker stop`'s default 10 s grace period

    def validate(self) -> None:
        for name in ("threads", "max_body_bytes", "connection_limit"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        for name in ("idle_timeout_s", "drain_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"--{name.replace('_', '-')} must be > 0, got {getattr(self, name)}")


def add_http_args(p: argparse.ArgumentParser) -> None:
    d = HttpSettings()
    p.add_argument("--threads", type=int, default=d.threads,
                   help="worker threads; they run complete requests only (default %(default)s)")
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes,
                   help="larger bodies answer 413 (default %(default)s)")
    p.add_argument("--idle-timeout-s", type=float, default=d.idle_timeout_s,
                   help="close idle connections, and answer 408 to requests still arriving, after this "
                        "long (default %(default)s)")
    p.add_argument("--connection-limit", type=int, default=d.connection_limit,
                   help="open connections beyond which new ones wait in the kernel's backlog "
                        "(default %(default)s)")
    p.add_argument("--drain-s", type=float, default=d.drain_s,
                   help="on SIGTERM/SIGINT, how long in-flight requests may take to finish (default %(default)s)")


def settings_from_args(a: argparse.Namespace) -> HttpSettings:
    return HttpSettings(a.threads, a.max_body_bytes, a.idle_timeout_s, a.connection_limit, a.drain_s)


class RequestTimeout(WaitressBadRequest):
    code = 408
    reason = "Request Timeout"


def _error_message(e: Any, max_body: int) -> tuple[int, str]:
    """waitress's parser error → (4xx status, message for the client)."""
    if isinstance(e, ServerNotImplemented):  # only raised for a Transfer-Encoding other than chunked
        return 400, "unsupported Transfer-Encoding: send the body with Content-Length or chunked"
    if isinstance(e, RequestEntityTooLarge):
        return 413, f"request body is larger than the server's limit of {max_body} bytes (--max-body-bytes)"
    if isinstance(e, RequestHeaderFieldsTooLarge):
        return 431, f"request headers are larger than {MAX_HEADER_BYTES} bytes"
    if isinstance(e, WaitressBadRequest):
        return e.code, f"{e.reason.lower()}: {e.body}"
    return 500, "internal error"


class _JsonErrorTask(ErrorTask):
    def execute(self) -> None:
        code, message = _error_message(self.request.error, self.channel.adj.max_request_body_size)
        body = json.dumps({"error": message}).encode()
        self.status = f"{code} {HTTPStatus(code).phrase}"
        self.response_headers.append(("Content-Type", "application/json"))
        self.set_close_on_finish()
        self.content_length = len(body)
        self.write(body)


class _Channel(HTTPChannel):
    error_task_class = _JsonErrorTask
    request_started = 0.0

    def received(self, data: bytes) -> bool:
        now = time.monotonic()
        if self.request is None:
            self.request_started = now
        elif now - self.request_started > self.adj.channel_timeout and not self.request.completed:
            return self._time_out()
        return super().received(data)

    def _time_out(self) -> bool:
        with self.requests_lock:
            request, self.request = self.request, None
            request.error = RequestTimeout(f"the request did not arrive within {self.adj.channel_timeout}s")
            request.completed = True
            self.requests.append(request)
            if len(self.requests) == 1:
                self.server.add_task(self)
        return True

    def send_continue(self) -> None:
        if self.request.completed:  # no body announced: nothing to wait for, answer the request
            self.request.expect_continue = False
            return
        super().send_continue()

    @property
    def busy(self) -> bool:
        """A request is running, queued, partly received, or its answer is still being sent."""
        return bool(self.requests or self.total_outbufs_len or self.request is not None)


def _raise_open_file_limit(connection_limit: int) -> int:
    """Raise the soft open-file limit to fit the connections; returns the limit that fits."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = connection_limit + FD_HEADROOM
    if hard != resource.RLIM_INFINITY:
        want = min(want, hard)
    if want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    fits = max(1, want - FD_HEADROOM)
    if fits < connection_limit:
        log.warning("--connection-limit %d lowered to %d: the open-file limit is %d",
                    connection_limit, fits, want)
    return min(connection_limit, fits)


class HttpServer:
    """A bound waitress server; ``serve(stop)`` runs it until ``stop`` is set, then drains it."""

    def __init__(self, app: Any, host: str, port: int, settings: HttpSettings = HttpSettings()) -> None:
        settings.validate()
        self.settings = settings
        self._map: dict[int, Any] = {}
        self._server = create_server(
            app, map=self._map, host=host, port=port, threads=settings.threads,
            connection_limit=_raise_open_file_limit(settings.connection_limit), asyncore_use_poll=True,
            channel_timeout=math.ceil(settings.idle_timeout_s), cleanup_interval=1,
            max_request_body_size=settings.max_body_bytes, max_request_header_size=MAX_HEADER_BYTES,
            ident="retriever_server")
        self._server.channel_class = _Channel
        self.host, self.port = host, int(self._server.effective_port)

    def _tick(self) -> None:
        wasyncore.loop(timeout=LOOP_TICK_S, map=self._map, use_poll=True, count=1)

    def _channels(self) -> list[_Channel]:
        return list(self._server.active_channels.values())

    def serve(self, stop: threading.Event) -> None:
        """Serve until ``stop`` is set; then stop accepting and let in-flight requests finish."""
        while not stop.is_set():
            self._tick()
        wasyncore.dispatcher.close(self._server)  # the listening socket only (the trigger stays)
        deadline = time.monotonic() + self.settings.drain_s
        while True:
            busy = 0
            for ch in self._channels():
                if ch.busy:
                    busy += 1
                else:
                    ch.will_close = True  # idle keep-alive: closed on the next tick
            if not busy:
                return
            if time.monotonic() >= deadline:
                log.warning("%d connection(s) still busy after --drain-s %gs: closing them",
                            busy, self.settings.drain_s)
                return
            self._tick()

    def close(self, flush_s: float = 1.0) -> None:
        """Send what is already written (e.g. errors for requests failed at shutdown), then close all."""
        deadline = time.monotonic() + flush_s
        while time.monotonic() < deadline and any(ch.requests or ch.total_outbufs_len
                                                  for ch in self._channels()):
            self._tick()
        self._server.task_dispatcher.shutdown(cancel_pending=True, timeout=flush_s)
        wasyncore.close_all(self._map, ignore_all=True)
