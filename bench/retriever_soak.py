"""Retriever memory under a long soak: RSS at start, middle and end, with and without the fix.

    python bench/retriever_soak.py [--queries 20000] [--passages 1000]

Starts ``python -m retriever_server.serve`` three times over the same MiniLM index (real
Wikipedia lead extracts), the query cache off so every query reaches the encoder:

* ``glibc``: ``--malloc-trim-interval-s 0``, glibc's allocator as it comes (the baseline);
* ``fixed-threshold``: no trimming, glibc's mmap threshold fixed by ``MALLOC_MMAP_THRESHOLD_``
  (the other remedy we measured);
* ``trim``: the default, ``malloc_trim(0)`` after a forward at most once a second.

All get the same requests in lockstep (so the shared machine's load drifts hit each alike):
1–60 queries per request, 2–30 words per query, so nearly every encoder forward has a new shape.

The cause, measured: the RSS growth is memory glibc keeps after it was freed, not leaked memory.
glibc serves allocations above its mmap threshold with mmap and unmaps them on free, but raises
the threshold to every such block freed (up to 32 MB); soon every encoder activation comes from
the heap, and activations of ever different shapes leave holes glibc does not give back.
``/metrics`` → ``memory.heap_free_mb`` (``mallinfo2``) shows the free bytes kept inside the heap;
trimming returns their pages to the OS (they still count as free there, but no longer in RSS).
"""

from __future__ import annotations

import argparse
import random
import time
from contextlib import ExitStack

import requests
from retriever_qps import add_index_args, index_from_args

from retriever_server.background import ServerProcess

NO_TRIM = ("--malloc-trim-interval-s", "0")
MODES: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {  # flags, environment
    "glibc": (NO_TRIM, {}),
    "fixed-threshold": (NO_TRIM, {"MALLOC_MMAP_THRESHOLD_": str(128 << 10)}),
    "trim": ((), {}),
}


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def requests_for(titles: list[str], total: int, seed: int = 0) -> list[list[str]]:
    words = " ".join(titles).split()
    rng, out, n = random.Random(seed), [], 0
    while n < total:
        batch = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 30))) for _ in range(rng.randint(1, 60))]
        out.append(batch)
        n += len(batch)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--queries", type=int, default=6000, help="queries per server (the issue's soak: 20000)")
    add_index_args(p, passages=1000)
    a = p.parse_args()
    index, titles = index_from_args(a)
    plan = requests_for(titles, a.queries)
    common = ("--index", str(index), "--cache-size", "0", "--max-batch", "64")
    rss: dict[str, list[float]] = {m: [] for m in MODES}
    busy = {m: 0.0 for m in MODES}
    with ExitStack() as stack:
        servers = {m: stack.enter_context(ServerProcess(*common, *flags, env=env))
                   for m, (flags, env) in MODES.items()}
        for m, srv in servers.items():
            rss[m].append(rss_mb(srv.proc.pid))
        marks, done = {len(plan) // 2, len(plan) - 1}, 0
        for i, queries in enumerate(plan):
            rotation = i % len(servers)  # each server goes first equally often
            order = list(servers.items())[rotation:] + list(servers.items())[:rotation]
            for m, srv in order:
                t = time.perf_counter()
                r = requests.post(srv.url + "/retrieve", json={"queries": queries, "topk": 3}, timeout=600)
                busy[m] += time.perf_counter() - t
                r.raise_for_status()
            done += len(queries)
            if i in marks:
                for m, srv in servers.items():
                    rss[m].append(rss_mb(srv.proc.pid))
                print(f"{done:6d} queries: " + "  ".join(f"{m} {rss[m][-1]:5.0f} MB" for m in MODES), flush=True)
        heap = {m: requests.get(srv.url + "/metrics.json", timeout=30).json()["memory"] for m, srv in servers.items()}
    print(f"\n{a.queries} queries in {len(plan)} requests of 1-60 queries, per server")
    print("mode            | RSS start | RSS middle | RSS end | growth | heap free at end | search time")
    for m in MODES:
        start, middle, end = rss[m]
        print(f"{m:15s} | {start:7.0f}MB | {middle:8.0f}MB | {end:5.0f}MB | {end - start:+5.0f}MB | "
              f"{heap[m].get('heap_free_mb', float('nan')):13.0f}MB | {busy[m]:9.1f}s")
    base = rss["glibc"]
    for m in MODES:
        if m != "glibc":
            print(f"{m}: growth {(rss[m][2] - rss[m][0]) / max(base[2] - base[0], 1e-9):.2f} of glibc's, "
                  f"second half {rss[m][2] - rss[m][1]:+.0f} MB (glibc {base[2] - base[1]:+.0f} MB), "
                  f"search time {busy[m] / busy['glibc']:.2f}x glibc's")

if __name__ == "__main__":
    main()
