"""The HTTP server layer: waitress, configured on purpose for many agents and hostile clients.

Why waitress (kept after checking it against this traffic): one I/O thread polls every socket and
buffers each request whole (headers, then the body in memory or, past 512 KB, in a temp file)
before a worker thread sees it. A slow or idle client therefore costs a socket, never a worker
thread, and the worker pool stays sized to the sandbox's own concurrency. What this module adds:

- `poll()` instead of `select()` (no 1024-descriptor ceiling) and a connection limit sized for a
  cluster's agents, with RLIMIT_NOFILE raised to fit it;
- one idle timeout for both idle keep-alive connections and slowly trickled requests (waitress
  only counts silence, so a client sending a byte a second would hold its socket forever);
- a body and a header limit, and JSON 4xx `{"error": ...}` for waitress's own parser errors
  (it answers text, and 501 for an unknown Transfer-Encoding; a 5xx invites SandboxFusion's
  client to retry a request that can never succeed);
- no `100 Continue` for a request without a body (waitress 3.0 sends one, then waits for a body
  that never comes);
- a drain: stop accepting, answer every request already received, and past a deadline have the
  runs still going ended so that they are answered too, then return.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from waitress import wasyncore
from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.parser import HTTPRequestParser
from waitress.server import TcpWSGIServer
from waitress.task import ErrorTask, ThreadedTaskDispatcher

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 16 << 20
DEFAULT_IDLE_TIMEOUT_S = 30.0
DEFAULT_CONNECTION_LIMIT = 2048
MAX_HEADER_BYTES = 64 << 10
FD_RESERVE = 512  # descriptors kept free beyond the connections: sandbox pipes, cgroup files, logs


@dataclass(frozen=True)
class HttpLimits:
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    connection_limit: int = DEFAULT_CONNECTION_LIMIT


def add_http_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                   help="larger request bodies get 413 (default 16 MiB)")
    p.add_argument("--idle-timeout-s", type=float, default=DEFAULT_IDLE_TIMEOUT_S,
                   help="close a connection idle this long, or whose request has not fully arrived "
                        "this long after its first byte (default 30)")
    p.add_argument("--connection-limit", type=int, default=DEFAULT_CONNECTION_LIMIT,
                   help="open connections at most; more wait in the listen backlog (default 2048)")


def http_limits(p: argparse.ArgumentParser, a: argparse.Namespace) -> HttpLimits:
    if a.max_body_bytes < 1:
        p.error(f"--max-body-bytes must be >= 1, got {a.max_body_bytes}")
    if not a.idle_timeout_s > 0:
        p.error(f"--idle-timeout-s must be > 0, got {a.idle_timeout_s}")
    if a.connection_limit < 1:
        p.error(f"--connection-limit must be >= 1, got {a.connection_limit}")
    return HttpLimits(a.max_body_bytes, a.idle_timeout_s, a.connection_limit)


class _Parser(HTTPRequestParser):
    def parse_header(self, header_plus: bytes) -> None:
        super().parse_header(header_plus)
        if self.expect_continue and not self.chunked and self.content_length == 0:
            self.expect_continue = False  # nothing to continue with: answer at once


class _JsonErrorTask(ErrorTask):
    """waitress's own errors as JSON; an unsupported Transfer-Encoding is the client's (400)."""

    def execute(self) -> None:
        err = self.request.error
        code, reason, message = err.code, err.reason, f"{err.reason}: {err.body}"
        if code == 501:
            code, reason = 400, "Bad Request"
            message = "unsupported Transfer-Encoding: send the body with Content-Length or chunked"
        elif code == 413:
            message = f"the body exceeds {self.channel.server.adj.max_request_body_size - 1} bytes"
        body = json.dumps({"error": message}).encode()
        self.status = f"{code} {reason}"
        self.response_headers.append(("Content-Type", "application/json"))
        self.set_close_on_finish()
        self.content_length = len(body)
        self.write(body)


class _Channel(HTTPChannel):
    parser_class = _Parser
    error_task_class = _JsonErrorTask
    request_started = 0.0  # when the first byte of the request now arriving came in

    def received(self, data: bytes) -> bool:
        if self.request is None and data:
            self.request_started = time.time()
        return super().received(data)


class _Server(TcpWSGIServer):
    channel_class = _Channel

    def maintenance(self, now: float) -> None:
        super().maintenance(now)  # idle connections (no request in service) past the timeout
        cutoff = now - self.adj.channel_timeout
        for channel in list(self.active_channels.values()):
            if channel.request is not None and channel.request_started < cutoff:
                channel.will_close = True  # a request still arriving after the whole timeout


def _ensure_descriptors(needed: int) -> int:
    """Raise the soft RLIMIT_NOFILE towards `needed`; return what is available."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


class HttpServer:
    """A bound, listening server for a WSGI app; `serve_until_drained()` runs it in this thread."""

    def __init__(self, app: Callable, host: str, port: int, threads: int, limits: HttpLimits,
                 ident: str = "sgrpo") -> None:
        connections = limits.connection_limit
        available = _ensure_descriptors(connections + FD_RESERVE)
        if available < connections + FD_RESERVE:
            connections = max(1, available - FD_RESERVE)
            log.warning("RLIMIT_NOFILE allows %d descriptors: connection limit lowered from %d to %d",
                        available, limits.connection_limit, connections)
        adj = Adjustments(host=host, port=port, threads=threads, connection_limit=connections,
                          channel_timeout=limits.idle_timeout_s, cleanup_interval=1,
                          max_request_body_size=limits.max_body_bytes + 1,  # waitress refuses at >=
                          max_request_header_size=MAX_HEADER_BYTES, asyncore_use_poll=True, ident=ident)
        self.limits = limits
        self.map: dict = {}
        dispatcher = ThreadedTaskDispatcher()
        dispatcher.set_thread_count(threads)
        self.server = _Server(app, map=self.map, dispatcher=dispatcher, adj=adj)
        self.port = int(self.server.effective_port)
        self._stop = threading.Event()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def request_stop(self) -> None:
        """Begin the drain (safe from a signal handler): the serving loop wakes at once."""
        self._stop.set()
        self.server.pull_trigger()

    def _channels(self) -> list[HTTPChannel]:
        return [d for d in list(self.map.values()) if isinstance(d, HTTPChannel)]

    def _busy(self) -> bool:
        """A received request is still being served, or its answer is not sent yet."""
        return any(ch.requests or ch.total_outbufs_len for ch in self._channels())

    def serve_until_drained(self, on_stop: Callable[[], None], drain_timeout_s: float,
                            on_deadline: Callable[[], None] = lambda: None, flush_s: float = 2.0) -> bool:
        """Serve until request_stop(); then stop accepting, call `on_stop`, and keep serving the
        requests already received until each is answered (True). If some are still being served
        after `drain_timeout_s`, call `on_deadline` (which must make them answer at once) and keep
        writing answers for up to `flush_s` more; False if even then some were not answered."""
        while not self._stop.is_set():
            wasyncore.loop(timeout=1.0, map=self.map, use_poll=True, count=1)
        wasyncore.dispatcher.close(self.server)  # the listening socket only: the trigger stays
        on_stop()
        if self._serve_owed(time.monotonic() + drain_timeout_s):
            return True
        on_deadline()
        return self._serve_owed(time.monotonic() + flush_s)

    def _serve_owed(self, deadline: float) -> bool:
        """Answer what is owed until nothing is (True) or `deadline` passes (False)."""
        while True:
            for channel in self._channels():
                if not channel.requests and not channel.total_outbufs_len:
                    channel.will_close = True  # idle, or a request never finished: nothing owed
            if not self._busy():
                return True
            if time.monotonic() >= deadline:
                return False
            wasyncore.loop(timeout=0.05, map=self.map, use_poll=True, count=1)

    def close(self) -> None:
        self.server.task_dispatcher.shutdown(timeout=1)
        wasyncore.close_all(self.map)
