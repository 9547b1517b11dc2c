"""Peak memory and wall time per demo stage, printed with the demo's output.

A daemon thread samples this process *and its descendants* (the vLLM engine core runs in a
child process, the sandbox in others) and keeps the maximum of the current stage: the memory
the demo really holds, not only its Python process. Two sums, because processes share pages:
- RSS (``/proc/<pid>/statm``, every 20 ms) counts a shared page once *per process*: each of the
  demo and the engine maps ~0.3 GB of the same torch libraries, so the sum over-counts;
  which processes are the descendants is re-read every 0.5 s, not at every sample: one walk reads
  every thread's ``children`` list (~5 ms of CPU with ~100 threads, a quarter of a core at 50
  walks a second on the 2-core machines the demo runs on; ``bench/stage_peaks.py``);
- PSS (``/proc/<pid>/smaps_rollup``, every 0.5 s: the kernel walks the page tables to answer)
  splits a shared page between the processes mapping it, so the sum is what the machine holds
  (``smem``'s number). Sampled less often, its peak can miss a spike the RSS column sees.
A third column is the demo's own process alone (the trainer, the in-thread retriever), from the
same 20 ms samples: with it the table says where the memory sits, the rest being the engine's
and the sandbox's processes.
The kernel's own high-water mark (``VmHWM``, what ``/usr/bin/time -v`` reports) is process-wide
and cannot be split per stage without resetting it, which would falsify ``time -v``'s number,
so the process peak (``getrusage``) is printed beside the table. Without ``/proc`` (macOS) the
per-stage columns are the process peak so far.
"""

from __future__ import annotations

import os
import resource
import sys
import threading
import time
from pathlib import Path

from openrlhf_sgrpo.eval.table import format_table

_STATM = Path("/proc/self/statm")
_MB = 1 << 20
TREE_EVERY = 25  # RSS samples per walk of the process tree (0.5 s at 20 ms)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from the kernel's per-thread ``children`` lists). A process
    or thread that ends while it is read has no children: the sampler thread calls this while
    the run starts and reaps processes, and an exception here once ended that thread mid-run
    (``/proc/<pid>/task`` gone between the directory check and its listing)."""
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            threads = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in threads:
            try:
                kids = [int(k) for k in Path(f"/proc/{parent}/task/{tid}/children").read_text().split()]
            except (OSError, ValueError):
                continue
            out += kids
            todo += kids
    return out


def _rss_pages(pid: int | str) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return 0  # a process that just ended


def _pss_kib(pid: int | str) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0  # a process that just ended, or a kernel without smaps_rollup


def _tree(pid: int, include_self: bool = True) -> list[int]:
    return ([pid] if include_self else []) + descendants(pid)


def _pages_mb(pages: int) -> float:
    return pages * os.sysconf("SC_PAGE_SIZE") / _MB


def _pss_sum_mb(pids: list[int]) -> float:
    return sum(_pss_kib(p) for p in pids) / 1024


def tree_memory_mb(pid: int | None = None, include_self: bool = True) -> tuple[float, float]:
    """(RSS, PSS) in MiB summed over ``pid`` (default: this process) and all its descendants
    (only the descendants with ``include_self=False``: e.g. an engine's processes)."""
    pids = _tree(os.getpid() if pid is None else pid, include_self)
    return _pages_mb(sum(_rss_pages(p) for p in pids)), _pss_sum_mb(pids)


def _sample_mb(with_pss: bool, kids: list[int]) -> tuple[float, float, float]:
    """(RSS of this process and its descendants, RSS of this process alone, their PSS or 0) in
    MiB: the 20 ms samples, PSS only when asked. ``kids``: the descendants at the last walk (one
    that has ended since reads 0)."""
    own = os.getpid()
    own_pages = _rss_pages(own)
    tree_pages = own_pages + sum(_rss_pages(p) for p in kids)
    pss = _pss_sum_mb([own, *kids]) if with_pss else 0.0
    return _pages_mb(tree_pages), _pages_mb(own_pages), pss


def process_peak_mb() -> float:
    """This process's peak RSS so far (getrusage: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (_MB if sys.platform == "darwin" else 1024)


class StagePeaks:
    """``begin(name)`` closes the previous stage and opens the next; ``close()`` ends the last."""

    PSS_EVERY = 25  # RSS samples per PSS sample (smaps_rollup costs a page-table walk)

    def __init__(self, interval_s: float = 0.02, tree_every: int = TREE_EVERY):
        # (stage, wall s, peak RSS MiB, peak PSS MiB, peak RSS MiB of this process alone)
        self.rows: list[tuple[str, float, float, float, float]] = []
        self._name: str | None = None
        self._start = 0.0
        self._peak = 0.0
        self._pss_peak = 0.0
        self._own_peak = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        self._kids: list[int] | None = None  # the descendants at the last walk
        self._tree_every = tree_every
        if _STATM.exists():
            self._thread = threading.Thread(target=self._sample, args=(interval_s,), name="rss-sampler",
                                            daemon=True)
            self._thread.start()

    def _sample(self, interval_s: float) -> None:
        tick = 0
        while not self._stop.wait(interval_s):
            tick += 1
            self._take(with_pss=tick % self.PSS_EVERY == 0, walk=tick % self._tree_every == 0)

    def _take(self, with_pss: bool, walk: bool = True) -> None:
        if walk or self._kids is None:
            self._kids = descendants(os.getpid())
        tree, own, pss = _sample_mb(with_pss, self._kids)
        with self._lock:
            self._peak, self._own_peak = max(self._peak, tree), max(self._own_peak, own)
            self._pss_peak = max(self._pss_peak, pss)

    def _current_peaks(self) -> tuple[float, float, float]:
        if self._thread is None:
            return process_peak_mb(), float("nan"), process_peak_mb()
        self._take(with_pss=True)
        with self._lock:
            return self._peak, self._pss_peak, self._own_peak

    def begin(self, name: str) -> float | None:
        """Start stage ``name``; returns the previous stage's peak RSS MiB (None for the first)."""
        previous = self._finish()
        with self._lock:
            self._peak = self._pss_peak = self._own_peak = 0.0
        if self._thread is not None:
            self._take(with_pss=True)
        self._name, self._start = name, time.monotonic()
        return previous

    def _finish(self) -> float | None:
        if self._name is None:
            return None
        rss, pss, own = self._current_peaks()
        self.rows.append((self._name, time.monotonic() - self._start, rss, pss, own))
        self._name = None
        return rss

    def close(self) -> None:
        self._finish()
        self._stop.set()

    def table(self) -> str:
        rows = [list(row) for row in self.rows]
        body = format_table(["stage", "wall s", "peak RSS MiB (demo + child processes)",
                             "peak PSS MiB (shared pages once)", "peak RSS MiB, demo process alone"],
                            rows, floatfmt="{:.0f}")
        return f"{body}\npeak RSS of the demo's own process (getrusage): {process_peak_mb():.0f} MiB"
