"""`python -m sandbox.serve`: probe the backend, refuse weak isolation, serve over HTTP.

Prints `SANDBOX_LISTENING http://HOST:PORT` once bound (so `--port 0` callers learn the port).
On SIGTERM or SIGINT it drains: it stops accepting, answers queued and later requests 503, and
lets the runs in progress finish until `--drain-timeout-s` (6 s by default, so the whole shutdown
fits the 10 s Docker and many orchestrators allow before SIGKILL); the runs still going then are
ended and answered as a SandboxError saying so. Then it removes every sandbox and cgroup it
created and exits 0. A second signal stops at once.
Exit status 3: the host lacks what the backend needs (bubblewrap, cgroups, a Docker engine or
image, a guarantee failed its probe); 2: a bad flag, or a `--host` other machines can reach
without a token (`--auth-token-file FILE` or `$SGRPO_TOOLS_TOKEN`) and without `--no-auth`;
anything else non-zero is a fault of this service.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from dataclasses import dataclass, field

from . import auth
from .admission import Admission
from .api import (
    DEFAULT_MAX_MEMORY_MB,
    DEFAULT_MAX_OUTPUT_BYTES,
    DEFAULT_MAX_RUN_TIMEOUT_S,
    MIN_MEMORY_MB,
    RequestLimits,
)
from .app import create_app
from .backends import make_backend
from .backends.base import Backend, EnvironmentMissing, Guarantees, IsolationError
from .http_server import HttpLimits, HttpServer, add_http_flags, http_limits

LISTENING_PREFIX = "SANDBOX_LISTENING "
EXIT_ENVIRONMENT = 3
SPARE_THREADS = 4  # beyond running + queued requests: /health, /metrics and quick 429s stay answered
DRAIN_SLACK_S = 15.0  # beyond the longest run: how long a caller waits for the service to exit
DEFAULT_DRAIN_TIMEOUT_S = 6.0  # runs in progress at SIGTERM get this long to finish
ABORT_FLUSH_S = 2.0  # after ending the runs left, for their answers to be written
log = logging.getLogger("sandbox.serve")


@dataclass
class ServeConfig:
    backend: str = "local"
    host: str = "127.0.0.1"
    port: int = 8080
    max_concurrency: int = 4
    max_queue: int = 64
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    allow_weaker_isolation: bool = False
    docker_image: str = "sgrpo-sandbox:latest"
    mode: str = "resident"
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    limits: RequestLimits = field(default_factory=RequestLimits)
    http: HttpLimits = field(default_factory=HttpLimits)
    token: bytes | None = field(default=None, repr=False)  # every route but /health requires it
    no_auth: bool = False  # a reachable --host without a token, on purpose (a trusted network)


def parse_args(argv: list[str] | None = None) -> ServeConfig:
    p = argparse.ArgumentParser(prog="python -m sandbox.serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=("local", "docker"), default="local")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080, help="0 picks a free port (printed on stdout)")
    p.add_argument("--max-concurrency", type=int, default=4, help="executions running at once")
    p.add_argument("--max-queue", type=int, default=64, help="requests allowed to wait; more get 429")
    p.add_argument("--max-output-bytes", type=int, default=DEFAULT_MAX_OUTPUT_BYTES,
                   help="per stream; the rest is cut with a marker")
    p.add_argument("--max-run-timeout-s", type=float, default=DEFAULT_MAX_RUN_TIMEOUT_S,
                   help="longer run_timeout requests are cut to this (default 60)")
    p.add_argument("--max-memory-mb", type=int, default=DEFAULT_MAX_MEMORY_MB,
                   help="larger memory_limit_MB requests are cut to this (default 8192)")
    p.add_argument("--allow-weaker-isolation", action="store_true",
                   help="serve even if a guarantee failed its start-up probe (/health lists it)")
    p.add_argument("--docker-image", default="sgrpo-sandbox:latest")
    p.add_argument("--mode", "--docker-mode", dest="mode", choices=("resident", "cold"), default="resident",
                   help="resident: warm sandboxes (bwrap or containers) whose pid-1 runner spawns each run; "
                        "cold: a fresh sandbox per run (the benchmark baseline)")
    p.add_argument("--drain-timeout-s", type=float, default=DEFAULT_DRAIN_TIMEOUT_S,
                   help="on SIGTERM, runs in progress get this long to finish; the rest are ended and "
                        "answered as a SandboxError (default 6, to fit a 10 s grace before SIGKILL)")
    p.add_argument("--auth-token-file",
                   help=f"file holding the shared token (default: ${auth.TOKEN_ENV}); every route but /health "
                        "then requires 'Authorization: Bearer <token>'")
    p.add_argument("--no-auth", action="store_true",
                   help="serve a non-loopback --host without a token (a network you trust; SandboxFusion's "
                        "client sends none)")
    add_http_flags(p)
    a = p.parse_args(argv)
    if a.no_auth and a.auth_token_file:
        p.error("--no-auth and --auth-token-file contradict each other: give one")
    try:
        token = None if a.no_auth else auth.read_token(a.auth_token_file)
        auth.refuse_open_bind(a.host, token, a.no_auth)
    except auth.AuthError as err:
        p.error(str(err))
    if a.no_auth and os.environ.get(auth.TOKEN_ENV):
        log.warning("--no-auth: ignoring $%s; the sandbox answers without a token", auth.TOKEN_ENV)
    if a.max_concurrency < 1:
        p.error(f"--max-concurrency must be >= 1, got {a.max_concurrency}")
    if a.max_queue < 0:
        p.error(f"--max-queue must be >= 0, got {a.max_queue}")
    if not 0 <= a.port <= 65535:
        p.error(f"--port must be in [0, 65535], got {a.port}")
    if a.max_output_bytes < 1:
        p.error(f"--max-output-bytes must be >= 1, got {a.max_output_bytes}")
    if not a.max_run_timeout_s > 0:
        p.error(f"--max-run-timeout-s must be > 0, got {a.max_run_timeout_s}")
    if a.max_memory_mb < MIN_MEMORY_MB:
        p.error(f"--max-memory-mb must be >= {MIN_MEMORY_MB}, got {a.max_memory_mb}")
    if not a.drain_timeout_s >= 0:
        p.error(f"--drain-timeout-s must be >= 0, got {a.drain_timeout_s}")
    limits = RequestLimits(max_run_timeout_s=a.max_run_timeout_s, max_memory_mb=a.max_memory_mb,
                           default_memory_mb=min(RequestLimits().default_memory_mb, a.max_memory_mb))
    return ServeConfig(a.backend, a.host, a.port, a.max_concurrency, a.max_queue, a.max_output_bytes,
                       a.allow_weaker_isolation, a.docker_image, a.mode, a.drain_timeout_s, limits,
                       http_limits(p, a), token, a.no_auth)


def start_backend(cfg: ServeConfig) -> tuple[Backend, Guarantees]:
    """Create and probe the backend; raise IsolationError (after cleanup) if it is too weak."""
    backend = make_backend(cfg.backend, pool_size=cfg.max_concurrency, image=cfg.docker_image, mode=cfg.mode)
    try:
        guarantees = backend.probe()
        guarantees.enforce(cfg.allow_weaker_isolation)
    except BaseException:
        backend.close()
        raise
    if guarantees.missing:
        log.warning("serving with weaker isolation; missing: %s", guarantees.reasons)
    return backend, guarantees


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = parse_args(argv)
    try:
        backend, guarantees = start_backend(cfg)
    except (EnvironmentMissing, IsolationError) as err:
        print(f"sandbox: refusing to start: {err}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    try:
        admission = Admission(cfg.max_concurrency, cfg.max_queue)
        app = create_app(backend, guarantees, admission, cfg.max_output_bytes, cfg.limits, cfg.token)
        server = HttpServer(app, cfg.host, cfg.port, cfg.max_concurrency + cfg.max_queue + SPARE_THREADS,
                            cfg.http, ident="sgrpo-sandbox")
    except BaseException:
        backend.close()
        raise

    def on_signal(signum: int, _frame: object) -> None:
        if server.stopping:
            raise SystemExit(128 + signum)  # a second signal: stop now
        log.info("signal %d: draining (no new requests; runs in progress get %.1f s)", signum, cfg.drain_timeout_s)
        server.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"{LISTENING_PREFIX}http://{cfg.host}:{server.port}", flush=True)
    log.info("backend=%s guarantees=%s", backend.name, guarantees.as_dict())
    if cfg.token is not None:
        log.info("every route but /health requires the bearer token (fingerprint %s)",
                 auth.token_fingerprint(cfg.token))
    stopped = (f"the sandbox service is shutting down: the run was ended {cfg.drain_timeout_s:g} s after "
               "the stop signal (--drain-timeout-s); retry it on another replica")
    try:
        drained = server.serve_until_drained(admission.close, cfg.drain_timeout_s,
                                             lambda: backend.abort_runs(stopped), ABORT_FLUSH_S)
        log.info("drained" if drained else "drain timed out; some answers were not written")
    except SystemExit:
        log.warning("stopped before the drain finished")
    finally:
        server.close()
        backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
