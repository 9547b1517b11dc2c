"""The ``ivf_pqfs_sq8`` kind: an IVF of 4-bit PQ fast-scan codes picks a shortlist, which is
re-ranked by SQ8 codes read from a memory-mapped file.

Why this shape (issue #49, docs/retriever.md "the index design"): on vectors shaped like E5, an
IVF-SQ8 query at 0.95 recall@3 scans ~10-16% of the rows' SQ8 codes, ~0.13 us each, which caps
wiki-18 (21M rows) near 4 QPS on 2 cores whatever the lists. A 4-bit fast-scan PQ code (4
dimensions per code, SIMD table look-ups) costs ~27x less to scan, but is too coarse to rank the
top 3 by itself; re-scoring its best ``k x k_factor`` rows with their SQ8 codes restores the
recall. Measured at 250k hard rows: 0.960 recall@3 in 4 ms per query against IVF-SQ8's 0.964 in
58 ms.

What lives where: FAISS keeps fast-scan lists in RAM (packed in blocks of 32 codes; they cannot
be mapped), ``dim/8 + 8`` bytes per row (104 at 768-d: 2.2 GB at 21M). The SQ8 re-rank codes,
``dim`` bytes per row stored by row id (16 GB at 21M), are a plain file mapped read-only: page
cache, never private memory, with or without ``--mmap``. Each query reads its shortlist's rows
(hundreds of 768-byte reads) from it. The scalar quantizer's trained ranges sit in a small FAISS
file beside it, so decoding is FAISS's own.
"""

from __future__ import annotations

from pathlib import Path
import numpy as np

RERANK_CODES_FILE = "rerank_sq8.codes"  # uint8, ntotal x code_size, row i = passage i
RERANK_SQ_FILE = "rerank_sq8.faiss"  # an empty, trained IndexScalarQuantizer: the decoding ranges
# re-rank depths the calibration tries (shortlist = k x depth rows): 300 reached 0.95 at 250k hard
# 768-d rows; 1,000 was needed at 128-d, where 4-bit codes of 4 dimensions rank coarser
K_FACTORS = (10, 30, 100, 300, 1000)
DEFAULT_K_FACTOR = 100


class RerankFilesError(ValueError):
    """The re-rank files are missing or do not match the index (the server refuses to start)."""


def _faiss():
    import faiss

    return faiss


def has_rerank_files(folder: str | Path) -> bool:
    return (Path(folder) / RERANK_CODES_FILE).is_file() and (Path(folder) / RERANK_SQ_FILE).is_file()


def train_rerank_quantizer(sample: np.ndarray):
    """SQ8 ranges per dimension trained on ``sample`` (the same sample the lists train on)."""
    faiss = _faiss()
    sq = faiss.IndexScalarQuantizer(sample.shape[1], faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT)
    sq.train(np.ascontiguousarray(sample, dtype=np.float32))
    return sq


def encode_rerank(sq_index, x: np.ndarray) -> np.ndarray:
    """The SQ8 codes of ``x`` (n x code_size uint8), FAISS's encoding."""
    return sq_index.sq.compute_codes(np.ascontiguousarray(x, dtype=np.float32))


class SQ8Scorer:
    """Inner products of a query with SQ8-coded rows, without decoding them one component at a
    time: FAISS's Python-reachable ``decode`` took 7.9 ms for a 900-row shortlist of 768-d codes,
    30x the fast-scan search itself. FAISS's 8-bit codec reconstructs component j as
    ``vmin_j + (c_j + 0.5) / 255 * vdiff_j`` (its ``trained`` vector holds vmin then vdiff), so
    ``q . x = c @ (q * vdiff / 255) + q . (vmin + 0.5 * vdiff / 255)``: one uint8 x float
    matrix-vector product. Through ``einsum``, not ``@``: a BLAS ``gemv`` spread over busy cores
    took 7.8 ms where ``einsum`` takes 0.44 ms (900 x 768, 2 loaded cores).
    ``tests/test_retriever_rerank.py`` holds it to FAISS's own decode."""

    def __init__(self, sq_index) -> None:
        faiss = _faiss()
        sq = sq_index.sq
        if sq.qtype != faiss.ScalarQuantizer.QT_8bit:
            raise ValueError(f"the re-rank codes must be SQ8 (QT_8bit), not qtype {sq.qtype}")
        trained = faiss.vector_to_array(sq.trained).astype(np.float32)
        d = int(sq.d)
        vmin, vdiff = trained[:d], trained[d:2 * d]
        self.scale = vdiff / 255.0
        self.offset = vmin + 0.5 * self.scale

    def scores(self, codes: np.ndarray, q: np.ndarray) -> np.ndarray:
        w = np.ascontiguousarray(q * self.scale, dtype=np.float32)
        return np.einsum("ij,j->i", codes, w, dtype=np.float32, casting="unsafe") + np.float32(q @ self.offset)


class RerankedIndex:
    """``base`` (the fast-scan IVF) proposes ``k x k_factor`` rows; their SQ8 codes decide the top k.

    Duck-types the FAISS calls the server and the calibration make (``search``, ``ntotal``,
    ``d``); ``base`` is where ``nprobe`` is set."""

    def __init__(self, base, codes: np.ndarray, sq_index, k_factor: int = DEFAULT_K_FACTOR) -> None:
        if k_factor < 1:
            raise ValueError(f"k_factor must be >= 1, got {k_factor}")
        self.base, self.codes, self.sq_index, self.k_factor = base, codes, sq_index, int(k_factor)
        self.scorer = SQ8Scorer(sq_index)
        self.ntotal, self.d = int(base.ntotal), int(base.d)

    def search(self, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        q = np.ascontiguousarray(q, dtype=np.float32)
        k = min(k, self.ntotal)
        _, cand = self.base.search(q, min(self.ntotal, k * self.k_factor))
        scores = np.full((len(q), k), -np.inf, np.float32)
        rows = np.full((len(q), k), -1, np.int64)
        for i in range(len(q)):
            found = np.sort(cand[i][cand[i] >= 0])  # ascending offsets: the reads go forward in the file
            if not len(found):
                continue
            s = self.scorer.scores(self.codes[found], q[i])
            kk = min(k, len(found))
            top = np.argpartition(-s, kk - 1)[:kk]
            top = top[np.argsort(-s[top], kind="stable")]
            scores[i, :kk], rows[i, :kk] = s[top], found[top]
        return scores, rows


def open_reranked(folder: str | Path, base, k_factor: int | None = None) -> RerankedIndex:
    """The re-rank files beside ``base``'s ``index.faiss``, checked against it (a codes file of
    the wrong size would re-rank other rows than the shortlist names)."""
    faiss = _faiss()
    folder = Path(folder)
    if not has_rerank_files(folder):
        raise RerankFilesError(f"{folder}: a fast-scan index needs {RERANK_CODES_FILE} and {RERANK_SQ_FILE} beside it "
                           "(its SQ8 re-rank codes); rebuild or re-import the folder")
    sq = faiss.read_index(str(folder / RERANK_SQ_FILE))
    code_size = int(sq.sq.code_size)
    path = folder / RERANK_CODES_FILE
    want = int(base.ntotal) * code_size
    have = path.stat().st_size
    if have != want or int(sq.d) != int(base.d):
        raise RerankFilesError(f"{path}: {have} bytes of {sq.d}-d SQ8 codes, but the index holds {base.ntotal} "
                           f"{base.d}-d rows ({want} bytes); the folder is from two different builds")
    codes = np.memmap(path, dtype=np.uint8, mode="r", shape=(int(base.ntotal), code_size)) if want else \
        np.zeros((0, code_size), np.uint8)
    return RerankedIndex(base, codes, sq, k_factor or DEFAULT_K_FACTOR)

