"""Local backend: bubblewrap namespaces + a pooled cgroup + rlimits, no daemon needed.

Each run: take a cgroup slot, set its memory/pids limits, then start
`sh -c 'echo $$ > slot/cgroup.procs; ulimit ...; exec setpriv <uid 65534> bwrap ... python3 main.py'`.
The root shell only joins the cgroup before anything untrusted runs (so every descendant is
accounted and killable), sets the rlimits and drops to uid 65534 for good. bwrap gives a private
network (no interfaces but lo), pid, ipc, uts and user namespace, a read-only root made of /usr
only, and fresh size-capped tmpfs /work, /tmp and /dev/shm that vanish with the mount namespace.

Inside, pid 1 is our own init (`sandbox_init.py`, bwrap `--as-pid-1`), not bwrap's: it starts
the program, reaps orphans, and reports the program's wait status on a pipe the program never
holds, so a death by signal N reads -N as in SandboxFusion, where bwrap's monitor would fold it
into 128 + N like `exit(128 + N)`.

How a run ended is decided from what the service saw, never from the program's output: its own
deadline (a time-out), the slot's `oom_kill` counter (a memory kill), bwrap's status fd (an
`exit-code` only once the sandbox was set up) and the init's report (its first line is written
before the program exists; then the program's status, or why it could not be started).
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import subprocess
import threading
import time

from .. import fetch
from ..api import SCRIPT, WORKDIR, ExecResult, Outcome, RunRequest
from ..cgroups import CgroupPool, Slot, create_pool
from ..probe import run_probe
from ..reaper import OrphanReaper
from .base import Backend, Guarantees
from .pump import pump

log = logging.getLogger(__name__)

SANDBOX_UID = 65534
SCRATCH_BYTES = 64 << 20  # each of /work, /tmp and /dev/shm
PIDS_MAX = 64
INIT_GRACE_S = 5.0  # past run_timeout, the service ends a run whose init did not (then no files come back)
SETTLE_S = 0.5  # how long a killed run's orphaned sandbox init may take to exit and be reaped
NOFILE = 256
FSIZE_BYTES = 64 << 20
PYTHON = "/usr/bin/python3"
PROGRAM = [PYTHON, "-E", "-s", "main.py"]  # -E: ignore PYTHON* env; -s: no user site
ETC_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf")
SANDBOX_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": WORKDIR, "LANG": "C.UTF-8",
               "PYTHONDONTWRITEBYTECODE": "1"}
STATUS_CAP = 1 << 16
REPORT_SLACK = 4096  # the init's "started" line and returncode around the fetch answer


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, 0)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _read_all(fd: int, cap: int) -> bytes:
    chunks: list[bytes] = []
    while sum(map(len, chunks)) < cap and (chunk := os.read(fd, cap)):
        chunks.append(chunk)
    return b"".join(chunks)


def _bwrap_status(status: bytes) -> tuple[int | None, int | None]:
    """bwrap's `--json-status-fd` stream: (its child's host pid, its child's exit status), each None
    if not reported; an exit status comes only once the sandbox was set up."""
    child_pid = exit_code = None
    for line in status.decode(errors="replace").splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get("child-pid"), int):
            child_pid = doc["child-pid"]
        if isinstance(doc, dict) and isinstance(doc.get("exit-code"), int):
            exit_code = doc["exit-code"]
    return child_pid, exit_code


class LocalBackend(Backend):
    """bubblewrap + cgroup slots; `pool_size` bounds concurrent executions."""

    name = "local"

    def __init__(self, pool_size: int = 4) -> None:
        self.pool_size = pool_size
        self.bwrap = shutil.which("bwrap")
        self.setpriv = shutil.which("setpriv")
        self.pool: CgroupPool | None = None
        self._pool_error = ""
        self._fallback_sem = threading.BoundedSemaphore(pool_size)
        try:
            self.pool = create_pool(pool_size)
        except OSError as err:
            self._pool_error = str(err)
            log.warning("no cgroup pool: %s", err)
        self.reaper = OrphanReaper()

    # ---- command construction -------------------------------------------------------------
    def _bwrap_args(self, files: list[tuple[int, str]], status_fd: int, command: list[str]) -> list[str]:
        args = [self.bwrap or "bwrap", "--unshare-all", "--unshare-user", "--as-pid-1",
                "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
                "--die-with-parent", "--new-session", "--clearenv", "--hostname", "sandbox",
                "--json-status-fd", str(status_fd), "--ro-bind", "/usr", "/usr"]
        for link in ("bin", "sbin", "lib", "lib64", "lib32"):
            target = f"/{link}"
            if os.path.islink(target):
                args += ["--symlink", os.readlink(target), target]
            elif os.path.isdir(target):
                args += ["--ro-bind", target, target]
        for etc in ETC_FILES:
            if os.path.exists(etc):
                args += ["--ro-bind", etc, etc]
        for key, value in SANDBOX_ENV.items():
            args += ["--setenv", key, value]
        args += ["--proc", "/proc", "--dev", "/dev"]
        for scratch in ("/tmp", WORKDIR, "/dev/shm"):
            args += ["--size", str(SCRATCH_BYTES), "--tmpfs", scratch]
        for fd, path in files:  # bwrap creates the parent directories, owned by the sandbox user
            args += ["--file", str(fd), path]
        return [*args, "--remount-ro", "/dev", "--chdir", WORKDIR, "--remount-ro", "/", *command]

    def _launch_prefix(self, slot: Slot | None) -> list[str]:
        """The root step before bwrap: join the cgroup, set rlimits, drop to uid 65534 for good."""
        steps = [f"echo $$ > {shlex.quote(f)}" for f in (slot.attach_files if slot else [])]
        steps += [f"ulimit -f {FSIZE_BYTES // 512}", f"ulimit -n {NOFILE}", "ulimit -c 0"]
        drop = (f"{self.setpriv} --reuid={SANDBOX_UID} --regid={SANDBOX_UID} --clear-groups "
                if self.setpriv else "")
        steps.append(f'exec {drop}"$@"')
        return ["/bin/sh", "-c", " && ".join(steps), "sandbox-launch"]

    # ---- execution --------------------------------------------------------------------------
    def run(self, request: RunRequest, max_output_bytes: int) -> ExecResult:
        if self.bwrap is None:
            return ExecResult(Outcome.SANDBOX_ERROR, None, "", "", 0.0,
                              sandbox_error="bubblewrap (bwrap) is not installed")
        slot = self.pool.acquire() if self.pool is not None else None
        if slot is None:
            self._fallback_sem.acquire()
        fds: list[int] = []
        try:
            oom_before = 0
            if slot is not None:
                slot.set_limits(request.memory_limit_mb << 20, PIDS_MAX)
                oom_before = slot.oom_kills()
            files = [(_memfd("main.py", request.code.encode()), SCRIPT)]
            files += [(_memfd("file", data), path) for path, data in request.files.items()]
            fds += [fd for fd, _ in files]
            return self._execute(request, slot, files, fds, max_output_bytes, oom_before)
        finally:
            for fd in fds:
                os.close(fd)
            if slot is not None:
                self.pool.release(slot)  # type: ignore[union-attr]
            else:
                self._fallback_sem.release()

    def _execute(self, request: RunRequest, slot: Slot | None, files: list[tuple[int, str]], fds: list[int],
                 max_output_bytes: int, oom_before: int) -> ExecResult:
        status_r, status_w = os.pipe()
        report_r, report_w = os.pipe()
        fds += [status_r, report_r]
        passed = [fd for fd, _ in files] + [status_w, report_w]
        command = fetch.init_command(PYTHON, report_w, request.run_timeout, request.fetch_files, PROGRAM)
        cmd = [*self._launch_prefix(slot), *self._bwrap_args(files, status_w, command)]
        start = time.monotonic()
        try:
            proc = self.reaper.spawn(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     pass_fds=passed, start_new_session=True,
                                     env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        finally:
            for fd in passed[len(files):]:  # the write ends now live in the child only
                os.close(fd)
        try:
            captured = pump(proc, request.stdin, start + request.run_timeout + INIT_GRACE_S, max_output_bytes,
                            {report_r: fetch.ANSWER_CAP + REPORT_SLACK})
        finally:
            if slot is not None:
                slot.kill_all()
            try:
                os.killpg(proc.pid, 9)
            except ProcessLookupError:
                pass
            rc = proc.wait()
            self.reaper.forget(proc.pid)
        elapsed = time.monotonic() - start
        init_pid, exit_code = _bwrap_status(_read_all(status_r, STATUS_CAP))
        self._settle(slot, init_pid)
        set_up = exit_code is not None
        report = fetch.read_init_report(captured.side[report_r])
        if captured.timed_out:  # the init did not end the run at its deadline: ours, later, did
            return ExecResult(Outcome.TIMEOUT, None, captured.stdout, captured.stderr, elapsed)
        if report.timed_out:
            result = ExecResult(Outcome.TIMEOUT, None, captured.stdout, captured.stderr, elapsed)
            return self._with_fetched(result, request, report)
        if slot is not None and slot.oom_kills() > oom_before:
            return ExecResult(Outcome.MEMORY, report.returncode, captured.stdout, captured.stderr, elapsed)
        if not (set_up and report.started):  # the program never started: stderr is the launcher's or bwrap's own
            reason = captured.stderr.strip()[-2000:] or f"the sandbox launcher exited with status {rc}"
            return ExecResult(Outcome.SANDBOX_ERROR, rc, "", "", elapsed, sandbox_error=reason)
        if not report.ended:
            reason = (f"the sandbox could not start the program: {report.spawn_error}" if report.spawn_error
                      else f"the sandbox's init ended (status {rc}) without reporting the program's status")
            return ExecResult(Outcome.SANDBOX_ERROR, None, "", "", elapsed, sandbox_error=reason)
        result = ExecResult(Outcome.FINISHED, report.returncode, captured.stdout, captured.stderr, elapsed)
        return self._with_fetched(result, request, report)

    @staticmethod
    def _with_fetched(result: ExecResult, request: RunRequest, report: fetch.InitReport) -> ExecResult:
        if request.fetch_files:
            result.files, result.notes = fetch.read_answer(report.answer, request.fetch_files)
        return result

    def _settle(self, slot: Slot | None, init_pid: int | None) -> None:
        """Reap the run's init if it was orphaned (see sandbox/reaper.py), then check that the slot
        charges no pid, so the next run gets all of `pids.max`."""
        if init_pid is not None:
            self.reaper.reap(init_pid, SETTLE_S)
        if slot is not None and not slot.wait_uncharged(SETTLE_S):
            log.warning("slot %s still charges %d pids after the run", slot.dirs, slot.charged_pids())

    # ---- start-up probe ---------------------------------------------------------------------
    def probe(self) -> Guarantees:
        g = Guarantees()
        pool_reason = f"no usable cgroup: {self._pool_error}"
        g.set("memory_limit", self.pool is not None, pool_reason)
        g.set("pids_limit", self.pool is not None, pool_reason)
        g.set("kill_all_on_timeout", self.pool is not None, pool_reason)
        if self.pool is not None and self.pool.version == 1:
            memsw = os.path.join(self.pool.slots[0].dirs["memory"], "memory.memsw.limit_in_bytes")
            if not os.path.exists(memsw) and _swap_enabled():
                g.set("memory_limit", False, "memory.memsw missing and swap is on: limit can be evaded")
        if self.bwrap is None:
            for name in ("no_network", "readonly_root", "private_workdir", "non_root_user", "rlimits"):
                g.set(name, False, "bubblewrap (bwrap) not found on PATH")
            return g
        run_probe(self, g, uid_is_host_non_root=self.setpriv is not None)
        return g

    def stats(self) -> dict[str, float]:
        return {"cgroup_slots": float(len(self.pool.slots)) if self.pool else 0.0,
                "cgroup_version": float(self.pool.version) if self.pool else 0.0}

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None


def _swap_enabled() -> bool:
    try:
        with open("/proc/swaps") as fh:
            return len(fh.read().strip().splitlines()) > 1
    except OSError:
        return False
