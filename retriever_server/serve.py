"""Serve the retriever with waitress (see :mod:`retriever_server.http_server` for why and how).

    python -m retriever_server.serve --index DIR --host 127.0.0.1 --port 8000

``--port 0`` binds a free port; the first stdout line is always
``retriever_server listening on http://HOST:PORT`` so launchers can read the port. SIGTERM or
SIGINT: stop accepting, finish in-flight requests (up to ``--drain-s``), exit 0.

``--auth-token-file FILE`` (or ``$SGRPO_TOOLS_TOKEN``): every route but ``/health`` requires
``Authorization: Bearer <token>``. A ``--host`` other machines can reach needs a token or an
explicit ``--no-auth`` (a trusted network); without either the server refuses to start (exit 2).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from dataclasses import fields

from .auth import TOKEN_ENV, AuthConfigError, load_token
from .background import LISTEN_PREFIX, RunningServer
from .config import ServerConfig
from .corpora import CorpusError
from .http_server import add_http_args, settings_from_args
from .retriever import IndexMismatch

log = logging.getLogger(__name__)

def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, ServerConfig]:
    d = ServerConfig()
    p = argparse.ArgumentParser(prog="python -m retriever_server.serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--index", help="index folder from build_index (omit to serve only /search)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 = any free port (printed)")
    p.add_argument("--model", help="encoder override (must make vectors like the index's)")
    p.add_argument("--device", default=d.device, help="cpu | cuda | cuda:N")
    p.add_argument("--mmap", action="store_true", help="memory-map the FAISS index (flat RAM at startup)")
    p.add_argument("--fp16", action="store_true")
    p.add_argument("--nprobe", type=int, help="IVF lists searched per query (default: the index's meta.json)")
    p.add_argument("--max-length", type=int, help="query truncation (default: the build's)")
    p.add_argument("--topk", type=int, default=d.topk)
    p.add_argument("--max-topk", type=int, default=d.max_topk)
    p.add_argument("--max-queries", type=int, default=d.max_queries, help="queries per request (default %(default)s)")
    p.add_argument("--reject-empty-queries", action="store_true",
                   help="answer 400 to {\"queries\": []} (Search-R1's client sends it: default is [] → [])")
    p.add_argument("--no-batching", action="store_true", help="encode per request (the baseline)")
    p.add_argument("--batch-window-ms", type=float, default=d.batch_window_ms)
    p.add_argument("--max-batch", type=int, default=d.max_batch, help="queries per forward (default %(default)s)")
    p.add_argument("--max-batch-tokens", type=int, default=d.max_batch_tokens,
                   help="padded tokens per forward: queries x the longest, estimated at 4 characters per "
                        "token (default %(default)s)")
    p.add_argument("--cache-size", type=int, default=d.cache_size, help="LRU query cache entries, 0 = off")
    p.add_argument("--web-cache", help="sqlite file for cached web-search answers (and the budget's spend)")
    p.add_argument("--max-queries-per-minute", type=int, default=0,
                   help="web search: queries sent to the provider (cache misses) per rolling minute; more "
                        "answer 429 with Retry-After (default 0: no limit)")
    p.add_argument("--max-queries-per-day", type=int, default=0,
                   help="web search: the same per rolling 24 h (default 0: no limit)")
    p.add_argument("--auth-token-file",
                   help=f"file holding the shared token (default: ${TOKEN_ENV}); every route but /health then "
                        "requires 'Authorization: Bearer <token>'")
    p.add_argument("--no-auth", action="store_true",
                   help="serve a non-loopback --host without a token (a network you trust; Search-R1's "
                        "client sends none)")
    p.add_argument("--malloc-trim-interval-s", type=float, default=d.malloc_trim_interval_s,
                   help="glibc: give the heap's free pages back to the OS at most this often, after a "
                        "forward (default %(default)s; 0 = never: RSS grows with varying batch shapes)")
    add_http_args(p)
    p.add_argument("--log-level", default="INFO")
    a = p.parse_args(argv)
    names = {f.name for f in fields(ServerConfig)}
    cfg = ServerConfig(**{k: v for k, v in vars(a).items() if k in names and v is not None})
    cfg.allow_empty_queries = not a.reject_empty_queries
    cfg.batching = not a.no_batching
    cfg.http = settings_from_args(a)
    if a.no_auth and a.auth_token_file:
        p.error("--no-auth and --auth-token-file contradict each other: give one")
    for flag in ("max_queries_per_minute", "max_queries_per_day"):
        if getattr(a, flag) < 0:
            p.error(f"--{flag.replace('_', '-')} must be >= 0 (0: no limit), got {getattr(a, flag)}")
        setattr(cfg, flag, getattr(a, flag) or None)
    return a, cfg


def resolve_token(a: argparse.Namespace, cfg: ServerConfig) -> None:
    """Put the token (``--auth-token-file``, else the environment) into ``cfg``; ``--no-auth`` wins
    over an inherited ``$SGRPO_TOOLS_TOKEN``, with a warning."""
    if a.no_auth:
        if os.environ.get(TOKEN_ENV):
            log.warning("--no-auth: ignoring $%s; the server answers without a token", TOKEN_ENV)
        return
    cfg.auth_token, cfg.auth_source = load_token(a.auth_token_file)


def main(argv: list[str] | None = None) -> int:
    a, cfg = parse_args(argv)
    logging.basicConfig(level=a.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        resolve_token(a, cfg)
        server = RunningServer(cfg, host=a.host, port=a.port).start()
    except (ValueError, AuthConfigError, IndexMismatch, CorpusError, OSError) as e:
        print(f"retriever_server: refusing to start: {e}", file=sys.stderr)
        return 2
    print(f"{LISTEN_PREFIX}{server.url}", flush=True)
    while not stop.wait(1.0):
        pass
    log.info("stopping: no new connections, draining in-flight requests (up to %gs)", cfg.http.drain_s)
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
