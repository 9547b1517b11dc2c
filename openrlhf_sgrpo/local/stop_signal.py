"""SIGTERM stops a run the way Ctrl-C does: the step's checkpoint kept, the child processes shut.

Why: a scheduler (Slurm before its SIGKILL, Kubernetes, ``timeout``, a plain ``kill``) stops a job
with SIGTERM, and Python's default for it ends the process at once, so no ``finally`` runs. For the
demo that meant no checkpoint of the interrupted step and vLLM's engine core (a child process)
left running with its memory, reparented to init (seen on 2026-12-02: a study seed stopped with
``kill`` left a 2.3 GB ``VLLM::EngineCore``). A job started in the background from a
non-interactive shell also has SIGINT ignored, so only SIGTERM can reach it.

Inside :class:`SigtermInterrupts` the first SIGTERM raises ``KeyboardInterrupt`` in the main thread,
so the paths written for Ctrl-C run (the trainer saves, the demo closes its engine and services,
the study runner winds its demos down). A second SIGTERM ends the process as the default does: a
stop that must not wait still can.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType


class SigtermInterrupts:
    """``with SigtermInterrupts() as stop:`` ... ``stop.received`` tells whether the interruption
    was a SIGTERM (sent to this process alone, so its children got nothing) rather than a
    terminal's Ctrl-C (which reaches the whole foreground process group)."""

    def __init__(self) -> None:
        self.received = False
        self._previous = None
        self._installed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = True
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the next one stops at once
        raise KeyboardInterrupt(f"signal {signum} (SIGTERM)")

    def install(self) -> "SigtermInterrupts":
        """Python takes signal handlers from the main thread only: called from another (a caller
        that runs the demo in a thread), it leaves the disposition alone."""
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
            self._installed = True
        return self

    def restore(self) -> None:
        """The disposition from before :meth:`install` (a handler outside ours stays in charge)."""
        if self._installed:  # None: the previous handler was not set from Python; the default stands in
            signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)
            self._installed = False

    def __enter__(self) -> "SigtermInterrupts":
        return self.install()

    def __exit__(self, *exc) -> None:
        self.restore()
