"""A loaded index: encoder + FAISS searcher + docstore, checked against each other at startup."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .build_index import META_FILE
from .calibrate import recall_at
from .docstore import DOCS_FILE, DocStore
from .encoder import Encoder, load_encoder
from .faiss_index import DEFAULT_IVF_NPROBE, INDEX_FILE, Searcher, make_searcher, open_index
from .ivf_stream import IVFDATA_FILE
from .native_heap import mapped_file_mb, process_memory
from .profiles import Profile
from .rerank import RERANK_CODES_FILE

log = logging.getLogger(__name__)

# A query is cut to max_length × this many characters before tokenizing: the tokenizer would
# truncate it to max_length tokens anyway, but only after tokenizing all of it (a 30 KB query
# costs as much to tokenize as a hundred real ones). No tokenizer makes tokens this long from
# text that survives truncation, except single "words" it maps to [UNK] anyway.
MAX_CHARS_PER_TOKEN = 16
# What a query costs the batcher before it is tokenized: ~4 characters per token in English
# wordpiece/sentencepiece vocabularies, plus the special tokens; an estimate, only for budgeting.
CHARS_PER_TOKEN_ESTIMATE = 4


class IndexMismatch(RuntimeError):
    """Index, docstore, meta.json and model disagree: serving would return wrong passages."""


@dataclass(frozen=True)
class Hit:
    row: int
    score: float


def load_meta(index_dir: Path) -> dict[str, Any]:
    f = index_dir / META_FILE
    if not f.is_file():
        raise IndexMismatch(f"{f} not found: {index_dir} is not a finished index "
                            "(run python -m retriever_server.build_index)")
    return json.loads(f.read_text())


def check_consistency(meta: dict[str, Any], searcher: Searcher, docs: DocStore, encoder: Encoder,
                      docs_bytes: int) -> None:
    """Refuse to start when any two parts disagree; the message names the mismatch."""
    problems = []
    if searcher.ntotal != meta["count"]:
        problems.append(f"index holds {searcher.ntotal} vectors but meta.json says count={meta['count']}")
    if len(docs) != meta["count"]:
        problems.append(f"docstore holds {len(docs)} passages but meta.json says count={meta['count']}")
    if docs_bytes != meta.get("docstore_bytes", docs_bytes):
        problems.append(f"docstore is {docs_bytes} bytes but meta.json says {meta['docstore_bytes']}")
    if searcher.dim != meta["dim"]:
        problems.append(f"index dim {searcher.dim} != meta.json dim {meta['dim']}")
    if encoder.dim != searcher.dim:
        problems.append(f"model {encoder.model!r} makes {encoder.dim}-dim vectors but the index is "
                        f"{searcher.dim}-dim (built with {meta.get('model')!r})")
    if problems:
        raise IndexMismatch("refusing to serve: " + "; ".join(problems))


class Retriever:
    """Answers batches of queries with top-k passage rows; thread-safe."""

    def __init__(self, index_dir: str | Path, *, model: str | None = None, device: str = "cpu",
                 mmap: bool = False, fp16: bool = False, max_length: int | None = None,
                 encoder: Encoder | None = None, nprobe: int | None = None) -> None:
        self.index_dir = Path(index_dir)
        self.meta = load_meta(self.index_dir)
        self.profile = Profile.from_dict(self.meta["profile"])
        self.model = model or self.meta["model"]
        self.device = device
        self.max_length = max_length or self.meta.get("max_length", 256)
        self.max_query_chars = self.max_length * MAX_CHARS_PER_TOKEN
        self.docs = DocStore(self.index_dir)
        # meta.json's nprobe is the calibrated one when the build measured it (calibrate.py)
        self.nprobe = int(nprobe or self.meta.get("nprobe", DEFAULT_IVF_NPROBE))
        self.calibration_warning = calibration_warning(self.meta.get("calibration"), self.nprobe)
        if self.calibration_warning:
            log.warning("%s", self.calibration_warning)
        self.index = open_index(self.index_dir / INDEX_FILE, mmap=mmap, nprobe=self.nprobe,
                                k_factor=self.meta.get("k_factor"))
        # files whose mapped pages are the index's (page cache), reported apart from private memory
        self._mapped = {str(p.resolve()) for p in (self.index_dir / INDEX_FILE, self.index_dir / IVFDATA_FILE,
                                                   self.index_dir / RERANK_CODES_FILE) if p.exists()}
        self.searcher = make_searcher(self.index, device=device)
        self.encoder = encoder or load_encoder(self.model, self.profile, device=device, fp16=fp16,
                                               max_length=self.max_length)
        check_consistency(self.meta, self.searcher, self.docs, self.encoder,
                          (self.index_dir / DOCS_FILE).stat().st_size)
        self._lock = threading.Lock()  # one forward at a time: parallel forwards only thrash cores
        log.info("serving %d passages (%d-dim, %s) with %s on %s", self.size, self.dim,
                 self.meta.get("index_type"), self.model, self.searcher.backend)

    @property
    def size(self) -> int:
        return self.searcher.ntotal

    @property
    def dim(self) -> int:
        return self.searcher.dim

    def clip(self, query: str) -> str:
        """``query`` cut to what can survive truncation to ``max_length`` tokens (see above)."""
        return query[:self.max_query_chars]

    def estimate_tokens(self, query: str) -> int:
        """About how many tokens ``query`` becomes (at most ``max_length``), without tokenizing."""
        return min(self.max_length, len(query) // CHARS_PER_TOKEN_ESTIMATE + 2)

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """One encoder forward and one index search for all ``queries`` (callers bound how many)."""
        if not queries:
            return []
        texts = [self.clip(q) for q in queries]
        with self._lock:
            vecs = self.encoder.encode(texts, is_query=True, batch_size=len(texts))
            scores, rows = self.searcher.search(vecs, k)
        return [[Hit(int(r), float(s)) for r, s in zip(rr, ss) if r >= 0]
                for rr, ss in zip(np.asarray(rows), np.asarray(scores))]

    def warmup(self, max_batch: int) -> None:
        """Run the encoder at batch sizes 1, 2, 4, … so first requests do not pay kernel set-up."""
        n = 1
        while n <= max_batch:
            self.search([f"warm up query {i}" for i in range(n)], 1)
            n *= 2

    def documents(self, hits: Sequence[Hit]) -> list[dict[str, str]]:
        return self.docs.get_many([h.row for h in hits])

    def memory(self) -> dict[str, float]:
        """Private memory (``rss_anon_mb``: must fit the machine) apart from the index's mapped
        file pages (``index_mapped_mb``: page cache the kernel can reclaim and re-read)."""
        mem = process_memory()
        mem["index_mapped_mb"] = mapped_file_mb(self._mapped)
        return mem

    def calibration(self) -> dict[str, Any] | None:
        """What the build measured (None for exact types and pre-#49 folders), and the recall it
        measured at the nprobe being served: for ``/health`` and ``/metrics``."""
        cal = self.meta.get("calibration")
        if not cal:
            return None
        out = {k: cal.get(k) for k in ("nprobe", "recall", "k", "target", "reached", "nlist")}
        if "k_factor" in cal:
            out["k_factor"] = cal["k_factor"]
        out["queries"] = cal.get("queries")
        out["serving_nprobe"] = self.nprobe
        out["recall_at_serving_nprobe"] = recall_at(cal, self.nprobe)
        out["warning"] = self.calibration_warning
        return out

    def info(self) -> dict[str, Any]:
        ivf = self.meta.get("nlist")
        return {"model": self.model, "profile": self.profile.name, "index_type": self.meta.get("index_type"),
                "index_size": self.size, "dim": self.dim, "device": self.device,
                "search_backend": self.searcher.backend, **({"nlist": ivf, "nprobe": self.nprobe} if ivf else {}),
                **({"k_factor": self.meta["k_factor"]} if "k_factor" in self.meta else {}),
                "calibration": self.calibration()}


def calibration_warning(cal: dict[str, Any] | None, nprobe: int) -> str | None:
    """A line saying what recall a ``--nprobe`` below the calibrated one gives up (None otherwise)."""
    if not cal or nprobe >= cal["nprobe"]:
        return None
    at = recall_at(cal, nprobe)
    measured = f"measured recall@{cal['k']} there: {at}" if at is not None else "not measured there"
    stand_in = " (calibrated on stand-in queries)" if (cal.get("queries") or {}).get("stand_in") else ""
    return (f"--nprobe {nprobe} is below the calibrated nprobe {cal['nprobe']}, which reached recall@{cal['k']} "
            f"{cal['recall']} (target {cal['target']}){stand_in}; {measured}")
