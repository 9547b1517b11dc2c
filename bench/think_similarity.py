"""Think similarity: the agent's bit-parallel word edit distance vs the textbook table, same run.

The agent measures every search turn's ``<think>`` against each earlier search turn's (CalibAdv's
repeated-reasoning rule, ``agent_env.think``) inside the rollout's event loop, so its cost adds
to every turn. Baseline: the plain dynamic-programming table over words (what the measure was
first written as). Both run on the same random word lists and must give the same distances.

    .venv/bin/python bench/think_similarity.py [--words 30 80 200] [--pairs 200]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from agent_env.think import word_edit_distance


def table_distance(a: list[str], b: list[str]) -> int:
    """The O(len(a) * len(b)) baseline, one row of the table at a time."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, start=1):
        nxt = [i]
        for j, y in enumerate(b, start=1):
            nxt.append(min(row[j] + 1, nxt[j - 1] + 1, row[j - 1] + (x != y)))
        row = nxt
    return row[-1]


def timed(fn, pairs: list[tuple[list[str], list[str]]]) -> tuple[float, list[int]]:
    start = time.perf_counter()
    out = [fn(a, b) for a, b in pairs]
    return (time.perf_counter() - start) / len(pairs), out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--words", type=int, nargs="+", default=[30, 80, 200], help="words per think text")
    p.add_argument("--pairs", type=int, default=200, help="pairs timed per size")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    vocab = [f"w{i}" for i in range(200)]  # thinks reuse words, so distances are not all maximal
    print(f"{'words':>6} {'table ms':>10} {'bit-parallel ms':>16} {'speed-up':>9}")
    for n in args.words:
        pairs = [([rng.choice(vocab) for _ in range(n)], [rng.choice(vocab) for _ in range(n)])
                 for _ in range(args.pairs)]
        base, want = timed(table_distance, pairs)
        fast, got = timed(word_edit_distance, pairs)
        if got != want:
            print(f"MISMATCH at {n} words", file=sys.stderr)
            return 1
        print(f"{n:>6} {base * 1e3:>10.3f} {fast * 1e3:>16.3f} {base / fast:>8.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
