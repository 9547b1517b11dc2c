"""The conversion's merge phase: our pread/pwrite merge (retriever_server/ivf_ondisk.py) against
FAISS's own ``OnDiskInvertedLists.merge_from_multiple`` on the same blocks, in the same run.

    python bench/ivf_merge.py [--rows 1000000] [--dim 192] [--nlist 1024] [--chunk-rows 100000] [--repeats 2]

The streaming builder trains and adds once (the blocks on disk); then each merge runs ``--repeats``
times, alternating, into fresh folders: wall time and the process's peak RSS rise (VmHWM above
the RSS before it, ``/proc/self/clear_refs``). FAISS's merge maps its output and the blocks, so
its peak rises by about the bytes merged; ours holds one block. Prints one JSON line and the time
ratio ours / FAISS (the minimum of the repeats of each). The same blocks give the same bytes
(``tests/test_retriever_scale.py`` checks that, with this module's reference merge).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from retriever_server.ivf_stream import IVFDATA_FILE, StreamingIVFBuilder, StreamSettings
from retriever_server.native_heap import proc_status_mb


class RandomRows:
    """Cluster-free random unit rows, generated per read (no array of all rows in RAM)."""

    def __init__(self, ntotal: int, dim: int) -> None:
        self.ntotal, self.dim = ntotal, dim

    def identity(self) -> dict[str, object]:
        return {"source": "random", "ntotal": self.ntotal, "dim": self.dim}

    def read(self, start: int, stop: int) -> np.ndarray:
        x = np.random.default_rng(start).standard_normal((stop - start, self.dim)).astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)


def rss_rise_mb(fn) -> float:
    """How far the process's peak RSS (VmHWM, what the conversion's budget is about) rises above
    its RSS while ``fn`` runs; writing 5 to clear_refs resets the peak to the current RSS."""
    Path("/proc/self/clear_refs").write_text("5")
    before = proc_status_mb({"VmRSS:": "rss"})["rss"]
    fn()
    return proc_status_mb({"VmHWM:": "hwm"})["hwm"] - before


def faiss_merge(builder: StreamingIVFBuilder, trained, out: Path) -> None:
    """FAISS's own merge of the builder's blocks into ``out`` (what ivf_stream did before the
    pwrite merge): the reference for bytes, memory and time."""
    import faiss

    blocks = [faiss.read_index(str(builder._block(i)), faiss.IO_FLAG_MMAP) for i in range(builder.n_chunks)]
    vec = faiss.InvertedListsPtrVector()
    for b in blocks:
        vec.push_back(faiss.extract_index_ivf(b).invlists)
    index = faiss.clone_index(trained)
    ivf = faiss.extract_index_ivf(index)
    il = faiss.OnDiskInvertedLists(ivf.nlist, ivf.code_size, str(out / IVFDATA_FILE))
    index.ntotal = ivf.ntotal = il.merge_from_multiple(vec.data(), vec.size(), False, False)
    ivf.replace_invlists(il, True)
    il.this.disown()
    faiss.write_index(index, str(out / "index.faiss"))
    del index, blocks, vec


def built_blocks(rows: int, dim: int, nlist: int, chunk_rows: int, out: Path):
    """A builder whose blocks are on disk (trained, added, not merged) and its trained index."""
    settings = StreamSettings("ivf_sq8", nlist=nlist, chunk_rows=chunk_rows, coarse_dim=32, kmeans_iters=4)
    builder = StreamingIVFBuilder(RandomRows(rows, dim), out, settings, progress=False)
    out.mkdir(parents=True, exist_ok=True)
    builder._check_state()
    trained = builder.train()
    builder.add(trained)
    return builder, trained


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=192)
    p.add_argument("--nlist", type=int, default=1024)
    p.add_argument("--chunk-rows", type=int, default=100_000)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--dir", default=None, help="work folder (default: a temporary one; needs ~3x the lists' size)")
    a = p.parse_args()
    for name in ("rows", "dim", "nlist", "chunk_rows", "repeats"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    root = Path(a.dir or tempfile.mkdtemp(prefix="ivf-merge-"))
    try:
        t = time.perf_counter()
        builder, trained = built_blocks(a.rows, a.dim, a.nlist, a.chunk_rows, root / "ours")
        setup_s = time.perf_counter() - t
        times: dict[str, list[float]] = {"ours": [], "faiss": []}
        rises: dict[str, list[float]] = {"ours": [], "faiss": []}
        for r in range(a.repeats):
            for name in ("ours", "faiss"):
                ref = root / f"ref{r}"
                ref.mkdir(exist_ok=True)
                run = (lambda: builder.merge(trained)) if name == "ours" else (lambda: faiss_merge(builder, trained, ref))
                t = time.perf_counter()
                rises[name].append(rss_rise_mb(run))
                times[name].append(time.perf_counter() - t)
                shutil.rmtree(ref, ignore_errors=True)
        lists_mb = a.rows * (a.dim + 8) / 2**20  # SQ8: one byte per dimension + an int64 id
        print(json.dumps({"rows": a.rows, "dim": a.dim, "nlist": a.nlist, "blocks": builder.n_chunks,
                          "lists_mb": round(lists_mb, 1), "train_add_s": round(setup_s, 1),
                          "merge_s": {k: [round(x, 2) for x in v] for k, v in times.items()},
                          "peak_rss_rise_mb": {k: [round(x, 1) for x in v] for k, v in rises.items()}}))
        print(f"merge time ours / FAISS: {min(times['ours']) / min(times['faiss']):.2f}  "
              f"(peak RSS rise {max(rises['ours']):.0f} MB vs {max(rises['faiss']):.0f} MB, lists {lists_mb:.0f} MB)")
    finally:
        if a.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
