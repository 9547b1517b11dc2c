"""Calibrated recall: the smallest ``nprobe`` that reaches a target recall@k against exact search.

Why: recall at a fixed ``nprobe`` is a property of the vectors, not of the index type. On the
easy synthetic set nprobe 4 already saturates; on vectors shaped like real E5 (anisotropic,
clusters of very unequal size, near-duplicates, queries apart from passages) nprobe 32 of 4,096
lists fell far below 0.95. So the builder and the importer measure it on the index they just
wrote: the exact top-k of a query sample is kept while the vectors stream by (one pass, no
second read of a 64 GB file), then recall@k is measured over an ``nprobe`` sweep, and the
smallest ``nprobe`` reaching the target becomes the server's default. ``meta.json`` keeps the
curve, and the server reports it in ``/health`` and ``/metrics``.

Queries, best first: the user's own (a text file, one question per line, encoded with the
index's model as the server will encode them; or a ``.npy`` of query vectors). Without them a
**stand-in** is drawn: passages sampled across the corpus, each moved off itself by
noise in the corpus's own principal directions (real queries are not passages). Its recall is a
guide, said to be a stand-in everywhere it is reported.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from tqdm import tqdm

log = logging.getLogger(__name__)

DEFAULT_TARGET = 0.95
DEFAULT_K = 3
DEFAULT_SAMPLE = 500  # stand-in queries drawn when the user passes none
MAX_QUERIES = 20_000  # exact top-k costs queries x rows x dim: bound the pass
STAND_IN_NOISE = 0.5  # stand-in query = normalize(passage + noise of this norm), see stand_in_queries
CAL_KEYS = ("nprobe", "recall", "k", "target", "reached", "queries")


class CalibrationError(ValueError):
    """Bad calibration input (missing file, wrong dimension, target out of range); names the value."""


class _Source(Protocol):
    ntotal: int
    dim: int

    def read(self, start: int, stop: int) -> np.ndarray: ...


@dataclass
class QuerySet:
    """Query vectors and where they came from (``stand_in``: not the user's questions)."""

    vectors: np.ndarray
    source: str
    stand_in: bool

    def describe(self) -> dict[str, Any]:
        return {"source": self.source, "n": int(len(self.vectors)), "stand_in": self.stand_in}


def check_target(target: float, k: int) -> None:
    if not (0.0 < target <= 1.0):
        raise CalibrationError(f"--target-recall must be in (0, 1], got {target}")
    if k < 1:
        raise CalibrationError(f"--recall-k must be >= 1, got {k}")


def load_queries(path: str | Path, dim: int, encode: Callable[[list[str]], np.ndarray] | None,
                 limit: int = MAX_QUERIES) -> QuerySet:
    """``path``: ``.npy`` query vectors (n x dim), or text with one question per line that
    ``encode`` turns into vectors with the index's model (the server's query encoding)."""
    p = Path(path)
    if not p.is_file():
        raise CalibrationError(f"calibration queries file not found: {p}")
    if p.suffix == ".npy":
        try:
            v = np.load(p, mmap_mode="r")
        except ValueError as e:
            raise CalibrationError(f"calibration queries {p} is not a .npy array: {e}") from None
        if v.ndim != 2 or v.shape[1] != dim:
            raise CalibrationError(f"calibration queries {p} has shape {tuple(v.shape)}; the index needs (n, {dim})")
        v = np.ascontiguousarray(v[:limit], dtype=np.float32)
    else:
        texts = [t.strip() for t in p.read_text(encoding="utf-8").splitlines() if t.strip()][:limit]
        if not texts:
            raise CalibrationError(f"calibration queries file {p} holds no questions")
        if encode is None:
            raise CalibrationError(f"{p}: text queries need the index's encoder")
        v = np.ascontiguousarray(encode(texts), dtype=np.float32)
    if len(v) == 0:
        raise CalibrationError(f"calibration queries file {p} holds no vectors")
    return QuerySet(v, str(p.resolve()), stand_in=False)


def stand_in_queries(source: _Source, n: int, seed: int = 0, noise: float = STAND_IN_NOISE) -> QuerySet:
    """``n`` passages drawn evenly across the source (one ``read`` each: sequential enough), each
    moved by Gaussian noise shaped like the sample's own spread (its covariance), of norm
    ``noise``: isotropic noise in 768-d is orthogonal to everything and would leave each passage
    its own nearest neighbour, an easy query; real questions sit apart from passages."""
    n = max(1, min(n, source.ntotal))
    rng = np.random.default_rng([seed, 49])
    rows = np.sort(rng.choice(source.ntotal, n, replace=False))
    x = np.concatenate([source.read(r, r + 1) for r in rows.tolist()]).astype(np.float32)
    centred = x - x.mean(0)
    m = min(n, 256)  # Gaussian mixes of m centred rows: covariance-shaped noise at n x m x dim cost
    noise_v = rng.standard_normal((n, m), dtype=np.float32) @ centred[:m] / math.sqrt(m)
    noise_v *= noise / np.maximum(np.linalg.norm(noise_v, axis=1, keepdims=True), 1e-12)
    q = x + noise_v
    q /= np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
    return QuerySet(np.ascontiguousarray(q), f"stand-in: {n} sampled passages + covariance-shaped noise "
                    f"(norm {noise}); pass --calibration-queries with real questions", stand_in=True)


@dataclass
class ExactTopK:
    """The exact inner-product top-k of ``queries`` over rows fed chunk by chunk (any order)."""

    queries: np.ndarray
    k: int
    scores: np.ndarray = field(init=False)
    ids: np.ndarray = field(init=False)
    seen: list[tuple[int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.scores = np.full((len(self.queries), self.k), -np.inf, np.float32)
        self.ids = np.full((len(self.queries), self.k), -1, np.int64)

    def add(self, start: int, x: np.ndarray) -> None:
        if len(x) == 0:
            return
        s = self.queries @ np.ascontiguousarray(x, dtype=np.float32).T
        kk = min(self.k, s.shape[1])
        part = np.argpartition(-s, kk - 1, axis=1)[:, :kk]
        cand_s = np.concatenate([self.scores, np.take_along_axis(s, part, 1)], 1)
        cand_i = np.concatenate([self.ids, part + start], 1)
        order = np.argsort(-cand_s, axis=1, kind="stable")[:, :self.k]
        self.scores = np.take_along_axis(cand_s, order, 1)
        self.ids = np.take_along_axis(cand_i, order, 1)
        self.seen.append((start, start + len(x)))

    def fill_gaps(self, source: _Source, chunk_rows: int) -> int:
        """Feed the rows not seen yet (a resumed conversion skipped its finished chunks); returns
        how many rows that read."""
        covered = np.zeros(source.ntotal, bool)
        for a, b in self.seen:
            covered[a:b] = True
        read = 0
        for start in range(0, source.ntotal, chunk_rows):
            stop = min(source.ntotal, start + chunk_rows)
            if not covered[start:stop].all():
                self.add(start, source.read(start, stop))
                read += stop - start
        return read


def recall_at_k(found: np.ndarray, exact: np.ndarray, k: int) -> float:
    return float(np.mean([len(set(f[:k].tolist()) & set(e[:k].tolist())) / k for f, e in zip(found, exact)]))


def sweep_values(nlist: int) -> list[int]:
    """1, 2, 4, ... up to every list (recall at nprobe = nlist is the codes' own limit)."""
    vals, p = [], 1
    while p < nlist:
        vals.append(p)
        p *= 2
    return vals + [nlist]


def calibrate(index, queries: QuerySet, exact: ExactTopK, *, k: int = DEFAULT_K, target: float = DEFAULT_TARGET,
              progress: bool = True) -> dict[str, Any]:
    """Recall@k over the nprobe sweep; stops at the first nprobe reaching ``target`` (the answer),
    or sweeps to every list when none does. Returns what ``meta.json`` keeps as ``calibration``.

    A re-ranked index (``ivf_pqfs_sq8``) has a second knob, the re-rank depth ``k_factor``: the
    sweep runs once per depth in :data:`~retriever_server.rerank.K_FACTORS` (deeper ones only up
    to the nprobe a shallower one needed; a depth's sweep ends where doubling nprobe stops raising
    recall, since more lists then only add near-ties its shortlist cannot hold: at 21M a sweep to
    every list costs minutes per depth), and of the points reaching the target the one with the
    least measured time per query is chosen (a deeper re-rank costs reads, fewer lists cost
    recall). Curve points then carry their ``k_factor``."""
    import faiss

    from .rerank import K_FACTORS, RerankedIndex

    reranked = isinstance(index, RerankedIndex)
    ivf = faiss.extract_index_ivf(index.base if reranked else index)
    saved = (ivf.nprobe, index.k_factor if reranked else None)
    curve: list[dict[str, float]] = []
    q = np.ascontiguousarray(queries.vectors, dtype=np.float32)
    values = sweep_values(int(ivf.nlist))
    depths = K_FACTORS if reranked else (None,)
    try:
        for depth in depths:
            if depth is not None:
                index.k_factor = depth
            todo = values
            for c in curve:  # a deeper re-rank never needs more lists than a shallower one reached with
                if c["recall"] >= target:
                    todo = [p for p in todo if p <= c["nprobe"]]
            for p in tqdm(todo, desc="calibrate: nprobe sweep" + (f" (k_factor {depth})" if depth else ""),
                          disable=not progress):
                ivf.nprobe = p
                t0 = time.perf_counter()
                _, ids = index.search(q, k)
                ms = (time.perf_counter() - t0) * 1000 / len(q)
                r = recall_at_k(ids, exact.ids, k)
                curve.append({"nprobe": p, **({"k_factor": depth} if depth else {}), "recall": round(r, 4),
                              "ms_per_query": round(ms, 3)})
                log.info("calibrate: nprobe %d of %d lists%s: recall@%d %.4f (%.2f ms/query)", p, ivf.nlist,
                         f", k_factor {depth}" if depth else "", k, r, ms)
                if r >= target:
                    break
                if depth is not None and len(curve) > 1 and curve[-2].get("k_factor") == depth \
                        and r <= curve[-2]["recall"]:
                    break  # twice the lists gained nothing: this shortlist is the limit, try a deeper one
    finally:
        ivf.nprobe = saved[0]
        if reranked:
            index.k_factor = saved[1]
    good = [c for c in curve if c["recall"] >= target]
    reached = bool(good)
    if reached:  # the cheapest point reaching the target (the first, when there is one depth)
        chosen = min(good, key=lambda c: c["ms_per_query"]) if reranked else good[0]
    else:  # the best the codes allow, at the fewest lists that give it
        best = max(c["recall"] for c in curve)
        chosen = next(c for c in curve if c["recall"] == best)
    out = {"nprobe": int(chosen["nprobe"]), "recall": chosen["recall"], "k": k, "target": target,
           "reached": reached, "nlist": int(ivf.nlist), "queries": queries.describe(), "curve": curve}
    if reranked:
        out["k_factor"] = int(chosen["k_factor"])
    return out


def unreached_message(cal: dict[str, Any]) -> str:
    return (f"target recall@{cal['k']} {cal['target']} not reached: the best is {cal['recall']} at nprobe "
            f"{cal['nprobe']} of {cal['nlist']} lists (SQ8/PQ rounding caps it); serving that nprobe. "
            "Lower --target-recall, or rebuild with finer codes (ivf_sq8 instead of ivf_pq)")


def recall_at(cal: dict[str, Any], nprobe: int) -> float | None:
    """The measured recall at ``nprobe`` (the curve point at or below it, at the calibrated
    re-rank depth where there is one), None below the curve."""
    pts = [c for c in cal.get("curve", []) if c["nprobe"] <= nprobe and c.get("k_factor") == cal.get("k_factor")]
    return pts[-1]["recall"] if pts else None


def add_calibration_args(p: argparse.ArgumentParser) -> None:
    """The calibration flags import_index and build_index share."""
    p.add_argument("--calibration-queries", default=None,
                   help="questions to calibrate nprobe on: a text file (one per line, encoded with --model, "
                        "e.g. the training questions) or a .npy of query vectors (default: a stand-in sample)")
    p.add_argument("--calibration-sample", type=int, default=DEFAULT_SAMPLE,
                   help="stand-in queries drawn when --calibration-queries is not given (0: no calibration; "
                        "default %(default)s)")
    p.add_argument("--target-recall", type=float, default=DEFAULT_TARGET,
                   help="recall@k against exact search the default nprobe must reach (default %(default)s)")
    p.add_argument("--recall-k", type=int, default=DEFAULT_K, help="k of the target recall@k (default %(default)s)")


def report_calibration(meta: dict[str, Any], prog: str) -> None:
    """One stderr line: what was calibrated on what, and whether the target was reached."""
    cal = meta.get("calibration")
    if not cal:
        return
    q = cal["queries"]
    what = "STAND-IN queries (not your questions)" if q["stand_in"] else f"{q['n']} queries from {q['source']}"
    if cal["reached"]:
        print(f"{prog}: calibrated nprobe {cal['nprobe']} of {cal['nlist']} lists: recall@{cal['k']} "
              f"{cal['recall']} >= target {cal['target']} on {what}", file=sys.stderr)
    else:
        print(f"{prog}: warning: {unreached_message(cal)} ({what})", file=sys.stderr)
