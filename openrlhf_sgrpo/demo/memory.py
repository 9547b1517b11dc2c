"""Peak resident memory (RSS) and wall time per demo stage, printed with the demo's output.

A daemon thread samples the RSS of this process *and its descendants* (the vLLM engine runs in
two child processes, the sandbox in others) from ``/proc/<pid>/statm`` every 20 ms and keeps the
maximum of the current stage: the memory the demo really holds, not only its Python process. The kernel's own high-water mark (``VmHWM``, what
``/usr/bin/time -v`` reports) is process-wide and cannot be split per stage without resetting
it, which would falsify ``time -v``'s number; a short spike between two samples can be missed,
so the process peak (``getrusage``) is printed beside the table. Without ``/proc`` (macOS) the
per-stage column is the process peak so far.
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


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from the kernel's per-thread ``children`` lists)."""
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for tasks in Path(f"/proc/{parent}/task").glob("*/children"):
            try:
                kids = [int(k) for k in tasks.read_text().split()]
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


def rss_mb() -> float | None:
    """Resident set size of this process and all its descendants in MiB (None without /proc)."""
    if not _STATM.exists():
        return None
    pages = _rss_pages("self") + sum(_rss_pages(pid) for pid in _descendants(os.getpid()))
    return pages * os.sysconf("SC_PAGE_SIZE") / _MB


def process_peak_mb() -> float:
    """This process's peak RSS so far (getrusage: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (_MB if sys.platform == "darwin" else 1024)


class StagePeaks:
    """``begin(name)`` closes the previous stage and opens the next; ``close()`` ends the last."""

    def __init__(self, interval_s: float = 0.02):
        self.rows: list[tuple[str, float, float]] = []  # (stage, wall s, peak MiB)
        self._name: str | None = None
        self._start = 0.0
        self._peak = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        if rss_mb() is not None:
            self._thread = threading.Thread(target=self._sample, args=(interval_s,), name="rss-sampler", daemon=True)
            self._thread.start()

    def _sample(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            now = rss_mb() or 0.0
            with self._lock:
                self._peak = max(self._peak, now)

    def _current_peak(self) -> float:
        if self._thread is None:
            return process_peak_mb()
        with self._lock:
            return max(self._peak, rss_mb() or 0.0)

    def begin(self, name: str) -> float | None:
        """Start stage ``name``; returns the previous stage's peak MiB (None for the first)."""
        previous = self._finish()
        with self._lock:
            self._peak = rss_mb() or 0.0
        self._name, self._start = name, time.monotonic()
        return previous

    def _finish(self) -> float | None:
        if self._name is None:
            return None
        peak = self._current_peak()
        self.rows.append((self._name, time.monotonic() - self._start, peak))
        self._name = None
        return peak

    def close(self) -> None:
        self._finish()
        self._stop.set()

    def table(self) -> str:
        rows = [[name, wall, peak] for name, wall, peak in self.rows]
        body = format_table(["stage", "wall s", "peak RSS MiB (demo + child processes)"], rows, floatfmt="{:.0f}")
        return f"{body}\npeak RSS of the demo's own process (getrusage): {process_peak_mb():.0f} MiB"
