"""Retriever per study process, or one shared: what each costs, measured (docs/study.md).

The study runs several demo processes side by side; each starts its own retriever (in-process:
MiniLM and the index, served on loopback). A shared one would save its start-up and memory per
process but queue every process's searches on one server, and a crash would end every seed.
This measures both sides on the demo's own corpus:

1. start-up: wall seconds until ``local_services`` serves, and the process's RSS before and after;
2. latency: ``--queries`` searches from each of ``--clients`` threads at once against ONE server
   (the shared case) vs. from one thread (a process's own), median and p90 per search.

    python bench/study_retriever_share.py [--clients 3] [--queries 40] [--smoke]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def searches(url: str, queries: list[str], out: list[float]) -> None:
    import requests

    with requests.Session() as s:
        for q in queries:
            t = time.perf_counter()
            r = s.post(url, json={"queries": [q], "topk": 3}, timeout=60)
            r.raise_for_status()
            out.append(time.perf_counter() - t)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=3, help="processes that would share one retriever")
    p.add_argument("--queries", type=int, default=40, help="searches per client")
    p.add_argument("--smoke", action="store_true", help="the --smoke task's corpus (small) instead of the demo's")
    args = p.parse_args()
    from openrlhf_sgrpo.demo.options import parse_args
    from openrlhf_sgrpo.demo.questions import load_demo_data
    from openrlhf_sgrpo.local.services import cached_index_for, local_services

    demo = parse_args(["--smoke"] if args.smoke else [])
    data = load_demo_data(demo)
    index = cached_index_for(data.corpus)
    queries = [q.question for q in data.heldout] * (1 + args.queries // max(1, len(data.heldout)))
    before = rss_mib()
    t = time.perf_counter()
    with local_services(index, sandbox=False) as urls:
        start_s, after = time.perf_counter() - t, rss_mib()
        url = urls.retriever_url
        searches(url, queries[:5], [])  # warm connections
        alone: list[float] = []
        searches(url, queries[: args.queries], alone)
        shared: list[list[float]] = [[] for _ in range(args.clients)]
        threads = [threading.Thread(target=searches, args=(url, queries[: args.queries], shared[i]))
                   for i in range(args.clients)]
        t = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        shared_wall = time.perf_counter() - t
    flat = [v for vs in shared for v in vs]
    print(f"retriever start-up: {start_s:.1f} s; process RSS {before:,.0f} -> {after:,.0f} MiB "
          f"(+{after - before:,.0f} MiB per process that runs its own)")
    print(f"own retriever, 1 client: median {1e3 * statistics.median(alone):.1f} ms, p90 {1e3 * pct(alone, 0.9):.1f} ms")
    print(f"shared, {args.clients} clients at once: median {1e3 * statistics.median(flat):.1f} ms, "
          f"p90 {1e3 * pct(flat, 0.9):.1f} ms ({len(flat)} searches in {shared_wall:.1f} s)")


if __name__ == "__main__":
    main()
