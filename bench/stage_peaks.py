"""CPU cost of the demo's memory sampler (``openrlhf_sgrpo.demo.memory.StagePeaks``), one run.

    .venv/bin/python bench/stage_peaks.py [--threads 60] [--child-threads 40] [--seconds 5]

The sampler reads RSS every 20 ms; finding the processes to read (this one's descendants: the
vLLM engine core, the sandbox) takes a walk over every thread's ``/proc/<pid>/task/<tid>/children``
list. With the walk at every sample (``tree_every=1``, as before 2026-11-28) against every 25th
sample (the default), this prints the sampler's CPU seconds per wall second (the share of a core it
takes from a demo that runs on 2) and their ratio. The process holds ``--threads`` idle threads
and one child with ``--child-threads`` (a demo with its engine has ~100 in all); the main thread
sleeps, so the process's CPU time is the sampler's.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openrlhf_sgrpo.demo.memory import TREE_EVERY, StagePeaks  # noqa: E402


def sampler_cpu_share(tree_every: int, seconds: float) -> float:
    peaks = StagePeaks(tree_every=tree_every)
    peaks.begin("bench")
    start = time.process_time()
    time.sleep(seconds)
    used = time.process_time() - start
    peaks.close()
    return used / seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=60)
    p.add_argument("--child-threads", type=int, default=40)
    p.add_argument("--seconds", type=float, default=5.0)
    args = p.parse_args()
    idle = threading.Event()
    for _ in range(args.threads):
        threading.Thread(target=idle.wait, daemon=True).start()
    child = subprocess.Popen([sys.executable, "-c", "import sys, threading\n"
                              f"[threading.Thread(target=sys.stdin.read, daemon=True).start() "
                              f"for _ in range({args.child_threads})]\nsys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        time.sleep(1.0)
        every = sampler_cpu_share(1, args.seconds)
        default = sampler_cpu_share(TREE_EVERY, args.seconds)
    finally:
        child.kill()
        child.wait()
        idle.set()
    print(f"threads: {args.threads + 1} here, {args.child_threads} in the child")
    print(f"sampler CPU per wall second, process tree walked at every sample: {every:.3f}")
    print(f"sampler CPU per wall second, walked every {TREE_EVERY}th sample (default): {default:.3f}")
    print(f"ratio: {every / max(default, 1e-9):.1f}x less CPU with the default")


if __name__ == "__main__":
    main()
