"""How many codes must an IVF index scan per query for recall@3 >= 0.95 on the hard synthetic set,
and what does that cost at 64 clients: the index design question of issue #49, item 3.

    python bench/retriever_index_design.py --flat /tmp/r49/rows2000000-hard/e5_Flat.index \\
        --subsets 500000 1000000 2000000 --nlists 1024 4096 16384 --coarse 0 128

(``--flat`` is the ``e5_Flat.index`` that ``bench/retriever_scale.py --distribution hard --keep``
writes; without it ``--rows`` hard rows are generated, which is slower.)

Three parts, each printed as a table:

1. **Lists** (no codes involved). For every prefix of ``--subsets`` rows, coarse space (0: the
   full vectors; 128: PCA-128, the streamed builder's default) and ``--nlists``: k-means as the
   builder trains it (40 x nlist sampled rows, 10 iterations), the lists of each query's exact
   top-3 and the rank of every list for each query. Recall@3 at nprobe p, with exact distances
   inside the probed lists, is the share of top-3 rows whose list is among the query's first p;
   the codes a query scans there is the sum of those p lists' sizes (sizes from assigning
   ``--size-sample`` evenly spread rows, scaled to the subset). The table gives the smallest
   nprobe reaching ``--target`` and the codes scanned there (and as a share of the rows): what
   any code (SQ8, PQ) must scan at best; SQ8's rounding needs a little more. Assignment rate
   (rows/s, flat quantizer, 2 threads) extrapolates a 21M conversion's assignment phase.
2. **Per-code scan cost** of each code kind on this machine (search of 64-query batches over a
   flat index of ``--scan-rows`` rows): SQ8 (768 B) and PQ fast-scan 4-bit. With part 1
   it predicts search-only QPS: 2 threads / (codes x seconds per code).
3. **Real indexes** on the largest subset at ``--real-nlist`` lists (full-d, flat quantizer):
   IVF-SQ8 (the served kind) and IVF-PQ fast-scan (``--fs-m`` sub-quantizers, 4 bit) whose
   shortlist of 3 x ``--k-factor`` is re-ranked by SQ8 codes: recall@3 and ms per query in
   batches of 64 over nprobe; bytes per row for each.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from retriever_server.calibrate import ExactTopK  # noqa: E402
from retriever_server.flat_file import open_flat_ip  # noqa: E402
from retriever_server.synthetic import SyntheticSpec, SyntheticVectors  # noqa: E402

CHUNK = 131_072


def load_avg() -> str:
    return " ".join(f"{v:.1f}" for v in os.getloadavg())


def exact_top3(src, n: int, q: np.ndarray, k: int = 3, cache: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The exact top-k ids of ``q`` among the first ``n`` rows (calibrate.ExactTopK, the importer's
    own), and those rows' vectors."""
    f = Path(cache) / f"exact_{n}_{len(q)}_{k}.npz" if cache else None
    if f is not None and f.exists():
        z = np.load(f)
        return z["ids"], z["x"]
    top = ExactTopK(q, k)
    for s in range(0, n, CHUNK):
        top.add(s, src.read(s, min(n, s + CHUNK)))
    rows = {int(i): src.read(int(i), int(i) + 1)[0] for i in np.unique(top.ids)}
    best_x = np.stack([[rows[int(i)] for i in ids] for ids in top.ids]).astype(np.float32)
    if f is not None:
        np.savez(f, ids=top.ids, x=best_x)
    return top.ids, best_x


def sample_rows(src, n: int, m: int, windows: int = 64) -> np.ndarray:
    per = -(-m // windows)
    starts = np.linspace(0, max(n - per, 0), windows).astype(np.int64)
    return np.ascontiguousarray(np.concatenate([src.read(int(s), int(min(s + per, n))) for s in starts])[:m])


def lists_table(src, q: np.ndarray, subsets: list[int], nlists: list[int], coarses: list[int],
                size_sample: int, target: float, log: list[dict], cache: str | None = None) -> None:
    import faiss

    print(f"\n## 1. lists: nprobe and codes scanned per query for recall@3 >= {target} "
          "(exact distances in the probed lists)", flush=True)
    print(f"{'rows':>9s} {'coarse':>6s} {'nlist':>6s} {'nprobe':>6s} {'share':>6s} {'codes/q':>9s} "
          f"{'of rows':>7s} {'r@3 ideal':>9s} {'kmeans s':>8s} {'assign/s':>9s} {'load':>14s}", flush=True)
    for n in subsets:
        _, true_x = exact_top3(src, n, q, cache=cache)
        true_x = np.ascontiguousarray(true_x.reshape(-1, src.dim))
        train_all = sample_rows(src, n, min(n, 40 * max(nlists)))
        size_x = sample_rows(src, n, min(n, size_sample))
        for coarse in coarses:
            if coarse:
                pca = faiss.PCAMatrix(src.dim, coarse)
                pca.train(train_all[:max(50_000, 40 * min(nlists))])
                tf = pca.apply
            else:
                def tf(a):
                    return a
            for nlist in nlists:
                if 40 * nlist > n:
                    continue
                t = time.perf_counter()
                xs = tf(train_all[:40 * nlist])
                km = faiss.Kmeans(xs.shape[1], nlist, niter=10, seed=0, max_points_per_centroid=41)
                km.train(xs)
                km_s = time.perf_counter() - t
                quant = faiss.IndexFlatL2(xs.shape[1])
                quant.add(km.centroids)
                t = time.perf_counter()
                _, lab = quant.search(tf(size_x), 1)
                assign_rate = len(size_x) / (time.perf_counter() - t)
                sizes = np.bincount(lab[:, 0], minlength=nlist) * (n / len(size_x))
                _, order = quant.search(tf(q), nlist)  # every list, nearest first, per query
                _, tl = quant.search(tf(true_x), 1)
                tl = tl[:, 0].reshape(len(q), 3)
                rank = np.empty_like(order)
                rows = np.arange(len(q))[:, None]
                rank[rows, order] = np.arange(nlist)[None, :]
                need = np.take_along_axis(rank, tl, 1)  # the rank of each true row's list, per query
                # recall at nprobe p is the share of true rows whose list ranks below p: its
                # cumulative count over the ranks; the smallest p reaching the target (p = nlist gives 1)
                curve = np.cumsum(np.bincount(need.ravel(), minlength=nlist)) / need.size
                p = int(np.argmax(curve >= target)) + 1
                rec = float(curve[p - 1])
                codes = float(np.mean(sizes[order[:, :p]].sum(1)))
                row = {"rows": n, "coarse": coarse, "nlist": nlist, "nprobe": p, "share_lists": p / nlist,
                       "codes_per_query": codes, "share_rows": codes / n, "recall_ideal": rec,
                       "kmeans_s": km_s, "assign_rows_per_s": assign_rate, "load": load_avg()}
                log.append(row)
                print(f"{n:9d} {coarse or 768:6d} {nlist:6d} {p:6d} {p / nlist:6.1%} {codes:9.0f} "
                      f"{codes / n:7.1%} {rec:9.3f} {km_s:8.1f} {assign_rate:9.0f} {load_avg():>14s}", flush=True)


def scan_costs(src, q: np.ndarray, rows: int, fs_m: int, log: list[dict]) -> dict[str, float]:
    import faiss

    x = sample_rows(src, src.ntotal, rows)
    qb = np.ascontiguousarray(np.resize(q, (64, q.shape[1])))
    d = x.shape[1]
    kinds = {
        "SQ8": faiss.IndexScalarQuantizer(d, faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT),
        f"PQ{fs_m}x4fs": faiss.IndexPQFastScan(d, fs_m, 4, faiss.METRIC_INNER_PRODUCT),
    }
    out = {}
    print(f"\n## 2. scan cost per code ({rows:,} codes, batches of 64 queries, "
          f"{faiss.omp_get_max_threads()} threads)", flush=True)
    for name, idx in kinds.items():
        idx.train(x[:50_000])
        idx.add(x)
        idx.search(qb[:8], 3)
        reps, t = 0, time.perf_counter()
        while time.perf_counter() - t < 3.0:
            idx.search(qb, 3)
            reps += 1
        sec = (time.perf_counter() - t) / (reps * len(qb) * rows)  # wall seconds per code per query
        out[name] = sec
        log.append({"scan": name, "ns_per_code_wall": sec * 1e9, "load": load_avg()})
        print(f"{name:12s} {sec * 1e9:7.2f} ns per code (wall, all threads) -> "
              f"{1 / (sec * 1e6):7.1f} QPS per 1M codes scanned   load {load_avg()}", flush=True)
    return out


def real_indexes(src, q: np.ndarray, n: int, nlist: int, fs_m: int, k_factors: list[int],
                 nprobes: list[int], log: list[dict], cache: str | None = None) -> None:
    import faiss

    d = src.dim
    ex, _ = exact_top3(src, n, q, cache=cache)
    train = sample_rows(src, n, min(n, 40 * nlist))
    km = faiss.Kmeans(d, nlist, niter=10, seed=0, max_points_per_centroid=41)
    km.train(train)
    mt = faiss.METRIC_INNER_PRODUCT

    def quantizer():
        qz = faiss.IndexFlatL2(d)
        qz.add(km.centroids)
        return qz

    sq = faiss.IndexIVFScalarQuantizer(quantizer(), d, nlist, faiss.ScalarQuantizer.QT_8bit, mt, False)
    fs = faiss.IndexIVFPQFastScan(quantizer(), d, nlist, fs_m, 4, mt)
    fs.by_residual = False
    refine = faiss.IndexScalarQuantizer(d, faiss.ScalarQuantizer.QT_8bit, mt)
    for idx in (sq, fs, refine):
        idx.train(train)
    t = time.perf_counter()
    for s in range(0, n, CHUNK):
        x = src.read(s, min(n, s + CHUNK))
        sq.add(x)
        fs.add(x)
        refine.add(x)
    print(f"\n## 3. real indexes, {n:,} rows, {nlist} lists (full-d), add {time.perf_counter() - t:.0f} s, "
          f"load {load_avg()}", flush=True)
    print(f"{'index':34s} {'B/row':>5s} {'nprobe':>6s} {'recall@3':>8s} {'ms/q':>7s} {'QPS':>6s}", flush=True)

    def run(idx, name, bpr):
        for npb in nprobes:
            if npb > nlist:
                continue
            faiss.extract_index_ivf(idx).nprobe = npb
            idx.search(q[:64], 3)
            t = time.perf_counter()
            ids = np.concatenate([idx.search(q[s:s + 64], 3)[1] for s in range(0, len(q), 64)])
            ms = (time.perf_counter() - t) * 1000 / len(q)
            rec = float(np.mean([len(set(a.tolist()) & set(b.tolist())) / 3 for a, b in zip(ids, ex)]))
            log.append({"index": name, "bytes_per_row": bpr, "rows": n, "nlist": nlist, "nprobe": npb,
                        "recall@3": rec, "ms_per_query": ms, "load": load_avg()})
            print(f"{name:34s} {bpr:5d} {npb:6d} {rec:8.3f} {ms:7.2f} {1000 / ms:6.1f}   load {load_avg()}",
                  flush=True)

    run(sq, f"IVF{nlist},SQ8", d + 8)
    for kf in k_factors:
        r = faiss.IndexRefine(fs, refine)
        r.k_factor = kf
        run(r, f"IVF{nlist},PQ{fs_m}x4fs + SQ8 rerank x{kf}", fs_m // 2 + 8 + d)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flat", default=None, help="an IndexFlatIP file of hard rows (bench/retriever_scale.py --keep)")
    p.add_argument("--rows", type=int, default=1_000_000, help="rows to generate when --flat is not given")
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--subsets", type=int, nargs="+", default=[])
    p.add_argument("--nlists", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--coarse", type=int, nargs="+", default=[0, 128])
    p.add_argument("--size-sample", type=int, default=500_000)
    p.add_argument("--target", type=float, default=0.95)
    p.add_argument("--scan-rows", type=int, default=200_000)
    p.add_argument("--fs-m", type=int, default=192, help="fast-scan PQ sub-quantizers (4 bit each)")
    p.add_argument("--real-nlist", type=int, default=0, help="part 3's lists (0: skip part 3)")
    p.add_argument("--k-factor", type=int, nargs="+", default=[10, 30])
    p.add_argument("--nprobe", type=int, nargs="+", default=[64, 128, 256, 512])
    p.add_argument("--parts", default="123")
    p.add_argument("--out", default=None, help="json log of every row")
    p.add_argument("--cache", default=None, help="folder for the exact top-3 of each subset (reused by reruns)")
    a = p.parse_args()
    gen = SyntheticVectors(SyntheticSpec(kind="hard"), a.rows)
    src = open_flat_ip(a.flat) if a.flat else gen
    q = np.stack([gen.query(f"held-out query {i}") for i in range(a.queries)]).astype(np.float32)
    print(f"{src.ntotal:,} rows x {src.dim} (hard set), {a.queries} held-out queries, load {load_avg()}", flush=True)
    log: list[dict] = []
    try:
        if "1" in a.parts:
            lists_table(src, q, a.subsets or [src.ntotal], a.nlists, a.coarse, a.size_sample, a.target, log, a.cache)
        if "2" in a.parts:
            scan_costs(src, q, a.scan_rows, a.fs_m, log)
        if "3" in a.parts and a.real_nlist:
            real_indexes(src, q, (a.subsets or [src.ntotal])[-1], a.real_nlist, a.fs_m, a.k_factor, a.nprobe, log, a.cache)
    finally:
        if a.out:
            Path(a.out).write_text(json.dumps(log, indent=1))


if __name__ == "__main__":
    main()
