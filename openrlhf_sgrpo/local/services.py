"""Start the retriever and the sandbox on loopback for a single-machine run, and stop them.

Both come from their own parts' process managers, the ones the services' own CLIs and benchmarks
use (``retriever_server.background.RunningServer``: waitress in a thread of this process, sharing
its memory with the trainer rather than loading torch twice; ``sandbox.process.SandboxProcess``: a
child process with the local bubblewrap backend, draining and removing its cgroups on exit), on
free ports. :func:`local_services` yields the URLs; the caller puts
them into the agent's config.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServiceUrls:
    retriever_url: str | None  # ".../retrieve"
    sandbox_url: str | None  # ".../run_code"


def ensure_index(corpus_jsonl: str | Path, index_dir: str | Path, model: str | Path | None = None,
                 progress: bool = True) -> Path:
    """Build the FAISS index for a corpus jsonl, or reuse a complete one for the same corpus+model."""
    from openrlhf_sgrpo.assets import minilm_dir
    from retriever_server.build_index import build_index

    model = str(model or minilm_dir())
    result = build_index(corpus_jsonl, index_dir, model=model, index_type="flat", batch_size=32,
                         max_length=256, progress=progress)
    log.info("index %s: %d passages (%d encoded now, %.1fs)", result.out_dir, result.count, result.encoded,
             result.seconds)
    return result.out_dir


def cached_index_for(corpus_jsonl: str | Path, model: str | Path | None = None, progress: bool = True) -> Path:
    """Index a corpus once, in the asset cache (never beside the data), keyed by the corpus'
    content *and* the encoder: two checkouts (two venvs, two MiniLM paths) sharing one cache
    must not find each other's builds under the same name."""
    import fcntl
    import hashlib

    from openrlhf_sgrpo.assets import cache_dir, minilm_dir
    from retriever_server.corpora import file_sha256

    model = str(Path(model).resolve()) if model and Path(model).exists() else str(model or minilm_dir())
    key = f"{file_sha256(corpus_jsonl)[:16]}-{hashlib.sha256(model.encode()).hexdigest()[:8]}"
    index_dir = cache_dir() / "indexes" / key
    index_dir.parent.mkdir(parents=True, exist_ok=True)
    # one builder per entry: a second process (another run, another test worker) waits, then
    # reuses the finished index instead of writing the same files beside the first
    with open(index_dir.with_name(key + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return ensure_index(corpus_jsonl, index_dir, model=model, progress=progress)


@contextlib.contextmanager
def local_services(index_dir: str | Path | None, sandbox: bool = True, sandbox_concurrency: int = 4,
                   topk: int = 3) -> Iterator[ServiceUrls]:
    """Retriever over ``index_dir`` (None: no retriever) and, if asked, the sandbox; both stopped on exit."""
    with contextlib.ExitStack() as stack:
        retriever_url = sandbox_url = None
        if index_dir is not None:
            from retriever_server.background import RunningServer
            from retriever_server.config import ServerConfig

            srv = stack.enter_context(RunningServer(ServerConfig(index=str(index_dir), topk=topk)))
            retriever_url = f"{srv.url}/retrieve"
        if sandbox:
            from sandbox.process import SandboxProcess

            sb = stack.enter_context(SandboxProcess(backend="local", max_concurrency=sandbox_concurrency))
            sandbox_url = f"{sb.url}/run_code"
        yield ServiceUrls(retriever_url, sandbox_url)
