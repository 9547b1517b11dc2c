"""What a test's own processes left behind, with other processes at work beside it: files in
/dev/shm, socket files, processes that carry the test's marker, a process's state (zombie or gone).

The engine tests check that a clean shutdown leaves /dev/shm as it found it. With the suite split
over workers (``make test`` runs two), another worker's vLLM engine or Ray store may create and
hold files there meanwhile: a new file that a live process outside this test's process tree maps
or holds open is that process's, not a leftover of ours.

POSIX named semaphores (``sem.*``) are not counted: the checks are about shared-memory segments
(vLLM's message queues, the weight-sync files). Python's multiprocessing and joblib create a named
semaphore and unlink it at once (joblib does so on import, to probe for support), so one is left
whenever any process on the machine is killed in between: seen as ``sem.loky-<pid>-...`` from
another worker's Ray workers, ended by their cluster's shutdown."""

from __future__ import annotations

import contextlib
import os
import stat
import time
from pathlib import Path
from typing import NamedTuple

from sandbox.reaper import proc_stat

SHM = Path("/dev/shm")
SEMAPHORE_PREFIX = "sem."  # glibc's name for a POSIX named semaphore's file


def shm_files() -> set[str]:
    """Shared-memory segments in /dev/shm (semaphores left out: module docstring)."""
    if not SHM.is_dir():
        return set()
    return {name for name in os.listdir(SHM) if not name.startswith(SEMAPHORE_PREFIX)}


def _held_by(pid: str) -> set[str]:
    """Names in /dev/shm that process ``pid`` maps or has open (none if it ended meanwhile)."""
    held = set()
    prefix = f"{SHM}/"
    try:
        with open(f"/proc/{pid}/maps") as fh:
            for line in fh:
                at = line.find(prefix)
                if at >= 0:
                    held.add(line[at + len(prefix):].split(" (deleted)")[0].strip())
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith(prefix):
                held.add(target[len(prefix):])
    except OSError:
        pass
    return held


def held_by_others(root: int | None = None) -> set[str]:
    """/dev/shm names held by live processes outside ``root`` (default: this process) and its
    descendants."""
    from openrlhf_sgrpo.demo.memory import descendants

    root = os.getpid() if root is None else root
    ours = {str(root), *(str(p) for p in descendants(root))}
    held = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit() and pid not in ours:
            held |= _held_by(pid)
    return held


def left_behind(before: set[str], root: int | None = None) -> set[str]:
    """Files in /dev/shm now that were not there ``before`` and that no process outside ``root``'s
    tree (default: this process's) holds."""
    new = shm_files() - before
    return new - held_by_others(root) if new else new


def socket_files(directory: Path | str) -> list[Path]:
    """The Unix socket files in ``directory`` (vLLM's ZeroMQ endpoints, which it never removes)."""
    return [p for p in Path(directory).iterdir() if stat.S_ISSOCK(p.lstat().st_mode)]


def marked_processes(marker: str) -> list[int]:
    """Pids of live processes whose command line carries ``marker`` (a zombie's is empty;
    sandboxed processes are visible on the host)."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    if marker.encode() in fh.read():
                        found.append(int(pid))
            except OSError:
                pass
    return found


class ProcState(NamedTuple):
    name: str  # /proc's comm: 15 characters at most
    state: str  # R, S, D, T, Z (a zombie: ended, not yet reaped) ...
    ppid: int


def process_state(pid: int) -> ProcState | None:
    """``pid``'s entry in /proc; None once it is reaped (no entry at all)."""
    stat = proc_stat(f"/proc/{pid}/stat")
    return ProcState(*stat) if stat is not None else None


def live_names(pids: list[int]) -> list[str]:
    """The names of those of ``pids`` that still run (zombies and reaped ones left out)."""
    states = [process_state(pid) for pid in pids]
    return [s.name for s in states if s is not None and s.state != "Z"]


def reap_adopted(pids: list[int], timeout: float = 10.0) -> list[str]:
    """Wait up to ``timeout`` s for ``pids`` to end, reaping each that ends as this process's child:
    orphans come here when the test process is a child subreaper (a sandbox backend made it one),
    and nothing else would ever reap them. Returns the names of those still running."""
    me = os.getpid()
    deadline = time.monotonic() + timeout
    while True:
        for pid in pids:
            state = process_state(pid)
            if state is not None and state.state == "Z" and state.ppid == me:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
        running = live_names(pids)
        if not running or time.monotonic() > deadline:
            return running
        time.sleep(0.05)
