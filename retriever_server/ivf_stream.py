"""Stream vectors (a Search-R1 flat file or synthetic rows) into an IVF index whose inverted lists
live in one memory-mapped file, with bounded RAM, a progress bar, and resume after a crash.

Why this shape: at wiki-18 scale (21M x 768) the fp32 vectors are 64.5 GB and even their SQ8
codes are 16 GB, more than a 24 GB machine should hold in private memory. FAISS's
``OnDiskInvertedLists`` keeps the lists in a file the server maps read-only: the pages are page
cache (reclaimable, shared, reported apart from private memory), not heap.

Phases, each leaving only complete files behind (written under a ``.part`` name, then renamed):

1. **train**: the coarse quantizer (k-means, ``nlist`` centroids) and the SQ8/PQ codebooks on a
   sample read from ``SAMPLE_WINDOWS`` evenly spaced windows of the source (corpus order is topic
   order in wiki-18, so one window would be one topic) → ``trained.index``.
2. **add**: chunk ``i`` (``chunk_rows`` rows, the only vectors in RAM) is assigned to lists and
   encoded into a small IVF index ``block_i.index``. A restart skips the blocks on disk.
   Fast-scan kinds (``ivf_pqfs_sq8``) add every chunk to one in-RAM index instead, checkpointed
   every ``CHECKPOINT_ROWS`` rows, and write each chunk's SQ8 re-rank codes by row offset; the
   checkpoint holding every row becomes ``index.faiss`` (no merge: see ``_add_in_ram``).
3. **merge**: every block's lists are copied into ``index.ivfdata`` in the layout of FAISS's
   ``OnDiskInvertedLists`` with plain reads and writes, one block in RAM
   (:mod:`retriever_server.ivf_ondisk`; FAISS's own merge maps both sides and its RSS grew with
   the file), then ``index.faiss``, which names that file, is written; both are renamed into the
   output folder, and the caller writes ``meta.json`` last. The server refuses a folder without it.

``state.json`` records the source and the settings; a restart with other ones is refused with
the differing fields named, never mixed into the same blocks.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from tqdm import tqdm

from .faiss_index import divisor_at_most
from .ivf_ondisk import block_lists, ondisk_invlists, write_merged_lists
from .native_heap import proc_status_mb
from .rerank import RERANK_CODES_FILE, RERANK_SQ_FILE, encode_rerank, train_rerank_quantizer

log = logging.getLogger(__name__)

WORK_DIR = ".import"  # inside the output folder: blocks and state of an unfinished conversion
STATE_FILE = "state.json"
TRAINED_FILE = "trained.index"
IVFDATA_FILE = "index.ivfdata"
LIVE_FILE = "live.index"  # fast-scan kinds: the in-RAM index so far, checkpointed (see _add_in_ram)
CHECKPOINT_ROWS = 2_000_000  # ~200 MB of fast-scan lists written per checkpoint at 768-d
SAMPLE_WINDOWS = 64
# index kinds a stream can become, and the FAISS code each list entry holds
STREAM_KINDS = {"ivf_sq8": "SQ8", "ivf_pq": "PQ{m}", "ivf_pqfs_sq8": "PQ{fs}x4fs,Refine(SQ8)"}
# kinds whose lists are 4-bit fast-scan codes re-ranked by SQ8 codes by row (retriever_server/rerank.py)
RERANK_KINDS = ("ivf_pqfs_sq8",)
# kinds that exist in the server but cannot be built by streaming, and why
NOT_STREAMABLE = {
    "hnsw32": "an HNSW graph over full vectors keeps every vector in RAM while it is built "
              "(64 GB at wiki-18 scale; Search-R1's and ROLL's CPU option)",
    "sq8": "a flat SQ8 index scans all codes for every query (16 GB per query at wiki-18 scale)",
    "ivf,pq": "the in-RAM build of build_index; use ivf_pq here for the streamed, on-disk one",
}


class ConversionError(RuntimeError):
    """A conversion that cannot go on; the message says what to change."""


class VectorSource(Protocol):
    ntotal: int
    dim: int

    def read(self, start: int, stop: int) -> np.ndarray: ...

    def identity(self) -> dict[str, object]: ...


class ChunkFilesSource:
    """build_index's embedding chunks (``emb_NNNNNN.npy``, in row order) as one vector source."""

    def __init__(self, files: list[Path]) -> None:
        self.files = [Path(f) for f in files]
        arrays = [np.load(f, mmap_mode="r") for f in self.files]
        self.starts = np.cumsum([0] + [len(a) for a in arrays])
        self.ntotal, self.dim = int(self.starts[-1]), int(arrays[0].shape[1]) if arrays else 0

    def identity(self) -> dict[str, object]:
        return {"source": "build_index chunks", "files": len(self.files), "ntotal": self.ntotal, "dim": self.dim}

    def read(self, start: int, stop: int) -> np.ndarray:
        parts = []
        first = int(np.searchsorted(self.starts, start, side="right")) - 1
        for i in range(max(first, 0), len(self.files)):
            lo, hi = int(self.starts[i]), int(self.starts[i + 1])
            if lo >= stop:
                break
            a = np.load(self.files[i], mmap_mode="r")
            parts.append(np.asarray(a[max(start, lo) - lo:min(stop, hi) - lo], dtype=np.float32))
        return np.ascontiguousarray(np.concatenate(parts)) if parts else np.zeros((0, self.dim), np.float32)


def default_nlist(n: int) -> int:
    """~sqrt(n) lists, a power of two: the assignment cost (n x nlist x dim) must fit a 2-core
    budget at 21M rows (4,096 lists), and each list needs >= 39 training points."""
    if n < 39 * 4:
        return 1
    p = 2 ** round(math.log2(math.sqrt(n)))
    return int(max(1, min(p, 65536, n // 39)))


def pq_m(dim: int) -> int:
    """PQ sub-quantizers of 8 bits: dim/8 bytes per vector (96 at 768-d), dividing dim."""
    return divisor_at_most(dim, dim // 8)


def fs_m(dim: int) -> int:
    """Fast-scan PQ sub-quantizers of 4 bits, 4 dimensions each (192 at 768-d: 96 bytes per row),
    dividing dim: finer codes would scan slower, coarser ones need a deeper re-rank."""
    return divisor_at_most(dim, dim // 4)


@dataclass(frozen=True)
class StreamSettings:
    kind: str = "ivf_sq8"
    nlist: int = 0  # 0 = default_nlist(ntotal)
    chunk_rows: int = 262_144
    train_rows: int = 0  # 0 = 40 x nlist (k-means needs >= 39 per centroid)
    kmeans_iters: int = 10
    seed: int = 0
    # lists are chosen in a PCA space of this many dimensions (0: the full vectors). Assigning
    # 21M rows to 4,096 lists costs n x nlist x dim; at 128 of 768 dims that is 6x less (measured
    # by bench/retriever_index_choice.py, with the recall it costs)
    coarse_dim: int = 128

    def resolved(self, ntotal: int) -> StreamSettings:
        nlist = self.nlist or default_nlist(ntotal)
        train = self.train_rows or max(40 * nlist, 10_000)
        return replace(self, nlist=nlist, train_rows=min(train, ntotal))

    def factory(self, dim: int) -> str:
        code = STREAM_KINDS[self.kind].format(m=pq_m(dim), fs=fs_m(dim))
        coarse = f"PCA{self.coarse_dim}-" if 0 < self.coarse_dim < dim else ""
        return f"IVF{self.nlist}({coarse}FlatL2),{code}"


def make_trained(sample: np.ndarray, s: StreamSettings):
    """An empty IVF index trained on ``sample``: coarse centroids by k-means (in a PCA space when
    ``coarse_dim`` is set; L2 there, which for unit vectors ranks like inner product), then the
    SQ8 ranges / PQ codebooks on the raw vectors (no residuals: the codes do not depend on the
    approximate coarse space, and a scanned list costs the same)."""
    faiss = _faiss()
    dim = sample.shape[1]
    if 0 < s.coarse_dim < dim:
        pca = faiss.PCAMatrix(dim, s.coarse_dim)
        pca.train(sample)
        xs = pca.apply(sample)
    else:
        pca, xs = None, sample
    km = faiss.Kmeans(xs.shape[1], s.nlist, niter=s.kmeans_iters, seed=s.seed,
                      max_points_per_centroid=max(40, len(xs) // max(s.nlist, 1) + 1))
    km.train(xs)
    flat = faiss.IndexFlatL2(xs.shape[1])
    flat.add(km.centroids)
    quantizer = faiss.IndexPreTransform(pca, flat) if pca is not None else flat
    mt = faiss.METRIC_INNER_PRODUCT
    if s.kind == "ivf_sq8":
        index = faiss.IndexIVFScalarQuantizer(quantizer, dim, s.nlist, faiss.ScalarQuantizer.QT_8bit, mt, False)
    elif s.kind in RERANK_KINDS:
        index = faiss.IndexIVFPQFastScan(quantizer, dim, s.nlist, fs_m(dim), 4, mt)
    else:
        index = faiss.IndexIVFPQ(quantizer, dim, s.nlist, pq_m(dim), 8, mt)
    index.by_residual = False
    index.own_fields = True
    quantizer.this.disown()
    if pca is not None:
        flat.this.disown()
        quantizer.own_fields = True
        pca.this.disown()
    if s.kind in RERANK_KINDS:  # dim/4 tiny k-means (16 centroids in 4-d): OpenMP barriers dominate
        with faiss_threads(1):  # 1.9 s on 1 thread, 132 s on 2 busy cores (10k x 768 sample)
            index.train(sample)
    else:
        index.train(sample)  # the quantizer already holds nlist centroids: only the codes train
    return index


@contextmanager
def faiss_threads(n: int):
    """FAISS's OpenMP thread count set to ``n`` for a block, restored after."""
    faiss = _faiss()
    saved = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(n)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(saved)


def check_kind(kind: str) -> None:
    if kind in STREAM_KINDS:
        return
    why = NOT_STREAMABLE.get(kind)
    raise ConversionError(f"index type {kind!r} cannot be built by streaming"
                       + (f": {why}" if why else "")
                       + f"; choose one of {', '.join(STREAM_KINDS)}")


def code_bytes(kind: str, dim: int) -> int:
    """Bytes of one list entry's code (fast-scan: two 4-bit codes per byte)."""
    if kind in RERANK_KINDS:
        return (fs_m(dim) + 1) // 2
    return dim if kind == "ivf_sq8" else pq_m(dim)


def rerank_bytes(kind: str, dim: int) -> int:
    """Bytes per row of the SQ8 re-rank file (0 for kinds without one)."""
    return dim if kind in RERANK_KINDS else 0


def estimate_block_bytes(kind: str, dim: int, ntotal: int) -> int:
    """The blocks (list codes + 8-byte ids) the add phase writes before the merge."""
    return ntotal * (code_bytes(kind, dim) + 8)


def estimate_output_bytes(kind: str, dim: int, ntotal: int) -> int:
    """The merged lists (codes + 8-byte ids), centroids and any re-rank codes: the folder's index files."""
    return (estimate_block_bytes(kind, dim, ntotal) + ntotal * rerank_bytes(kind, dim)
            + 4 * dim * default_nlist(ntotal) * 2 + (1 << 20))


def _faiss():
    import faiss

    return faiss


def _write_atomic(index, path: Path) -> None:
    tmp = path.with_name(path.name + ".part")
    _faiss().write_index(index, str(tmp))
    tmp.replace(path)


def peak_rss_mb() -> float:
    """The process's peak resident set so far (VmHWM, MB; -1 where /proc is absent): logged after
    each phase so a conversion shows which phase set its peak (the RSS <= 8 GB budget)."""
    return round(proc_status_mb({"VmHWM:": "vmhwm_mb"}).get("vmhwm_mb", -1.0), 1)


def _sample(source: VectorSource, n: int, windows: int = SAMPLE_WINDOWS) -> np.ndarray:
    """``n`` rows from ``windows`` evenly spaced contiguous windows (sequential reads)."""
    windows = max(1, min(windows, n))
    per = math.ceil(n / windows)
    starts = np.linspace(0, max(source.ntotal - per, 0), windows).astype(np.int64)
    parts = [source.read(int(s), int(min(s + per, source.ntotal))) for s in starts]
    return np.ascontiguousarray(np.concatenate(parts)[:n], dtype=np.float32)


class StreamingIVFBuilder:
    """Build ``out/index.faiss`` + ``out/index.ivfdata`` from ``source``; see the module doc."""

    def __init__(self, source: VectorSource, out_dir: str | Path, settings: StreamSettings = StreamSettings(),
                 *, progress: bool = True) -> None:
        check_kind(settings.kind)
        if settings.chunk_rows <= 0:
            raise ConversionError(f"--chunk-rows must be positive, got {settings.chunk_rows}")
        self.source, self.out = source, Path(out_dir)
        self.settings = settings.resolved(source.ntotal)
        self.work = self.out / WORK_DIR
        self.progress = progress
        self.n_chunks = math.ceil(source.ntotal / self.settings.chunk_rows)
        self.timings: dict[str, float] = {}

    # -- state ---------------------------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        return {"source": self.source.identity(), "settings": asdict(self.settings),
                "factory": self.settings.factory(self.source.dim)}

    def _check_state(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        f, state = self.work / STATE_FILE, self._state()
        if f.exists():
            old = json.loads(f.read_text())
            diff = [k for k in state if old.get(k) != state[k]]
            if diff:
                raise ConversionError(
                    f"{self.work} holds an unfinished conversion with different {', '.join(diff)} "
                    f"({'; '.join(f'{k}: {old.get(k)} != {state[k]}' for k in diff)}); "
                    "pass --overwrite to discard it, or another --out")
        else:
            tmp = f.with_name(f.name + ".part")
            tmp.write_text(json.dumps(state, indent=1))
            tmp.replace(f)

    def _block(self, i: int) -> Path:
        return self.work / f"block_{i:05d}.index"

    def done_chunks(self) -> list[int]:
        if self.settings.kind in RERANK_KINDS:
            return list(range(math.ceil(self._live_rows() / self.settings.chunk_rows)))
        return [i for i in range(self.n_chunks) if self._block(i).exists()]

    # -- phases --------------------------------------------------------------------------------
    def train(self):
        faiss = _faiss()
        path = self.work / TRAINED_FILE
        if path.exists():
            return faiss.read_index(str(path))
        t0 = time.perf_counter()
        s = self.settings
        sample = _sample(self.source, s.train_rows)
        log.info("training %s on %d sampled rows", s.factory(self.source.dim), len(sample))
        index = make_trained(sample, s)
        if s.kind in RERANK_KINDS:  # before trained.index: a restart that finds it finds this too
            _write_atomic(train_rerank_quantizer(sample), self.work / RERANK_SQ_FILE)
        _write_atomic(index, path)
        self.timings["train_s"] = time.perf_counter() - t0
        return index

    def add(self, trained, on_chunk: Callable[[int, np.ndarray], None] | None = None) -> None:
        faiss = _faiss()
        s, n = self.settings, self.source.ntotal
        if s.kind in RERANK_KINDS:
            self._add_in_ram(trained, on_chunk)
            return
        done = set(self.done_chunks())
        t0 = time.perf_counter()
        with tqdm(total=n, initial=min(n, sum(min(s.chunk_rows, n - i * s.chunk_rows) for i in done)),
                  desc="import: assign + encode", unit="vec", unit_scale=True, disable=not self.progress,
                  mininterval=5.0, smoothing=0.1) as bar:
            for i in range(self.n_chunks):
                if i in done:
                    continue
                start, stop = i * s.chunk_rows, min(n, (i + 1) * s.chunk_rows)
                x = self.source.read(start, stop)
                if on_chunk is not None:
                    on_chunk(start, x)
                block = faiss.clone_index(trained)
                block.add_with_ids(x, np.arange(start, stop, dtype=np.int64))
                _write_atomic(block, self._block(i))
                del block, x
                bar.update(stop - start)
        self.timings["add_s"] = time.perf_counter() - t0

    def _live_path(self) -> Path:
        return self.work / LIVE_FILE

    def _live_rows(self) -> int:
        """Rows the fast-scan checkpoint holds (0 without one): read from its header alone."""
        if not self._live_path().exists():
            return 0
        return int(_faiss().read_index(str(self._live_path()), _faiss().IO_FLAG_SKIP_IVF_DATA).ntotal)

    def _add_in_ram(self, trained, on_chunk: Callable[[int, np.ndarray], None] | None) -> None:
        """Fast-scan kinds: every chunk is added to one in-RAM index, checkpointed to
        ``live.index`` every :data:`CHECKPOINT_ROWS` rows and at the end; a restart continues
        after the checkpoint. Not blocks merged later: FAISS's ``merge_from`` on fast-scan IVF
        indexes corrupts the heap (faiss 1.15.1: "corrupted double-linked list" after ~16 of
        81 blocks at 21M rows; ``double free`` with 40 blocks of 3,000 rows), while adding to
        one index is the path FAISS itself uses. Each chunk's SQ8 re-rank codes are written at
        its row offset first, so every row a checkpoint holds has its codes on disk."""
        faiss = _faiss()
        s, n = self.settings, self.source.ntotal
        done = self._live_rows()
        if done % s.chunk_rows and done != n:
            raise ConversionError(f"{self._live_path()} holds {done} rows, not a whole number of "
                                  f"{s.chunk_rows}-row chunks; pass --overwrite")
        live = faiss.read_index(str(self._live_path())) if done else faiss.clone_index(trained)
        rerank = _RerankWriter(self.work, n, self.source.dim)
        t0, since = time.perf_counter(), 0
        try:
            with tqdm(total=n, initial=done, desc="import: assign + encode", unit="vec", unit_scale=True,
                      disable=not self.progress, mininterval=5.0, smoothing=0.1) as bar:
                for start in range(done, n, s.chunk_rows):
                    stop = min(n, start + s.chunk_rows)
                    x = self.source.read(start, stop)
                    if on_chunk is not None:
                        on_chunk(start, x)
                    rerank.write(start, x)
                    live.add_with_ids(x, np.arange(start, stop, dtype=np.int64))
                    since += stop - start
                    if since >= CHECKPOINT_ROWS or stop == n:
                        rerank.flush()  # the codes of every row the checkpoint holds are on disk first
                        _write_atomic(live, self._live_path())
                        since = 0
                    del x
                    bar.update(stop - start)
        finally:
            rerank.close()
        self.timings["add_s"] = time.perf_counter() - t0

    def merge(self, trained) -> None:
        """Every block's lists → ``index.ivfdata`` (one file, list by list), then ``index.faiss``.

        :mod:`retriever_server.ivf_ondisk` writes the file with pread/pwrite, one block in RAM at a
        time: FAISS's own ``merge_from_multiple`` maps the output and the blocks, so every page it
        touches counted in the process's RSS (16 GB VmHWM at 21M rows). Both land under
        ``.import/`` first and are renamed into place only when complete (data file first, so
        ``index.faiss`` never names a missing or partial one)."""
        faiss = _faiss()
        t0 = time.perf_counter()
        if self.settings.kind in RERANK_KINDS:
            self._finish_in_ram()
            self.timings["merge_s"] = time.perf_counter() - t0
            return
        ivfdata_tmp = self.work / IVFDATA_FILE
        ivfdata_tmp.unlink(missing_ok=True)
        blocks = [block_lists(self._block(i)) for i in range(self.n_chunks)]
        ivf_t = faiss.extract_index_ivf(trained)
        if blocks and (len(blocks[0].sizes) != ivf_t.nlist or blocks[0].code_size != ivf_t.code_size):
            raise ConversionError(f"blocks hold {len(blocks[0].sizes)} lists of {blocks[0].code_size} B, "
                                  f"the trained index {ivf_t.nlist} of {ivf_t.code_size} B")
        with tqdm(total=len(blocks), desc="import: merge lists", unit="block", disable=not self.progress,
                  mininterval=5.0) as bar:
            sizes = write_merged_lists(blocks, ivfdata_tmp, on_block=lambda i: bar.update(1))
        ntotal = int(sizes.sum())
        if ntotal != self.source.ntotal:
            raise ConversionError(f"merged {ntotal} vectors, expected {self.source.ntotal}")
        index = faiss.clone_index(trained)
        ivf = faiss.extract_index_ivf(index)
        # the name of where the file will be after the rename; the server reads it with
        # IO_FLAG_ONDISK_SAME_DIR, so only the file name matters and the folder can move
        invlists = ondisk_invlists(ivf.nlist, ivf.code_size, str((self.out / IVFDATA_FILE).resolve()), sizes)
        ivf.replace_invlists(invlists, True)
        invlists.this.disown()
        index.ntotal = ivf.ntotal = ntotal
        index_tmp = self.work / "index.faiss"
        _write_atomic(index, index_tmp)
        del index
        ivfdata_tmp.replace(self.out / IVFDATA_FILE)
        index_tmp.replace(self.out / "index.faiss")
        self.timings["merge_s"] = time.perf_counter() - t0

    def _finish_in_ram(self) -> None:
        """The fast-scan checkpoint holding every row becomes ``index.faiss``: the re-rank files
        are renamed into place first and the index last (its presence means the rest is there)."""
        rows = self._live_rows()
        if rows != self.source.ntotal:
            raise ConversionError(f"{self._live_path()} holds {rows} vectors, expected {self.source.ntotal}")
        for name in (RERANK_SQ_FILE, RERANK_CODES_FILE):
            (self.work / name).replace(self.out / name)
        self._live_path().replace(self.out / "index.faiss")

    def build(self, on_chunk: Callable[[int, np.ndarray], None] | None = None) -> dict[str, Any]:
        """All phases (resuming what is on disk); returns the settings and per-phase seconds."""
        self.out.mkdir(parents=True, exist_ok=True)
        self._check_state()
        trained = self.train()
        self.timings["vmhwm_after_train_mb"] = peak_rss_mb()
        self.add(trained, on_chunk)
        self.timings["vmhwm_after_add_mb"] = peak_rss_mb()
        self.merge(trained)
        self.timings["vmhwm_after_merge_mb"] = peak_rss_mb()
        shutil.rmtree(self.work, ignore_errors=True)
        return {"factory": self.settings.factory(self.source.dim), **asdict(self.settings), **self.timings}


class _RerankWriter:
    """The SQ8 re-rank codes, written by row offset into one preallocated file (a resumed chunk
    rewrites the same bytes) and flushed to disk before each checkpoint of the index."""

    def __init__(self, work: Path, ntotal: int, dim: int) -> None:
        self.sq = _faiss().read_index(str(work / RERANK_SQ_FILE))
        self.code_size = int(self.sq.sq.code_size)
        self.fd = os.open(work / RERANK_CODES_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        if os.fstat(self.fd).st_size != ntotal * self.code_size:
            os.ftruncate(self.fd, ntotal * self.code_size)

    def write(self, start: int, x: np.ndarray) -> None:
        data = memoryview(encode_rerank(self.sq, x)).cast("B")
        off, pos = start * self.code_size, 0
        while pos < len(data):
            pos += os.pwrite(self.fd, data[pos:], off + pos)

    def flush(self) -> None:
        os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)


def discard_unfinished(out_dir: str | Path) -> None:
    shutil.rmtree(Path(out_dir) / WORK_DIR, ignore_errors=True)
