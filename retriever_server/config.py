"""Server settings, shared by the CLI, the app factory and the test/bench helpers."""

from __future__ import annotations

from dataclasses import dataclass, field

from .budget import Limits as BudgetLimits
from .http_server import HttpSettings
from .schema import Limits


@dataclass
class ServerConfig:
    index: str | None = None  # index folder; None serves only /search (web)
    model: str | None = None  # override meta.json's model (e.g. a local copy of the same weights)
    device: str = "cpu"
    mmap: bool = False
    nprobe: int | None = None  # IVF lists searched per query; default: meta.json's (set at build)
    fp16: bool = False
    max_length: int | None = None  # query truncation; default: the build's max_length
    topk: int = 3
    max_topk: int = 100
    max_queries: int = Limits.max_queries  # per request
    allow_empty_queries: bool = True
    batching: bool = True
    batch_window_ms: float = 5.0
    max_batch: int = 64  # queries per encoder forward
    # padded tokens per forward (queries × the longest, estimated): bounds how long one forward
    # takes, so a small request never rides in a forward of 64 queries × 256 tokens
    max_batch_tokens: int = 4096
    cache_size: int = 10_000  # LRU entries; 0 disables
    request_timeout_s: float = 120.0
    malloc_trim_interval_s: float = 1.0  # glibc heap trimming after forwards (native_heap.py); 0 = off
    web_cache: str | None = None  # sqlite path for Serper answers
    web_retries: int = 3
    web_backoff_s: float = 0.5
    # the web-search bill: provider queries (cache misses) per rolling minute / day; None = no cap
    max_queries_per_minute: int | None = None
    max_queries_per_day: int | None = None
    # the shared bearer token (auth.py): every route but /health requires it; None = open, which
    # only a loopback bind or an explicit no_auth (a trusted network) allows
    auth_token: bytes | None = field(default=None, repr=False)
    auth_source: str = "none"  # where the token came from, for the log (never the token)
    no_auth: bool = False
    http: HttpSettings = field(default_factory=HttpSettings)  # the waitress layer (serve, RunningServer)

    def limits(self) -> Limits:
        return Limits(self.topk, self.max_topk, self.max_queries, self.allow_empty_queries)

    def budget(self) -> BudgetLimits:
        return BudgetLimits(self.max_queries_per_minute, self.max_queries_per_day)

    def validate(self) -> None:
        """Raise ValueError naming the first bad value (the CLI prints it and exits)."""
        checks = [
            (self.topk >= 1, f"--topk must be >= 1, got {self.topk}"),
            (self.max_topk >= self.topk, f"--max-topk ({self.max_topk}) must be >= --topk ({self.topk})"),
            (self.max_queries >= 1, f"--max-queries must be >= 1, got {self.max_queries}"),
            (self.nprobe is None or self.nprobe >= 1, f"--nprobe must be >= 1, got {self.nprobe}"),
            (self.max_batch >= 1, f"--max-batch must be >= 1, got {self.max_batch}"),
            (self.max_batch_tokens >= 1, f"--max-batch-tokens must be >= 1, got {self.max_batch_tokens}"),
            (self.batch_window_ms >= 0, f"--batch-window-ms must be >= 0, got {self.batch_window_ms}"),
            (self.cache_size >= 0, f"--cache-size must be >= 0, got {self.cache_size}"),
            (self.malloc_trim_interval_s >= 0,
             f"--malloc-trim-interval-s must be >= 0, got {self.malloc_trim_interval_s}"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(msg)
        self.budget().validate()
        self.http.validate()
