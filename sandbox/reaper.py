"""Reap the orphaned bwrap processes of our own runs, whatever the host's pid 1 does.

Why: bwrap's outer monitor exits as soon as the sandbox's init (pid 1 of the new pid namespace)
reports the exit code, and the init itself exits a moment later, orphaned. It is reparented to
the nearest child subreaper or to the host's pid 1. A pid 1 that does not reap (the service as
a container's entrypoint, a VM init such as Firecracker's process_api) leaves one zombie per
run, and the pids controller charges zombies until they are reaped: after ~64 runs on one slot,
`pids.max` rejects bwrap's fork and every run fails. So the service makes itself a child
subreaper; orphans of its runs come back to it and are reaped here.

Only zombies named ``bwrap`` that this process did not spawn through :meth:`spawn` are reaped,
so the exit status of any other child (a ``subprocess.Popen`` elsewhere in the process) is
never stolen.
"""

from __future__ import annotations

import ctypes
import glob
import logging
import os
import subprocess
import threading

log = logging.getLogger(__name__)

PR_SET_CHILD_SUBREAPER = 36
ORPHAN_COMM = "bwrap"


def _set_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _children() -> set[int]:
    """Pids whose parent is this process's main thread.

    The kernel hands an orphan to the first live thread of the subreaper, the thread-group
    leader while it runs, so one file answers; reading every thread's file would cost a
    service with dozens of worker threads about a millisecond per run.
    """
    me = os.getpid()
    try:
        with open(f"/proc/{me}/task/{me}/children") as fh:
            return {int(p) for p in fh.read().split()}
    except (OSError, ValueError):
        pass
    kids: set[int] = set()  # kernels without CONFIG_PROC_CHILDREN: scan every process
    for path in glob.glob("/proc/[0-9]*/stat"):
        stat = _stat(path)
        if stat is not None and stat[2] == me:
            kids.add(int(path.split("/")[2]))
    return kids


def _stat(path: str) -> tuple[str, str, int] | None:
    """(comm, state, ppid) from a /proc/<pid>/stat file, or None if it is gone."""
    try:
        with open(path) as fh:
            raw = fh.read()
    except OSError:
        return None
    head, _, rest = raw.rpartition(")")
    fields = rest.split()
    if len(fields) < 2:
        return None
    return head.partition("(")[2], fields[0], int(fields[1])


class OrphanReaper:
    """Marks this process a child subreaper and reaps the orphans of the runs it spawned."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._own: set[int] = set()
        self.enabled = _set_subreaper()
        self.reaped = 0
        if not self.enabled:
            log.warning("could not become a child subreaper; sandbox orphans go to the host's pid 1")

    def spawn(self, *args, **kwargs) -> subprocess.Popen:
        """`subprocess.Popen`, registered before any reap can see it (its status stays ours)."""
        with self._lock:
            proc = subprocess.Popen(*args, **kwargs)
            self._own.add(proc.pid)
        return proc

    def forget(self, pid: int) -> None:
        """Call after `wait()` on a spawned process: its pid may be reused from now on."""
        with self._lock:
            self._own.discard(pid)

    def reap(self) -> int:
        """Reap every orphaned bwrap zombie now; returns how many."""
        if not self.enabled:
            return 0
        n = 0
        with self._lock:
            for pid in _children() - self._own:
                stat = _stat(f"/proc/{pid}/stat")
                if stat is None or stat[0] != ORPHAN_COMM or stat[1] != "Z":
                    continue
                try:
                    if os.waitpid(pid, os.WNOHANG)[0] == pid:
                        n += 1
                except ChildProcessError:
                    pass
            self.reaped += n
        return n
