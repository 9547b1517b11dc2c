"""Reap the runner of a dropped local sandbox when it is orphaned, whatever the host's pid 1 does.

Why: a sandbox's pid 1 (our resident runner, bwrap's child) is normally reaped by bwrap's monitor.
When the service drops a sandbox (its own deadline passed, the sandbox proved unclean, shutdown)
it kills the monitor and the runner in the same instant, and the runner is orphaned: reparented to
the nearest child subreaper or to the host's pid 1. A pid 1 that does not reap (the service as a
container's entrypoint, a VM init such as Firecracker's process_api) keeps it a zombie for good,
and the pids controller charges zombies: after ~64 replacements in one slot, `pids.max` rejects
the next sandbox's fork. So the service makes itself a child subreaper; orphans of its sandboxes
come back to it and are reaped here.

Only the one pid a sandbox names (bwrap's status fd reports its child's host pid) is reaped, and
only while it is a child this process did not spawn through :meth:`spawn`, so the exit status of
any other child (a ``subprocess.Popen`` elsewhere in the process) is never stolen.
"""

from __future__ import annotations

import ctypes
import glob
import logging
import os
import subprocess
import threading
import time

log = logging.getLogger(__name__)

PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37

# The flag is the process's, the reapers are objects: the first reaper to open sets it, the last
# to close clears it (unless the process was a subreaper before), so a process that only embeds a
# backend for a while (a test, a notebook) does not adopt every orphan of its tree for good.
_open_reapers = 0
_was_subreaper = False
_flag_lock = threading.Lock()


def _prctl(option: int, arg: object = 0) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, arg, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def is_subreaper() -> bool:
    """Whether this process is a child subreaper now."""
    flag = ctypes.c_int(0)
    return _prctl(PR_GET_CHILD_SUBREAPER, ctypes.pointer(flag)) and flag.value != 0


def _set_subreaper() -> bool:
    global _open_reapers, _was_subreaper
    with _flag_lock:
        if _open_reapers == 0:
            _was_subreaper = is_subreaper()
            if not _prctl(PR_SET_CHILD_SUBREAPER, 1):
                return False
        _open_reapers += 1
        return True


def _release_subreaper() -> None:
    global _open_reapers
    with _flag_lock:
        _open_reapers -= 1
        if _open_reapers == 0 and not _was_subreaper:
            _prctl(PR_SET_CHILD_SUBREAPER, 0)


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
        stat = proc_stat(path)
        if stat is not None and stat[2] == me:
            kids.add(int(path.split("/")[2]))
    return kids


def proc_stat(path: str) -> tuple[str, str, int] | None:
    """(comm, state, ppid) from a /proc/<pid>/stat file, or None if it is gone (reaped)."""
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

    def close(self) -> None:
        """The backend is closed and its runs reaped: this reaper's hold on the flag ends."""
        with self._lock:
            if self.enabled:
                self.enabled = False
                _release_subreaper()

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

    def reap(self, pid: int, timeout: float) -> bool:
        """Reap `pid` if it is an orphan of ours, waiting up to `timeout` s for it to exit; call it
        after the process that spawned `pid` was waited for, so an orphan has already come here."""
        if not self.enabled:
            return False
        deadline = time.monotonic() + timeout
        with self._lock:
            if pid in self._own or pid not in _children():
                return False  # its parent reaped it, as on every run that ends on its own
            while True:
                try:
                    if os.waitpid(pid, os.WNOHANG)[0] == pid:
                        self.reaped += 1
                        return True
                except ChildProcessError:
                    return False
                if time.monotonic() > deadline:
                    log.warning("orphaned sandbox init %d did not exit within %.1f s", pid, timeout)
                    return False
                time.sleep(0.0005)
