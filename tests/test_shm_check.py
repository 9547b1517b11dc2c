"""tests/shm_check.py: a /dev/shm file counts as left behind unless a live process outside this
test's process tree holds it (another test worker's engine)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
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


def _outside_holder(path: Path) -> int:
    """A process that maps ``path`` and is no descendant of ours: started in its own session by a
    parent that exits at once, so it is re-parented away from this process."""
    launcher = subprocess.run(
        [sys.executable, "-c",
         "import subprocess, sys\np = subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]], "
         "start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\nprint(p.pid)", HOLD, str(path)],
        capture_output=True, text=True, check=True, timeout=30)
    pid = int(launcher.stdout)
    deadline = time.monotonic() + 20
    while path.name not in open(f"/proc/{pid}/maps").read():
        assert time.monotonic() < deadline, "the holder never mapped the file"
        time.sleep(0.05)
    return pid


def test_a_file_only_an_outside_process_holds_is_not_ours():
    before = shm_files()
    path = _new_file()
    pid = _outside_holder(path)
    try:
        assert path.name not in left_behind(before)
    finally:
        os.kill(pid, 9)
        path.unlink()


def test_a_file_nobody_holds_or_our_child_holds_is_left_behind():
    before = shm_files()
    path = _new_file()
    try:
        assert path.name in left_behind(before)  # nobody holds it: a leak
        child = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline().strip() == "held"
            assert path.name in left_behind(before)  # ours, still running: not shut down
        finally:
            child.kill()
            child.wait()
    finally:
        path.unlink()
    assert path.name not in left_behind(before)
