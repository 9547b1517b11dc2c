"""tests/shm_check.py: a /dev/shm file counts as left behind unless a live process outside this
test's process tree holds it (another test worker's engine)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from shm_check import SHM, left_behind, shm_files

pytestmark = pytest.mark.skipif(not SHM.is_dir() or not Path("/proc/self/maps").exists(), reason="needs Linux /dev/shm and /proc")

HOLD = ("import mmap, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDWR)\nm = mmap.mmap(fd, 4096)\nos.close(fd)\n"
        "print('held', flush=True)\ntime.sleep(60)\n")


def _new_file() -> Path:
    path = SHM / f"sgrpo-shm-check-{uuid.uuid4().hex}"
    path.write_bytes(b"\0" * 4096)
    return path


def _holder(path: Path) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"
    return child


def test_a_file_only_an_outside_process_holds_is_not_ours():
    """Seen from a tree rooted at one child (the test worker, say), a file that a sibling holds (the
    other worker's engine) is not a leftover of that tree; seen from this process, it is ours.
    (No process started here can leave this process's tree: after the sandbox tests the worker
    is a child subreaper, so even a re-parented orphan comes back to it.)"""
    before = shm_files()
    path = _new_file()
    root = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    holder = _holder(path)
    try:
        assert path.name not in left_behind(before, root=root.pid)
        assert path.name in left_behind(before)
    finally:
        for p in (holder, root):
            p.kill()
            p.wait()
        path.unlink()


def test_a_file_nobody_holds_or_our_child_holds_is_left_behind():
    before = shm_files()
    path = _new_file()
    try:
        assert path.name in left_behind(before)  # nobody holds it: a leak
        child = _holder(path)
        try:
            assert path.name in left_behind(before)  # ours, still running: not shut down
        finally:
            child.kill()
            child.wait()
    finally:
        path.unlink()
    assert path.name not in left_behind(before)


def test_a_semaphore_nobody_holds_is_not_counted():
    """A named semaphore a killed process did not get to unlink (joblib's import-time probe) is not
    a shared-memory segment of ours; a segment of the same age is."""
    before = shm_files()
    semaphore = SHM / f"sem.sgrpo-shm-check-{uuid.uuid4().hex}"
    semaphore.write_bytes(b"\0" * 32)
    segment = _new_file()
    try:
        left = left_behind(before)
        assert segment.name in left and semaphore.name not in left, left
    finally:
        semaphore.unlink()
        segment.unlink()
