"""The resident pool, shared by the local and Docker backends: warm sandboxes whose pid 1 is the
resident runner (resident_runner.py), or one fresh sandbox per run (cold).

Why one pool for both: what makes a warm sandbox safe is the same whatever isolates it. The runner
spawns every run as a fresh `python3 -E -s main.py`, ends it at its deadline, and proves the
sandbox clean before the next one (or refuses it); the host takes a job to a free sandbox, retries
a job that never started on another one, classifies each run only from what the runner and the host
saw (never from the program's output), heals the pool, and ends the runs still going on shutdown.
A backend only says how to start a sandbox in a place (a local cgroup slot, a container slot), set
its memory limit, kill everything in it, and drop it.
"""

from __future__ import annotations

import abc
import base64
import logging
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .. import fetch
from ..api import MAX_FETCH_BYTES, ExecResult, Outcome, RunRequest
from ..cgroups import Slot
from ..output import CappedBuffer
from .base import Backend
from .channel import ChannelError, ResidentChannel

log = logging.getLogger(__name__)

MODES = ("resident", "cold")
GRACE_S = 5.0  # the runner ends a run at run_timeout; the host waits 3 x this longer before it does
WIPE_TIMEOUT_S = 30.0  # for the runner to wipe its sandbox after a run (a tree of 100,000s of files)
RUNNER = Path(__file__).with_name("resident_runner.py").read_text()  # shipped as `python3 -c` source


class BoxError(RuntimeError):
    """A sandbox could not be started or configured: no code ran in it."""


@dataclass(eq=False)
class Box:
    """One sandbox and what the host knows about it."""

    place: object  # where it lives (a local cgroup slot; None for a container): a replacement takes it
    channel: ResidentChannel
    memory_mb: int
    name: str
    cgroup: Slot | None = None  # its memory and pids cgroups seen from this host, when visible
    keep: frozenset[int] = frozenset()  # host pids that are the sandbox itself (its runner), never a run's
    handle: object = None  # the backend's own (a container, a bwrap process)
    oom_kills: int = 0  # the runner's reading of its oom_kill counter after the last run (no host view)
    oom_before: int = 0  # the host's reading when the current run started
    stopping: str = ""  # why the service ended the current run on shutdown


@dataclass
class RunnerReply:
    """What one run produced, as the sandbox's resident runner reported it."""

    rc: int | None  # -N for a death by signal N
    elapsed: float
    timed_out: bool
    stdout: str
    stderr: str
    fetched: bytes | None  # the fetch collector's answer
    clean: bool  # the runner killed and reaped every other process after the run
    oom_kills: int  # the runner's reading of the sandbox's oom_kill counter (-1: unreadable)
    setup_error: str | None = None  # the runner could not write the run's files: the code never ran


def job_for(request: RunRequest, cap: int) -> dict:
    """The runner's job header for `request`; its stdin travels as the frame after it."""
    return {"timeout": request.run_timeout, "cap": cap, "fetch": list(request.fetch_files),
            "fetch_cap": MAX_FETCH_BYTES, "code": request.code,
            "files": {path: base64.b64encode(data).decode() for path, data in request.files.items()}}


def _kept_output(reply: dict, key: str, cap: int) -> str:
    """Rebuild a capped stream from the runner's kept bytes and dropped count."""
    buf = CappedBuffer(cap)
    buf.write(base64.b64decode(reply[key]))
    buf.dropped += int(reply[f"{key}_dropped"])
    return buf.text()


def _reply(raw: dict, cap: int) -> RunnerReply:
    if "setup_error" in raw:
        return RunnerReply(None, 0.0, False, "", "", None, True, -1, setup_error=str(raw["setup_error"]))
    return RunnerReply(raw["rc"], raw["elapsed"], raw["timed_out"], _kept_output(raw, "out", cap),
                       _kept_output(raw, "err", cap), raw.get("fetched"), raw["procs_left"] == 0,
                       int(raw["oom_kills"]))


class _Stopping(Exception):
    """The service is shutting down: no new run starts."""


class ResidentPool(Backend):
    """Runs jobs through resident runners; subclasses supply the sandboxes (see the module doc)."""

    memory_mb: int  # the limit a fresh sandbox starts with

    def __init__(self, mode: str, places: list[object]) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self._free: queue.Queue[Box | object] = queue.Queue()  # warm boxes, and places with no box yet
        self._lock = threading.Lock()
        self._boxes: set[Box] = set()
        self._busy: set[Box] = set()
        self._stopping = ""
        self.recycled = 0
        self.replaced = 0
        self.closed = False
        for place in places:
            self._free.put(place)

    # ---- what a backend supplies --------------------------------------------------------------
    @abc.abstractmethod
    def _new_box(self, place: object, memory_mb: int) -> Box:
        """Start a sandbox in `place` whose runner said it is ready (BoxError if it cannot)."""

    @abc.abstractmethod
    def _set_memory(self, box: Box, memory_mb: int) -> None:
        """Change a warm sandbox's memory limit (BoxError if it cannot)."""

    @abc.abstractmethod
    def _kill(self, box: Box) -> None:
        """SIGKILL everything in the sandbox now, its runner included."""

    @abc.abstractmethod
    def _drop(self, box: Box) -> None:
        """End the sandbox and free its place (nothing of it may be left running)."""

    def _runner_command(self, python: str) -> list[str]:
        """pid 1 of every sandbox: the runner, given the fetch collector's source to start after each
        run (the tests swap in a naive runner to show that each leak check can fail)."""
        return [python, "-E", "-s", "-c", RUNNER, fetch.SOURCE]

    def _engine_oom(self, box: Box) -> bool:
        """Whether an engine without a host view of the cgroup saw a memory kill in the sandbox."""
        return False

    # ---- the pool -------------------------------------------------------------------------------
    def _warm_up(self) -> None:
        """Start a sandbox in every place; a place whose sandbox fails to start stays empty, and the
        run that takes it tries again (and reports why, if it fails again)."""
        if self.mode != "resident":
            return
        for _ in range(self._free.qsize()):
            place = self._free.get()
            try:
                self._free.put(self._start(place, self.memory_mb))
            except BoxError as err:
                log.warning("sandbox did not start: %s", err)
                self._free.put(place)

    def _start(self, place: object, memory_mb: int) -> Box:
        box = self._new_box(place, memory_mb)
        with self._lock:
            self._boxes.add(box)
        return box

    def _remove(self, box: Box) -> None:
        with self._lock:
            self._boxes.discard(box)
        try:
            self._drop(box)
        except Exception:  # never a reason to lose the place: a fresh sandbox gets it
            log.exception("could not drop sandbox %s", box.name)

    def _replace(self, box: Box) -> None:
        """Heal the pool: drop a suspect sandbox and start a fresh one in its place."""
        self._remove(box)
        if self.closed or self._stopping:
            self._free.put(box.place)
            return
        self.replaced += 1
        try:
            self._free.put(self._start(box.place, self.memory_mb))
        except BoxError as err:
            log.warning("could not replace sandbox %s (%s); the next run retries", box.name, err)
            self._free.put(box.place)

    def _release(self, box: Box, healthy: bool, why: object = "") -> None:
        """After a run: a healthy warm sandbox goes back to the pool, a suspect one is replaced in
        the background, and a cold one is dropped."""
        if self.mode == "cold":
            self._remove(box)
            self._free.put(box.place)
        elif healthy:
            self.recycled += 1
            self._free.put(box)
        elif self.closed or self._stopping:
            # Shutting down: the run was ended by the drain (or its sandbox died meanwhile); the
            # sandbox stays in the pool's set, which close() takes down, and none is started.
            log.info("sandbox %s ends with the service (shutting down; not replaced): %s", box.name, why)
        else:
            log.warning("%s; replacing sandbox %s", why, box.name)
            threading.Thread(target=self._replace, args=(box,), daemon=True).start()

    def _take(self, memory_mb: int) -> Box:
        """A sandbox ready for a run with this memory limit (BoxError if none could be had)."""
        entry = self._free.get()
        if not isinstance(entry, Box):
            try:
                return self._start(entry, memory_mb)
            except BoxError:
                self._free.put(entry)
                raise
        try:
            unclean = entry.channel.settle(time.monotonic() + WIPE_TIMEOUT_S)  # the last run is wiped
            if unclean:
                raise BoxError(f"sandbox {entry.name} is not clean after its last run ({unclean})")
            if entry.memory_mb != memory_mb:
                self._set_memory(entry, memory_mb)
                entry.memory_mb = memory_mb
        except (BoxError, ChannelError) as err:
            self._release(entry, False, err)
            raise BoxError(str(err)) from err
        return entry

    # ---- a run ----------------------------------------------------------------------------------
    def run(self, request: RunRequest, max_output_bytes: int) -> ExecResult:
        why = ""
        for _ in range(2):  # a job the runner never took may go to a second sandbox
            try:
                box = self._take(request.memory_limit_mb)
            except BoxError as err:
                why = str(err)
                continue
            start = time.monotonic()
            try:
                raw = self._call(box, request, max_output_bytes)
            except _Stopping:
                self._release(box, True)
                return self._stopped(self._stopping, 0.0)
            except ChannelError as err:
                if not err.started and not box.stopping:  # the code never ran: heal, retry elsewhere
                    self._release(box, False, f"sandbox unusable ({err})")
                    why = str(err)
                    continue
                return self._lost(box, err, time.monotonic() - start)
            return self._settle(box, request, _reply(raw, max_output_bytes))
        return ExecResult(Outcome.SANDBOX_ERROR, None, "", "", 0.0, sandbox_error=f"{why} (no usable sandbox)")

    def _call(self, box: Box, request: RunRequest, cap: int) -> dict:
        with self._lock:
            if self._stopping:
                raise _Stopping()
            self._busy.add(box)
        try:
            try:
                box.oom_before = box.cgroup.oom_kills() if box.cgroup else 0
            except OSError as err:  # the sandbox's cgroup is gone: so is the sandbox
                raise ChannelError(f"sandbox {box.name} is gone ({err})") from err
            deadline = time.monotonic() + request.run_timeout + 3 * GRACE_S
            return box.channel.call(job_for(request, cap), request.stdin, deadline, stream_cap=2 * fetch.ANSWER_CAP)
        finally:
            with self._lock:
                self._busy.discard(box)

    @staticmethod
    def _stopped(reason: str, elapsed: float) -> ExecResult:
        return ExecResult(Outcome.SANDBOX_ERROR, None, "", "", elapsed, sandbox_error=reason)

    def _memory_killed(self, box: Box) -> bool:
        try:
            if box.cgroup is not None and box.cgroup.oom_kills() > box.oom_before:
                return True
        except OSError:
            pass
        return self._engine_oom(box)

    def _lost(self, box: Box, err: ChannelError, elapsed: float) -> ExecResult:
        """The runner took the job and gave no reply: the service ended the run (shutdown), the OOM
        killer took the runner too, the host's later deadline passed (a time-out: nothing of the
        run comes back), or the sandbox died. The sandbox is replaced in every case."""
        if box.stopping:
            result = self._stopped(box.stopping, elapsed)
        elif self._memory_killed(box):
            result = ExecResult(Outcome.MEMORY, None, "", "", elapsed)
        elif err.timed_out:
            result = ExecResult(Outcome.TIMEOUT, None, "", "", elapsed)
        else:
            result = ExecResult(Outcome.SANDBOX_ERROR, None, "", "", elapsed,
                                sandbox_error=f"sandbox lost during the run: {err}")
        self._release(box, False, err)
        return result

    def _sweep(self, box: Box, run: RunnerReply) -> tuple[bool, bool]:
        """(healthy, memory-killed) after a run. With a host view of the sandbox's cgroup, anything
        left but the sandbox's own processes is killed from here (then the sandbox is not healthy)
        and its oom_kill counter read; otherwise the runner's report says both (-1: unreadable)."""
        if box.cgroup is not None:
            try:
                left = box.cgroup.kill_all(keep=box.keep)
                return run.clean and left == 0, box.cgroup.oom_kills() > box.oom_before
            except (OSError, RuntimeError):
                return False, False
        healthy, oom = run.clean, run.oom_kills > box.oom_kills
        box.oom_kills = max(run.oom_kills, box.oom_kills)
        if run.oom_kills < 0 and run.rc == -9 and not run.timed_out:
            oom = self._engine_oom(box)  # no counter in the sandbox: the engine's sticky flag
            healthy = healthy and not oom  # the flag only resets with a new sandbox
        return healthy, oom

    def _settle(self, box: Box, request: RunRequest, run: RunnerReply) -> ExecResult:
        """After a run: leftovers killed, a memory kill decided, the sandbox recycled or replaced."""
        if box.stopping:  # the service killed the run (its runner may have seen the program die first)
            self._release(box, False, box.stopping)
            return self._stopped(box.stopping, run.elapsed)
        healthy, oom = self._sweep(box, run)
        self._release(box, healthy, "cleanup could not prove the sandbox clean")
        if run.setup_error:
            return ExecResult(Outcome.SANDBOX_ERROR, None, "", "", 0.0, sandbox_error=run.setup_error)
        if run.timed_out:
            result = ExecResult(Outcome.TIMEOUT, None, run.stdout, run.stderr, run.elapsed)
        elif oom:
            return ExecResult(Outcome.MEMORY, run.rc, run.stdout, run.stderr, run.elapsed)
        elif run.rc is None:
            return ExecResult(Outcome.SANDBOX_ERROR, None, "", "", run.elapsed,
                              sandbox_error="the runner reported no exit status for the run")
        else:
            result = ExecResult(Outcome.FINISHED, run.rc, run.stdout, run.stderr, run.elapsed)
        if request.fetch_files:
            result.files, result.notes = fetch.read_answer(run.fetched or b"", request.fetch_files)
        return result

    # ---- shutdown, stats ------------------------------------------------------------------------
    def abort_runs(self, reason: str) -> None:
        """End every run in progress now: each is answered as a SandboxError saying `reason`, and no
        new run starts."""
        with self._lock:
            self._stopping = reason
            busy = list(self._busy)
            for box in busy:
                box.stopping = reason
        for box in busy:
            try:
                self._kill(box)
            except Exception:  # the run's own deadline still ends it
                log.exception("could not end the run in sandbox %s", box.name)

    def pool_stats(self, prefix: str) -> dict[str, float]:
        with self._lock:
            boxes = len(self._boxes)
        return {f"{prefix}_pool_free": float(self._free.qsize()), f"{prefix}_sandboxes": float(boxes),
                f"{prefix}_recycled_total": float(self.recycled), f"{prefix}_replaced_total": float(self.replaced)}

    def close(self) -> None:
        self.closed = True
        with self._lock:
            boxes = list(self._boxes)
        for box in boxes:
            self._remove(box)
