"""FAISS index types, building from embedding chunks, loading (optionally memory-mapped), searching.

Searchers share one interface ``search(vectors, k) -> (scores, rows)`` so the server does not care
whether FAISS on CPU, faiss-gpu shards, or a torch fp16 matmul on a GPU answers.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import numpy as np

log = logging.getLogger(__name__)

INDEX_FILE = "index.faiss"
INDEX_TYPES = ("flat", "hnsw32", "ivf,pq", "sq8")  # built in RAM by build_from_chunks
# built by streaming (ivf_stream.py), inverted lists in one memory-mapped file beside index.faiss
STREAMED_TYPES = ("ivf_sq8", "ivf_pq", "ivf_pqfs_sq8")
DEFAULT_IVF_NPROBE = 32
DEFAULT_HNSW_EF = 128


def _faiss():
    import faiss

    return faiss


def _ivf_lists(n: int) -> int:
    """~4·sqrt(n) lists, but never more than the training set can support (39 points per list)."""
    return max(1, min(int(4 * math.sqrt(max(n, 1))), n // 39 or 1))


def divisor_at_most(dim: int, cap: int) -> int:
    """The largest sub-quantizer count <= ``cap`` that divides ``dim`` (PQ splits a vector into
    equal parts); 1 when ``cap`` < 1."""
    for m in range(max(1, cap), 0, -1):
        if dim % m == 0:
            return m
    return 1


def _pq_subquantizers(dim: int) -> int:
    """Largest sub-quantizer count ≤ dim/4 that divides dim (8-bit codes)."""
    return divisor_at_most(dim, dim // 4)


def _pq_bits(n: int) -> int:
    """8-bit codes need 256·39 training points; small corpora get fewer bits instead of bad codebooks."""
    return max(4, min(8, int(math.log2(max(n // 39, 16)))))


def make_index(index_type: str, dim: int, n_vectors: int, metric: str = "ip"):
    """An empty (untrained) index of ``index_type`` sized for ``n_vectors``."""
    faiss = _faiss()
    if index_type in STREAMED_TYPES:
        raise ValueError(f"{index_type} is built by streaming (retriever_server.ivf_stream), not in RAM")
    if index_type not in INDEX_TYPES:
        raise ValueError(f"unknown index type {index_type!r}; expected one of {INDEX_TYPES}")
    if metric != "ip":
        raise ValueError(f"only inner-product search is supported, not {metric!r}")
    mt = faiss.METRIC_INNER_PRODUCT
    if index_type == "flat":
        return faiss.IndexFlatIP(dim)
    if index_type == "hnsw32":
        idx = faiss.IndexHNSWFlat(dim, 32, mt)
        idx.hnsw.efConstruction = 80
        return idx
    if index_type == "sq8":
        return faiss.index_factory(dim, "SQ8", mt)
    return faiss.index_factory(dim, f"IVF{_ivf_lists(n_vectors)},PQ{_pq_subquantizers(dim)}x{_pq_bits(n_vectors)}", mt)


def build_from_chunks(index_type: str, dim: int, chunk_files: list[Path], n_vectors: int,
                      train_size: int = 200_000, seed: int = 0):
    """Train (if needed) on a sample, then add every chunk in order, one chunk in RAM at a time."""
    index = make_index(index_type, dim, n_vectors)
    if not index.is_trained:
        rng = np.random.default_rng(seed)
        parts, total = [], 0
        for f in chunk_files:
            x = np.load(f)
            take = min(len(x), max(1, train_size * len(x) // max(n_vectors, 1)))
            parts.append(x[rng.choice(len(x), take, replace=False)])
            total += take
        sample = np.ascontiguousarray(np.concatenate(parts), dtype=np.float32)
        log.info("training %s on %d vectors", index_type, len(sample))
        index.train(sample)
    for f in chunk_files:
        index.add(np.ascontiguousarray(np.load(f), dtype=np.float32))
    return index


def write_index(index, path: str | Path) -> None:
    tmp = str(path) + ".part"
    _faiss().write_index(index, tmp)
    Path(tmp).replace(path)


@contextmanager
def _stdout_to_stderr():
    """FAISS prints to the C stdout when it relocates on-disk lists; the server's stdout carries
    only its listen line (launchers parse it), so such chatter goes to stderr."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def read_index(path: str | Path, mmap: bool = False, nprobe: int = DEFAULT_IVF_NPROBE):
    with _stdout_to_stderr():
        return _read_index(path, mmap, nprobe)


def _read_index(path: str | Path, mmap: bool, nprobe: int):
    """Read an index; ``mmap`` maps flat codes / inverted lists so RSS does not grow with its size.

    FAISS has one mmap flag per storage kind and each fails differently on the wrong kind:

    * ``IO_FLAG_MMAP_IFC`` maps flat codes (flat, sq8, HNSW storage); on an index whose lists are
      already on disk (``ivf_sq8`` / ``ivf_pq`` from ivf_stream) it raises, because
      ``IO_FLAG_ONDISK_SAME_DIR`` needs a plain file reader and IFC reads through a mapped one.
    * ``IO_FLAG_MMAP`` turns array inverted lists (``ivf,pq`` built in RAM) into lists mapped from
      the index file. It is ``IO_FLAG_SKIP_IVF_DATA`` plus a tag, and FAISS's reader of on-disk
      lists (``OnDiskInvertedListsIOHook::read``) only maps its data file when
      ``SKIP_IVF_DATA`` is clear: on-disk lists read with it keep a null data pointer, and the
      first search dereferences it (the segmentation fault of issue #49).

    On-disk lists are mapped by FAISS whatever the flags (``do_mmap``, read-only), so they are
    read plainly; every read is checked by :func:`check_lists_mapped` so no flag combination can
    hand the server an index that crashes on its first search.
    """
    faiss = _faiss()
    # on-disk inverted lists (ivf_stream.py) are found beside the index file, wherever it moved
    base = faiss.IO_FLAG_ONDISK_SAME_DIR | faiss.IO_FLAG_READ_ONLY
    if not mmap:
        index = faiss.read_index(str(path), faiss.IO_FLAG_ONDISK_SAME_DIR)
    else:
        errors, index = [], None
        for name, flag in (("IO_FLAG_MMAP_IFC", faiss.IO_FLAG_MMAP_IFC), ("IO_FLAG_MMAP", faiss.IO_FLAG_MMAP)):
            try:
                candidate = faiss.read_index(str(path), flag | base)
            except RuntimeError as e:
                errors.append(f"{name}: {str(e).splitlines()[-1]}")
                continue
            if unmapped_lists(candidate):  # on-disk lists read with SKIP_IVF_DATA: not mapped
                errors.append(f"{name}: on-disk inverted lists left unmapped")
                del candidate
                continue
            index = candidate
            break
        if index is None and ondisk_lists_file(path):
            index = faiss.read_index(str(path), base)  # FAISS maps on-disk lists itself
        if index is None:
            raise RuntimeError(f"cannot memory-map {path}: {'; '.join(errors)}")
    check_lists_mapped(index, path)
    tune(index, nprobe=nprobe)
    return index


def open_index(path: str | Path, mmap: bool = False, nprobe: int = DEFAULT_IVF_NPROBE, k_factor: int | None = None):
    """:func:`read_index`, plus the SQ8 re-rank of a fast-scan IVF (``ivf_pqfs_sq8``,
    :mod:`retriever_server.rerank`): what the server and the calibration search. Whether to
    re-rank is decided by what ``index.faiss`` holds, never by files lying beside it."""
    from .rerank import open_reranked

    faiss = _faiss()
    index = read_index(path, mmap=mmap, nprobe=nprobe)
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None and isinstance(faiss.downcast_index(ivf), faiss.IndexIVFPQFastScan):
        return open_reranked(Path(path).parent, index, k_factor)
    return index


def _invlists(index):
    faiss = _faiss()
    ivf = faiss.try_extract_index_ivf(index)
    return None if ivf is None else faiss.downcast_InvertedLists(ivf.invlists)


def unmapped_lists(index) -> bool:
    """True when ``index`` has on-disk inverted lists holding data whose file is not mapped
    (``ptr`` null): searching it would read through a null pointer."""
    faiss = _faiss()
    il = _invlists(index)
    return isinstance(il, faiss.OnDiskInvertedLists) and il.totsize > 0 and il.ptr is None


def ondisk_lists_file(path: str | Path) -> bool:
    """Whether the index at ``path`` keeps its lists in a separate on-disk file (``ilod``):
    read without its data (cheap: centroids and list sizes only) to look."""
    faiss = _faiss()
    try:
        index = faiss.read_index(str(path), faiss.IO_FLAG_SKIP_IVF_DATA | faiss.IO_FLAG_ONDISK_SAME_DIR
                                 | faiss.IO_FLAG_READ_ONLY)
    except RuntimeError:
        return False
    return isinstance(_invlists(index), faiss.OnDiskInvertedLists)


def check_lists_mapped(index, path: str | Path) -> None:
    """Refuse (a Python error the server reports) rather than crash later on unmapped lists."""
    if unmapped_lists(index):
        raise RuntimeError(f"{path}: its inverted lists file is not mapped (FAISS read it without its "
                           "data); refusing to serve an index whose first search would crash")


def tune(index, nprobe: int = DEFAULT_IVF_NPROBE, ef_search: int = DEFAULT_HNSW_EF) -> None:
    """Search-time knobs for approximate indexes (no-ops for flat)."""
    from .rerank import RerankedIndex

    faiss = _faiss()
    if isinstance(index, RerankedIndex):  # nprobe is the fast-scan IVF's; the depth stays
        index = index.base
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        ivf.nprobe = min(nprobe, ivf.nlist)
    if hasattr(index, "hnsw"):
        index.hnsw.efSearch = ef_search


class Searcher(Protocol):
    ntotal: int
    dim: int
    backend: str

    def search(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]: ...


class FaissSearcher:
    """FAISS on CPU (or an index already moved to GPUs)."""

    def __init__(self, index, backend: str = "faiss-cpu") -> None:
        self.index, self.backend = index, backend
        self.ntotal, self.dim = int(index.ntotal), int(index.d)

    def search(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        k = min(k, self.ntotal)
        return self.index.search(np.ascontiguousarray(vectors, dtype=np.float32), k)


class TorchMatmulSearcher:
    """Exact inner-product search as a matmul over an fp16 (GPU) or fp32 (CPU) embedding matrix.

    The fallback for GPUs without faiss-gpu: half the memory of fp32 FAISS-Flat and no OOM from
    FAISS temp buffers; queries are searched in row blocks to bound the score matrix.
    """

    def __init__(self, embeddings: np.ndarray, device: str = "cuda", block_rows: int = 1 << 20) -> None:
        import torch

        self._torch = torch
        self.dtype = torch.float16 if device.startswith("cuda") else torch.float32
        self.device, self.block_rows, self.backend = device, block_rows, f"torch-matmul-{device}"
        self.ntotal, self.dim = int(embeddings.shape[0]), int(embeddings.shape[1])
        blocks = []
        for i in range(0, self.ntotal, block_rows):  # copy block by block to cap host RAM
            blocks.append(torch.from_numpy(np.ascontiguousarray(embeddings[i:i + block_rows]))
                          .to(device=device, dtype=self.dtype))
        self._blocks = blocks or [torch.zeros((0, self.dim), device=device, dtype=self.dtype)]

    def search(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        torch = self._torch
        k = min(k, self.ntotal)
        q = torch.from_numpy(np.ascontiguousarray(vectors, dtype=np.float32)).to(self.device, self.dtype)
        best_s = torch.full((len(q), 0), float("-inf"), device=self.device)
        best_i = torch.zeros((len(q), 0), dtype=torch.long, device=self.device)
        offset = 0
        with torch.inference_mode():
            for blk in self._blocks:
                s = (q @ blk.T).float()
                kk = min(k, s.shape[1])
                bs, bi = torch.topk(s, kk, dim=1)
                best_s = torch.cat([best_s, bs], 1)
                best_i = torch.cat([best_i, bi + offset], 1)
                best_s, pos = torch.topk(best_s, min(k, best_s.shape[1]), dim=1)
                best_i = torch.gather(best_i, 1, pos)
                offset += blk.shape[0]
        return best_s.cpu().numpy(), best_i.cpu().numpy()


def flat_vectors(index) -> np.ndarray:
    """The raw fp32 vectors of a flat index (a view over the mmapped codes when mmapped)."""
    faiss = _faiss()
    flat = faiss.downcast_index(index)
    if not isinstance(flat, faiss.IndexFlat):
        raise ValueError("torch matmul search needs a flat index")
    return faiss.rev_swig_ptr(flat.get_xb(), flat.ntotal * flat.d).reshape(flat.ntotal, flat.d)


def make_searcher(index, device: str = "cpu") -> Searcher:
    """Pick the fastest searcher that fits: faiss-gpu (fp16 shards) > torch fp16 matmul > FAISS CPU."""
    faiss = _faiss()
    if device.startswith("cuda"):
        if hasattr(faiss, "index_cpu_to_all_gpus") and faiss.get_num_gpus() > 0:
            co = faiss.GpuMultipleClonerOptions()
            co.useFloat16, co.shard = True, True
            return FaissSearcher(faiss.index_cpu_to_all_gpus(index, co=co), "faiss-gpu-fp16-sharded")
        try:
            return TorchMatmulSearcher(flat_vectors(index), device=device)
        except ValueError:
            log.warning("no faiss-gpu and the index is not flat: searching on CPU")
    return FaissSearcher(index)


