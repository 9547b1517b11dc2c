"""Which compressed index serves wiki-18 on a 24 GB, 2-core box: recall@3 vs exact inner product
and search time over nprobe (and the re-ranking depth for PQ), on the synthetic corpus.

    python bench/retriever_index_choice.py [--rows 200000] [--queries 300]

Candidates, all with the streamed builder's code (retriever_server/ivf_stream.make_trained):
IVF + SQ8 with the coarse lists chosen in the full 768-d space or in a 128-d PCA space (6x
cheaper assignment, the cost that dominates a 21M conversion), and IVF + PQ (dim/8 bytes per
vector) without and with re-ranking of its top ``k x refine`` by SQ8 codes. Search time is per
query in batches of 64 (as the server batches), encoder excluded, and the exact flat search over
the same rows is measured in the same run as the baseline (ratio column). Bytes/vector says what
21M rows cost on disk (the lists are memory-mapped: page cache, not private memory).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from retriever_server.ivf_stream import StreamSettings, default_nlist, make_trained, pq_m
from retriever_server.synthetic import SyntheticSpec, SyntheticVectors


def timed_search(index, q: np.ndarray, k: int) -> tuple[np.ndarray, float]:
    index.search(q[:64], k)
    t = time.perf_counter()
    ids = np.concatenate([index.search(q[s:s + 64], k)[1] for s in range(0, len(q), 64)])
    return ids, (time.perf_counter() - t) * 1000 / len(q)


def recall(ids: np.ndarray, exact: np.ndarray, k: int = 3) -> float:
    return float(np.mean([len(set(a[:k].tolist()) & set(b[:k].tolist())) / k for a, b in zip(ids, exact)]))


def main() -> None:
    import faiss

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--nprobe", type=int, nargs="+", default=[4, 8, 16, 32, 64])
    p.add_argument("--refine", type=int, nargs="+", default=[1, 4, 16])
    a = p.parse_args()
    vecs = SyntheticVectors(SyntheticSpec(), a.rows)
    x = vecs.read(0, a.rows)
    q = np.stack([vecs.query(f"held-out query {i}") for i in range(a.queries)])
    flat = faiss.IndexFlatIP(x.shape[1])
    flat.add(x)
    exact, exact_ms = timed_search(flat, q, 3)
    nlist = default_nlist(a.rows)
    sample = x[np.random.default_rng(0).choice(a.rows, min(a.rows, 40 * nlist), replace=False)]
    print(f"{a.rows:,} rows x {x.shape[1]}, {nlist} lists, {a.queries} held-out queries; "
          f"exact flat: {exact_ms:.2f} ms/query (baseline)")
    print(f"{'index':34s} {'B/vec':>6s} {'add/s':>8s} {'nprobe':>6s} {'refine':>6s} {'recall@3':>8s} "
          f"{'ms/q':>7s} {'vs exact':>8s}")
    sq_refine = None
    for kind, coarse in (("ivf_sq8", 0), ("ivf_sq8", 128), ("ivf_pq", 128)):
        s = StreamSettings(kind, nlist=nlist, coarse_dim=coarse)
        index = make_trained(sample, s)
        t = time.perf_counter()
        index.add(x)
        rate = a.rows / (time.perf_counter() - t)
        bpv = (x.shape[1] if kind == "ivf_sq8" else pq_m(x.shape[1])) + 8
        refines = [1]
        base = index
        if kind == "ivf_pq":
            if sq_refine is None:
                sq_refine = faiss.IndexScalarQuantizer(x.shape[1], faiss.ScalarQuantizer.QT_8bit,
                                                       faiss.METRIC_INNER_PRODUCT)
                sq_refine.train(sample)
                sq_refine.add(x)
            refines = a.refine
        for npb in a.nprobe:
            base.nprobe = npb
            for rf in refines:
                if rf > 1:
                    index = faiss.IndexRefine(base, sq_refine)
                    index.k_factor = rf
                else:
                    index = base
                ids, ms = timed_search(index, q, 3)
                name = f"{s.factory(x.shape[1])}" + ("+SQ8 rerank" if rf > 1 else "")
                print(f"{name:34s} {bpv + (x.shape[1] if rf > 1 else 0):6d} {rate:8.0f} {npb:6d} {rf:6d} "
                      f"{recall(ids, exact):8.3f} {ms:7.2f} {exact_ms / ms:7.1f}x", flush=True)


if __name__ == "__main__":
    main()
