"""SIGTERM as Ctrl-C (openrlhf_sgrpo/local/stop_signal.py) and the study runner's forwarding of it,
with real processes and real signals (the demo's own case: tests/test_demo_sigterm.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from openrlhf_sgrpo.demo.study_runner import SeedJob, _wind_down
from openrlhf_sgrpo.local.stop_signal import SigtermInterrupts

REPO = Path(__file__).resolve().parent.parent
# a stand-in for a demo: it says it is ready, and on KeyboardInterrupt it "saves" (prints) and exits 130
WORKER = """
import sys, time
from openrlhf_sgrpo.local.stop_signal import SigtermInterrupts
try:
    with SigtermInterrupts() as stop:
        print("ready", flush=True)
        time.sleep(60)
except KeyboardInterrupt:
    print("saved", stop.received, flush=True)
    time.sleep(float(sys.argv[1]))  # a slow save: a second SIGTERM must still end it
    sys.exit(130)
"""


def _start(save_s: float = 0.0) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", WORKER, str(save_s)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_the_first_sigterm_interrupts_and_the_second_ends_the_process():
    proc = _start()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 130 and proc.stdout.read().split() == ["saved", "True"]

    slow = _start(save_s=60)
    slow.send_signal(signal.SIGTERM)
    assert slow.stdout.readline().strip() == "saved True"
    slow.send_signal(signal.SIGTERM)
    assert slow.wait(timeout=10) == -signal.SIGTERM


def test_the_runner_forwards_a_sigterm_it_alone_received(tmp_path):
    """``kill RUNNER`` reaches no demo (Ctrl-C in a terminal reaches them all): the runner sends
    each running demo a SIGTERM at once, and waits out the grace period only when it did not."""
    forwarded = SeedJob(0, [], tmp_path, tmp_path / "log")
    forwarded.proc = _start()
    t0 = time.monotonic()
    _wind_down([forwarded], grace_s=30, forward=True)
    assert forwarded.proc.returncode == 130 and time.monotonic() - t0 < 10

    waited = SeedJob(1, [], tmp_path, tmp_path / "log")
    waited.proc = _start()
    t0 = time.monotonic()
    _wind_down([waited], grace_s=2, forward=False)  # the demo had the terminal's SIGINT: give it time
    assert time.monotonic() - t0 >= 2
    assert waited.proc.wait(timeout=10) == 130  # then the same SIGTERM ends it, as a save


def test_outside_the_main_thread_it_leaves_the_disposition_alone():
    """A caller that runs the demo in a thread gets the demo without the handler, not a ValueError."""
    before, seen = signal.getsignal(signal.SIGTERM), []

    def body():
        with SigtermInterrupts():
            seen.append(signal.getsignal(signal.SIGTERM))

    worker = threading.Thread(target=body)
    worker.start()
    worker.join()
    assert seen == [before] and signal.getsignal(signal.SIGTERM) == before
