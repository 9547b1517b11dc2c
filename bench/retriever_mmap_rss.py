"""Startup RSS of the retriever's index load with and without --mmap on a synthetic flat index.

    python bench/retriever_mmap_rss.py [--n 2000000] [--dim 384] [--no-baseline]

Writes an N × dim IndexFlatIP of random unit vectors (3 GB at the defaults) plus a docstore,
then loads index + docstore in fresh child processes exactly as the server does
(``read_index(mmap=...)`` + ``DocStore``) and prints the RSS each child grew by.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

CHILD = r"""
import json, sys, time
def rss_mb():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS:'):
            return int(line.split()[1]) / 1024
import faiss, numpy  # imports are not the index: measure after them
from retriever_server.faiss_index import read_index, FaissSearcher
from retriever_server.docstore import DocStore
before = rss_mb(); t = time.perf_counter()
index = read_index(sys.argv[1] + '/index.faiss', mmap=sys.argv[2] == '1')
docs = DocStore(sys.argv[1])
load_s = time.perf_counter() - t; after = rss_mb()
s, i = FaissSearcher(index).search(numpy.ones((1, index.d), 'float32'), 3)
print(json.dumps({'mmap': sys.argv[2] == '1', 'rss_before_mb': round(before), 'rss_after_mb': round(after),
                  'rss_growth_mb': round(after - before), 'load_s': round(load_s, 2), 'ntotal': index.ntotal,
                  'doc0': docs.get(int(i[0][0]))['id']}))
"""


def write_synthetic(out: Path, n: int, dim: int, chunk: int = 200_000) -> None:
    import faiss

    from retriever_server.docstore import write_docstore
    from retriever_server.faiss_index import write_index

    if (out / "index.faiss").exists():
        return
    out.mkdir(parents=True, exist_ok=True)
    index, rng = faiss.IndexFlatIP(dim), np.random.default_rng(0)
    for s in range(0, n, chunk):
        x = rng.standard_normal((min(chunk, n - s), dim), dtype=np.float32)
        index.add(x / np.linalg.norm(x, axis=1, keepdims=True))
    write_index(index, out / "index.faiss")
    write_docstore(({"id": str(i), "contents": f'"Doc {i}"\nsynthetic passage {i}'} for i in range(n)), out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=2_000_000)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "retriever_rss"))
    p.add_argument("--no-baseline", action="store_true", help="skip the non-mmap load (needs RAM = index)")
    a = p.parse_args()
    out = Path(a.work) / f"flat_{a.n}x{a.dim}"
    t = time.perf_counter()
    write_synthetic(out, a.n, a.dim)
    size_mb = (out / "index.faiss").stat().st_size / 2**20
    print(f"synthetic index {a.n} x {a.dim}: {size_mb:.0f} MB on disk (ready in {time.perf_counter() - t:.0f}s)")
    results = {}
    for mmap in ([True] if a.no_baseline else [True, False]):
        r = subprocess.run([sys.executable, "-c", CHILD, str(out), "1" if mmap else "0"],
                           capture_output=True, text=True, check=True)
        results[mmap] = json.loads(r.stdout.strip().splitlines()[-1])
        print(json.dumps(results[mmap]))
    m = results[True]["rss_growth_mb"]
    print(f"RSS growth with --mmap: {m} MB for a {size_mb:.0f} MB index ({m / size_mb:.1%} of its size)")
    if False in results:
        print(f"RSS growth without mmap: {results[False]['rss_growth_mb']} MB "
              f"(ratio {results[False]['rss_growth_mb'] / max(m, 1):.0f}x)")


if __name__ == "__main__":
    main()
