"""Head-of-line blocking: how long a one-query request waits while huge requests are searched.

    python bench/retriever_hol.py [--huge 3] [--huge-queries 256] [--query-kb 30]

Starts ``python -m retriever_server.serve`` twice over the same MiniLM index (query cache off):

* ``one-forward``: ``--max-batch 4096`` and no token budget, so each huge request is one encoder
  forward, the way the batcher worked before fair micro-batches (the baseline);
* ``micro-batches``: the defaults, ``--max-batch 64 --max-batch-tokens 4096``, requests
  interleaved round-robin.

For each: the one-query latency on the idle server, the time of one huge request alone, then
``--huge`` huge requests at once with one-query requests sent one after another while they run.
Prints the small requests' latency under load and its ratio to the idle latency.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import requests
from retriever_qps import add_index_args, index_from_args

from retriever_server.background import ServerProcess

MODES = {"one-forward": ("--max-batch", "4096", "--max-batch-tokens", str(1 << 30)), "micro-batches": ()}


def post(url: str, queries: list[str]) -> float:
    t = time.perf_counter()
    r = requests.post(url + "/retrieve", json={"queries": queries, "topk": 3}, timeout=1800)
    r.raise_for_status()
    return time.perf_counter() - t


def measure(url: str, huge: list[list[str]], small: list[str]) -> dict[str, float]:
    idle = [post(url, [q]) for q in small[:5]]
    alone = post(url, huge[0])
    running = [threading.Thread(target=post, args=(url, h)) for h in huge]
    for t in running:
        t.start()
    time.sleep(min(1.0, alone / 4))  # the huge requests are being searched
    loaded, i = [], 5
    while any(t.is_alive() for t in running) and i < len(small):
        loaded.append(post(url, [small[i]]))
        i += 1
    for t in running:
        t.join()
    return {"idle_ms": statistics.median(idle) * 1000, "huge_alone_s": alone,
            "loaded_p50_ms": statistics.median(loaded) * 1000, "loaded_max_ms": max(loaded) * 1000,
            "n_loaded": len(loaded)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--huge", type=int, default=3, help="huge requests in flight at once")
    p.add_argument("--huge-queries", type=int, default=256)
    p.add_argument("--query-kb", type=float, default=30.0)
    add_index_args(p, passages=1000)
    a = p.parse_args()
    index, titles = index_from_args(a)
    text = " ".join(titles)
    text = (text * (int(a.query_kb * 1024) // len(text) + 1))[:int(a.query_kb * 1024)]
    rows = {}
    for mode, flags in MODES.items():  # one server at a time: the huge requests use both cores
        with ServerProcess("--index", str(index), "--cache-size", "0", *flags) as srv:
            huge = [[f"{mode} {h} {i} {text}" for i in range(a.huge_queries)] for h in range(a.huge)]
            small = [f"{mode} what is {t}?" for t in titles[:500]]
            rows[mode] = r = measure(srv.url, huge, small)
        print(f"{mode:13s} huge request alone {r['huge_alone_s']:6.1f}s | one-query idle {r['idle_ms']:6.0f}ms | "
              f"under {a.huge} huge: p50 {r['loaded_p50_ms']:7.0f}ms max {r['loaded_max_ms']:7.0f}ms "
              f"({r['n_loaded']} sent) | p50 ratio loaded/idle {r['loaded_p50_ms'] / r['idle_ms']:.1f}x", flush=True)
    base, new = rows["one-forward"], rows["micro-batches"]
    print(f"one-query p50 under load, micro-batches/one-forward: {new['loaded_p50_ms'] / base['loaded_p50_ms']:.2f}; "
          f"max: {new['loaded_max_ms'] / base['loaded_max_ms']:.2f}; "
          f"huge request alone: {new['huge_alone_s'] / base['huge_alone_s']:.2f}x")


if __name__ == "__main__":
    main()
