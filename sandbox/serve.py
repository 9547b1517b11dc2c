"""`python -m sandbox.serve`: probe the backend, refuse weak isolation, serve with waitress.

Prints `SANDBOX_LISTENING http://HOST:PORT` once bound (so `--port 0` callers learn the port)
and cleans up every cgroup/container on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from dataclasses import dataclass

from .api import DEFAULT_MAX_OUTPUT_BYTES
from .app import create_app
from .backends import make_backend
from .backends.base import Backend, Guarantees

LISTENING_PREFIX = "SANDBOX_LISTENING "
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
    docker_mode: str = "resident"
    local_launcher: str = "auto"


def parse_args(argv: list[str] | None = None) -> ServeConfig:
    p = argparse.ArgumentParser(prog="python -m sandbox.serve", description=__doc__)
    p.add_argument("--backend", choices=("local", "docker"), default="local")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080, help="0 picks a free port (printed on stdout)")
    p.add_argument("--max-concurrency", type=int, default=4, help="executions running at once")
    p.add_argument("--max-queue", type=int, default=64, help="requests allowed to wait; more get 429")
    p.add_argument("--max-output-bytes", type=int, default=DEFAULT_MAX_OUTPUT_BYTES,
                   help="per stream; the rest is cut with a marker")
    p.add_argument("--allow-weaker-isolation", action="store_true",
                   help="serve even if a guarantee failed its start-up probe (/health lists it)")
    p.add_argument("--docker-image", default="sgrpo-sandbox:latest")
    p.add_argument("--docker-mode", choices=("resident", "warm", "cold"), default="resident",
                   help="resident: pooled containers whose pid-1 runner spawns each run (fastest); "
                        "warm: pooled containers, one `docker exec` per run; "
                        "cold: one container per run (the benchmark baseline)")
    p.add_argument("--local-launcher", choices=("auto", "shell"), default="auto",
                   help="auto: the static sgrpo-launch when a C compiler can build it; shell: sh + setpriv "
                        "(the benchmark baseline)")
    a = p.parse_args(argv)
    if a.max_concurrency < 1:
        p.error(f"--max-concurrency must be >= 1, got {a.max_concurrency}")
    if a.max_queue < 0:
        p.error(f"--max-queue must be >= 0, got {a.max_queue}")
    if not 0 <= a.port <= 65535:
        p.error(f"--port must be in [0, 65535], got {a.port}")
    if a.max_output_bytes < 1:
        p.error(f"--max-output-bytes must be >= 1, got {a.max_output_bytes}")
    return ServeConfig(a.backend, a.host, a.port, a.max_concurrency, a.max_queue, a.max_output_bytes,
                       a.allow_weaker_isolation, a.docker_image, a.docker_mode, a.local_launcher)


def start_backend(cfg: ServeConfig) -> tuple[Backend, Guarantees]:
    """Create and probe the backend; raise IsolationError (after cleanup) if it is too weak."""
    backend = make_backend(cfg.backend, pool_size=cfg.max_concurrency, image=cfg.docker_image,
                           docker_mode=cfg.docker_mode, local_launcher=cfg.local_launcher)
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
    from waitress import create_server

    try:
        backend, guarantees = start_backend(cfg)
    except Exception as err:  # engine down, image missing, isolation too weak: say why, exit 2
        print(f"sandbox: refusing to start: {err}", file=sys.stderr)
        return 2
    app = create_app(backend, guarantees, cfg.max_concurrency, cfg.max_queue, cfg.max_output_bytes)
    server = create_server(app, host=cfg.host, port=cfg.port,
                           threads=cfg.max_concurrency + cfg.max_queue + 2,
                           connection_limit=max(100, 2 * (cfg.max_concurrency + cfg.max_queue)),
                           channel_timeout=120, ident="sgrpo-sandbox")

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    port = server.effective_port  # type: ignore[union-attr]
    print(f"{LISTENING_PREFIX}http://{cfg.host}:{port}", flush=True)
    log.info("backend=%s guarantees=%s", backend.name, guarantees.as_dict())
    try:
        server.run()
    except SystemExit:
        pass
    finally:
        server.close()
        backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
