"""SIGTERM (a scheduler's stop, ``kill``) ends the demo as Ctrl-C does: exit 130, the resume hint,
a checkpoint to resume from, and no process it started left running.

Why: Python's default for SIGTERM ends the process with no ``finally``; a study seed stopped with
``kill`` on 2026-12-02 left vLLM's engine core (a child of the demo) running, reparented to init
with 2.3 GB. The demo here is the real entry point (``python -m openrlhf_sgrpo.demo --smoke``, its
default engine: vLLM where it runs), in a process of its own, signalled in its training stage.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from openrlhf_sgrpo.local.checkpoint import latest_checkpoint
from openrlhf_sgrpo.testing import kill_left_over, shifted_seed

pytestmark = pytest.mark.timeout(600)
REPO = Path(__file__).resolve().parent.parent


def test_sigterm_in_training_keeps_a_checkpoint_and_leaves_no_process(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "openrlhf_sgrpo.demo", "--smoke", "--out", str(out), "--steps", "3",
           "--heldout", "2", "--no-eval-before", "--seed", str(shifted_seed(0))]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"), start_new_session=True)
    text: list[bytes] = []
    started: list[psutil.Process] = []
    reader = threading.Thread(target=lambda: text.extend(iter(proc.stdout.readline, b"")), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 480
        while b"] train 3 steps" not in b"".join(text):  # the stage header: the trainer is starting
            assert proc.poll() is None, b"".join(text).decode(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "the demo did not reach its training stage"
            time.sleep(0.2)
        time.sleep(2.0)  # into the first rollout
        started = psutil.Process(proc.pid).children(recursive=True)
        assert started, "the demo runs its services and engine in processes of its own"
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=120)
        reader.join(timeout=10)
        log = b"".join(text).decode(errors="replace")
        assert rc == 130, log[-3000:]
        assert "interrupted; continue with: python -m openrlhf_sgrpo.demo" in log and "--resume" in log
        assert latest_checkpoint(out / "checkpoints") is not None, log[-3000:]
        gone, alive = psutil.wait_procs(started, timeout=15)
        assert not alive, [(p.pid, p.name()) for p in alive]
    finally:  # nothing of this test outlives it, whatever failed
        kill_left_over(proc, started)
