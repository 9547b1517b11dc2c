"""Local backend: bubblewrap namespaces + a pooled cgroup + rlimits, no daemon needed.

Each run: take a cgroup slot, set its memory/pids limits, then start
`sgrpo-launch <uid 65534> <rlimits> <cgroup> -- bwrap ... python3 main.py` (a static C helper
built once, see sandbox/launcher; without a compiler the same steps run as
`sh -c 'join cgroup; ulimit ...; exec setpriv <uid 65534> bwrap ...'`). The root step only joins
the cgroup before anything untrusted runs (so every descendant is accounted and killable), then
drops to uid 65534 for good. bwrap gives a private network (no
interfaces but lo), pid, ipc, uts and user namespace, a read-only root made of /usr only, and a
fresh size-capped tmpfs /work that vanishes with the mount namespace.
"""

from __future__ import annotations

import logging
import math
import os
import shlex
import shutil
import subprocess
import threading
import time

from ..api import RUN_ERROR, RUN_FINISHED, RUN_MEMORY, RUN_TIMEOUT, ExecResult, RunRequest
from ..boot import boot_source, site_dirs
from ..cgroups import LEAF_PREFIX, CgroupPool, Slot, create_pool
from ..launcher import build_launcher
from ..probe import run_probe
from ..reaper import OrphanReaper
from .base import Backend, Guarantees
from .pump import pump

log = logging.getLogger(__name__)

SANDBOX_UID = 65534
WORKDIR = "/work"
WORKDIR_BYTES = 64 << 20
PIDS_MAX = 64
SETTLE_S = 0.5  # how long a finished run's orphaned sandbox init may take to exit and be reaped
NOFILE = 256
FSIZE_BYTES = 64 << 20
PYTHON = "/usr/bin/python3"
# -E: ignore PYTHON* env; -s: no user site; -S: no `site` (sandbox/boot.py restores what code
# relies on, ~5 ms cheaper). Not -I: the script dir must stay importable for injected helpers.
PYTHON_FLAGS = ("-E", "-s", "-S")
MOUNTED_ROOTS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32")
ETC_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf")
SANDBOX_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": WORKDIR, "LANG": "C.UTF-8",
               "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}



def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, 0)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


class LocalBackend(Backend):
    """bubblewrap + cgroup slots; `pool_size` bounds concurrent executions."""

    name = "local"

    def __init__(self, pool_size: int = 4, python_flags: tuple[str, ...] = PYTHON_FLAGS,
                 launcher: str = "auto") -> None:
        if launcher not in ("auto", "shell"):
            raise ValueError(f"launcher must be 'auto' or 'shell', got {launcher!r}")
        self.pool_size = pool_size
        self.python_flags = python_flags
        self.boot = boot_source(WORKDIR, "main.py", _site_dirs())
        self.bwrap = shutil.which("bwrap")
        self.setpriv = shutil.which("setpriv")
        self.launch = build_launcher() if launcher == "auto" else None
        self.pool: CgroupPool | None = None
        self._pool_error = ""
        self._fallback_sem = threading.BoundedSemaphore(pool_size)
        try:
            self.pool = create_pool(pool_size)
        except OSError as err:
            self._pool_error = str(err)
            log.warning("no cgroup pool: %s", err)
        self._guarantees: Guarantees | None = None
        self.reaper = OrphanReaper()

    # ---- command construction -------------------------------------------------------------
    def _bwrap_args(self, fd_map: list[tuple[int, str]], dirs: list[str]) -> list[str]:
        args = [self.bwrap or "bwrap", "--unshare-all", "--unshare-user",
                "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
                "--die-with-parent", "--new-session", "--clearenv", "--hostname", "sandbox",
                "--ro-bind", "/usr", "/usr"]
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
        args += ["--proc", "/proc", "--dev", "/dev", "--size", str(WORKDIR_BYTES), "--tmpfs", "/tmp",
                 "--size", str(WORKDIR_BYTES), "--tmpfs", WORKDIR]
        for d in dirs:
            args += ["--dir", f"{WORKDIR}/{d}"]
        for fd, path in fd_map:
            args += ["--file", str(fd), f"{WORKDIR}/{path}"]
        args += ["--chdir", WORKDIR, "--remount-ro", "/", PYTHON, *self.python_flags, "-c", self.boot, "main.py"]
        return args

    def _launch_prefix(self, slot: Slot | None, run_timeout: float) -> list[str]:
        """The root step before bwrap: join the cgroup, set rlimits, drop to uid 65534 for good.

        `sgrpo-launch` (static C, see sandbox/launcher) when it could be built, else the same
        steps as a root shell snippet ending in `exec setpriv`."""
        cgroup_files = slot.attach_files if slot else []
        cpu = max(1, math.ceil(run_timeout)) + 1
        if self.launch is not None:
            return [self.launch, str(SANDBOX_UID), str(SANDBOX_UID), str(cpu), str(FSIZE_BYTES), str(NOFILE),
                    *cgroup_files, "--"]
        steps = [f"echo $$ > {shlex.quote(f)}" for f in cgroup_files]
        steps += [f"ulimit -t {cpu}", f"ulimit -f {FSIZE_BYTES // 512}", f"ulimit -n {NOFILE}", "ulimit -c 0"]
        drop = (f"{self.setpriv} --reuid={SANDBOX_UID} --regid={SANDBOX_UID} --clear-groups "
                if self.setpriv else "")
        steps.append(f'exec {drop}"$@"')
        return ["/bin/sh", "-c", " && ".join(steps), "sandbox-launch"]

    # ---- execution --------------------------------------------------------------------------
    def run(self, request: RunRequest, max_output_bytes: int) -> ExecResult:
        if self.pool is not None:
            slot = self.pool.acquire()
        else:
            self._fallback_sem.acquire()
            slot = None
        fds: list[int] = []
        try:
            if slot is not None:
                slot.set_limits(request.memory_limit_mb << 20, PIDS_MAX)
                oom_before, fail_before = slot.oom_kills(), slot.memory_failures()
            fds.append(_memfd("main.py", request.code.encode()))
            fd_map = [(fds[0], "main.py")]
            dirs: set[str] = set()
            for path, data in request.files.items():
                fds.append(_memfd("file", data))
                fd_map.append((fds[-1], path))
                parent = os.path.dirname(path)
                while parent:
                    dirs.add(parent)
                    parent = os.path.dirname(parent)
            return self._execute(request, slot, fd_map, sorted(dirs, key=len), max_output_bytes,
                                 (oom_before, fail_before) if slot else (0, 0))
        finally:
            for fd in fds:
                os.close(fd)
            if slot is not None:
                self.pool.release(slot)  # type: ignore[union-attr]
            else:
                self._fallback_sem.release()

    def _execute(self, request: RunRequest, slot: Slot | None, fd_map: list[tuple[int, str]],
                 dirs: list[str], max_output_bytes: int, before: tuple[int, int]) -> ExecResult:
        if self.bwrap is None:
            return ExecResult(RUN_ERROR, None, "", "", 0.0, sandbox_error="bubblewrap (bwrap) is not installed")
        cmd = [*self._launch_prefix(slot, request.run_timeout), *self._bwrap_args(fd_map, dirs)]
        start = time.monotonic()
        proc = self.reaper.spawn(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                pass_fds=[fd for fd, _ in fd_map], start_new_session=True,
                                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        try:
            captured = pump(proc, request.stdin, start + request.run_timeout, max_output_bytes)
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
        self._settle(slot)
        if captured.stderr.startswith(("sandbox-launch:", "bwrap:", "setpriv:")):  # never user output
            return ExecResult(RUN_ERROR, rc, "", "", elapsed, sandbox_error=captured.stderr.strip()[:2000])
        status = RUN_FINISHED
        if captured.timed_out or rc in (-24, 128 + 24):  # wall deadline, or SIGXCPU from RLIMIT_CPU
            status = RUN_TIMEOUT
        elif slot is not None and (slot.oom_kills() > before[0] or (
                slot.memory_failures() > before[1] and "MemoryError" in captured.stderr[-300:])):
            status = RUN_MEMORY
        elif rc < 0 or rc > 128:
            status = RUN_ERROR
        return ExecResult(status, rc, captured.stdout, captured.stderr, elapsed)

    def _settle(self, slot: Slot | None) -> None:
        """Reap this run's orphaned sandbox init (see sandbox/reaper.py) before the slot is reused."""
        if slot is None or not self.reaper.enabled:
            self.reaper.reap()
        elif not slot.wait_uncharged(self.reaper.reap, SETTLE_S):
            log.warning("slot %s still charges %d pids after the run", slot.dirs, slot.charged_pids())

    # ---- start-up probe ---------------------------------------------------------------------
    def probe(self) -> Guarantees:
        g = Guarantees()
        if self.bwrap is None:
            for name in ("no_network", "readonly_root", "private_workdir"):
                g.set(name, False, "bubblewrap (bwrap) not found on PATH")
        pool_reason = f"no usable cgroup: {self._pool_error}"
        g.set("memory_limit", self.pool is not None, pool_reason)
        g.set("pids_limit", self.pool is not None, pool_reason)
        g.set("kill_all_on_timeout", self.pool is not None, pool_reason)
        if self.pool is not None and self.pool.version == 1:
            memsw = os.path.join(self.pool.slots[0].dirs["memory"], "memory.memsw.limit_in_bytes")
            if not os.path.exists(memsw) and _swap_enabled():
                g.set("memory_limit", False, "memory.memsw missing and swap is on: limit can be evaded")
        if self.bwrap is None:
            g.set("non_root_user", False, "no bwrap")
            g.set("rlimits", False, "no bwrap")
            self._guarantees = g
            return g
        run_probe(self, g, uid_is_host_non_root=self.launch is not None or self.setpriv is not None)
        self._guarantees = g
        return g

    def stats(self) -> dict[str, float]:
        return {"static_launcher": float(self.launch is not None),
                "cgroup_slots": float(len(self.pool.slots)) if self.pool else 0.0,
                "cgroup_version": float(self.pool.version) if self.pool else 0.0}

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None


def _site_dirs() -> list[str]:
    try:
        return site_dirs(PYTHON, MOUNTED_ROOTS)
    except (OSError, subprocess.SubprocessError, ValueError) as err:
        log.warning("could not list %s's site-packages dirs (%s): sandboxed code sees the stdlib only", PYTHON, err)
        return []


def _swap_enabled() -> bool:
    try:
        with open("/proc/swaps") as fh:
            return len(fh.read().strip().splitlines()) > 1
    except OSError:
        return False


def leftover_cgroups() -> list[str]:
    """sgrpo sandbox cgroup dirs that exist right now (tests use it to prove cleanup)."""
    found = []
    for root, dirs, _ in os.walk("/sys/fs/cgroup"):
        for d in dirs:
            if d.startswith(LEAF_PREFIX):
                found.append(os.path.join(root, d))
        dirs[:] = [d for d in dirs if not d.startswith(LEAF_PREFIX)]
    return found

