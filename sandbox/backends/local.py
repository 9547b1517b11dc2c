"""Local backend: warm bubblewrap sandboxes in pooled cgroups, with rlimits; no daemon needed.

Each place of the pool is a cgroup slot (memory + pids). A sandbox is started in it once:
`sh -c 'echo $$ > slot/cgroup.procs; ulimit ...; exec setpriv <uid 65534> bwrap ... python3 -c RUNNER'`.
The root shell only joins the cgroup before anything untrusted runs (so every descendant is
accounted and killable), sets the rlimits and drops to uid 65534 for good. bwrap gives a private
network (no interfaces but lo), pid, ipc, uts and user namespace, a read-only root made of /usr
only, and size-capped tmpfs /work, /tmp and /dev/shm plus an mqueue mount. Its pid 1
(`--as-pid-1`) is the resident runner (resident_runner.py, the Docker pool's own), which spawns
each run as a fresh `python3 -E -s main.py`, reports its wait status (-N for a death by signal N),
and proves the sandbox clean before the next run (resident.py holds the host side both backends
share). So a run pays one interpreter start, not bwrap's setup, a cgroup and a second interpreter.

`mode="cold"` starts a fresh sandbox for every run and drops it after: fresh namespaces per run,
at the old cost (the benchmark's baseline for what the warm pool buys).

**Without root** (a laptop, a cluster login node) the same sandboxes start unprivileged: bwrap makes
the user namespace itself, the service's own uid is already not root (no setpriv, which would need
CAP_SETGID), and the cgroup pool is used where the service may write one (a delegated cgroup).
Without one, the pids limit comes from RLIMIT_NPROC set *inside* the sandbox's user namespace
(`prlimit` as pid 1, before the runner): since Linux 5.14 that limit counts only the processes of
that namespace, so each sandbox gets its own 64; the start-up probe checks it by forking past it.
The runner, pid 1 of the sandbox's pid namespace, kills every process it has at a run's deadline,
so kill-all holds without a cgroup (probed with a `setsid` escapee, as the Docker backend is). No
unprivileged mechanism bounds a whole sandbox's memory, so `memory_limit` is reported missing with
the reason, and the service refuses to start unless `--allow-weaker-isolation`.
"""

from __future__ import annotations

import json
import logging
import os
import select
import shlex
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..api import DEFAULT_MEMORY_MB, WORKDIR, Outcome, RunRequest
from ..cgroups import CgroupPool, Slot, create_pool
from ..probe import run_probe
from ..reaper import OrphanReaper
from .base import Guarantees
from .channel import ChannelError, PipeChannel
from .resident import Box, BoxError, ResidentPool

log = logging.getLogger(__name__)

SANDBOX_UID = 65534
SCRATCH_BYTES = 64 << 20  # each of /work, /tmp and /dev/shm
PIDS_MAX = 64
START_TIMEOUT_S = 30.0  # for bwrap's setup and the runner's first frame
SETTLE_S = 0.5  # how long a killed sandbox's orphaned runner may take to exit and be reaped
NOFILE = 256
FSIZE_BYTES = 64 << 20
PYTHON = "/usr/bin/python3"
PRLIMIT = "/usr/bin/prlimit"  # util-linux; sets RLIMIT_NPROC inside the namespace when there is no cgroup
ETC_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/etc/passwd", "/etc/group", "/etc/nsswitch.conf")
SANDBOX_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": WORKDIR, "LANG": "C.UTF-8",
               "PYTHONDONTWRITEBYTECODE": "1"}
HOST_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
# Fork sleeping children until the kernel refuses; print how many it allowed.
PIDS_PROBE = """
import os, sys, time
n, want = 0, int(sys.stdin.read())
for _ in range(want):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    n += 1
print(n)
"""
# A child that leaves the run's session and outlives its deadline.
SETSID_PROBE = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nelse:\n    time.sleep(60)\n"


@dataclass
class _Sandbox:
    """The host's handles on one bwrap sandbox."""

    proc: subprocess.Popen  # the launcher, then bwrap's monitor (same pid)
    status_r: int  # bwrap's --json-status-fd
    runner_pid: int | None  # host pid of pid 1 inside, the resident runner


def _bwrap_status(status_r: int, deadline: float) -> int | None:
    """The host pid of bwrap's child (our runner) from its first `--json-status-fd` line."""
    buf = b""
    while b"\n" not in buf:
        ready, _, _ = select.select([status_r], [], [], max(deadline - time.monotonic(), 0))
        chunk = os.read(status_r, 4096) if ready else b""
        if not chunk:
            return None
        buf += chunk
    try:
        doc = json.loads(buf.split(b"\n", 1)[0])
    except ValueError:
        return None
    return doc.get("child-pid") if isinstance(doc, dict) and isinstance(doc.get("child-pid"), int) else None


def _write_limits(slot: Slot, memory_mb: int) -> None:
    """Set a slot's limits (only between runs, once the runner wiped the last run's files: a limit
    below what they hold is refused on v1 and OOM-kills the runner on v2)."""
    try:
        slot.set_limits(memory_mb << 20, PIDS_MAX)
    except OSError as err:
        raise BoxError(f"cannot set the memory limit to {memory_mb} MB: {err}") from err


class LocalBackend(ResidentPool):
    """bubblewrap + cgroup slots; `pool_size` bounds concurrent executions."""

    name = "local"

    def __init__(self, pool_size: int = 4, mode: str = "resident") -> None:
        self.pool_size = pool_size
        self.memory_mb = DEFAULT_MEMORY_MB
        self.bwrap = shutil.which("bwrap")
        # As root the launcher drops to uid 65534 for good; without root it already runs as a user
        # that is not root and could not drop (setgroups needs CAP_SETGID): bwrap maps it to 65534.
        self.privileged = os.geteuid() == 0
        self.setpriv = shutil.which("setpriv") if self.privileged else None
        self.pool: CgroupPool | None = None
        self._pool_error = ""
        try:
            self.pool = create_pool(pool_size)
        except OSError as err:
            self._pool_error = str(err)
            log.warning("no cgroup pool: %s", err)
        self.reaper = OrphanReaper()
        # bwrap's --die-with-parent (PR_SET_PDEATHSIG) fires when the *thread* that started it ends:
        # every sandbox is started from this one thread, which lives as long as the backend
        self._starter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandbox-start")
        super().__init__(mode, list(self.pool.slots) if self.pool else [None] * pool_size)
        self._warm_up()

    # ---- command construction -------------------------------------------------------------
    def _bwrap_args(self, status_fd: int, command: list[str]) -> list[str]:
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
        args += ["--proc", "/proc", "--dev", "/dev", "--mqueue", "/dev/mqueue"]
        for scratch in ("/tmp", WORKDIR, "/dev/shm"):
            args += ["--size", str(SCRATCH_BYTES), "--tmpfs", scratch]
        return [*args, "--remount-ro", "/dev", "--chdir", WORKDIR, "--remount-ro", "/", *command]

    def _runner_command(self, python: str) -> list[str]:
        """pid 1: the runner; without a cgroup pool, behind `prlimit --nproc`, which sets the pids
        limit after bwrap made the user namespace (set before it, the limit would count every process
        of the host user, the service and its caller included)."""
        command = super()._runner_command(python)
        if self.pool is None and os.path.exists(PRLIMIT):
            return [PRLIMIT, f"--nproc={PIDS_MAX}:{PIDS_MAX}", *command]
        return command

    def _launch_prefix(self, slot: Slot | None) -> list[str]:
        """The step before bwrap: join the cgroup, set rlimits, and as root drop to uid 65534 for good."""
        steps = [f"echo $$ > {shlex.quote(f)}" for f in (slot.attach_files if slot else [])]
        steps += [f"ulimit -f {FSIZE_BYTES // 512}", f"ulimit -n {NOFILE}", "ulimit -c 0"]
        drop = (f"{self.setpriv} --reuid={SANDBOX_UID} --regid={SANDBOX_UID} --clear-groups "
                if self.setpriv else "")
        steps.append(f'exec {drop}"$@"')
        return ["/bin/sh", "-c", " && ".join(steps), "sandbox-launch"]

    # ---- the pool's sandboxes ---------------------------------------------------------------
    def _new_box(self, place: object, memory_mb: int) -> Box:
        if self.bwrap is None:
            raise BoxError("bubblewrap (bwrap) is not installed")
        slot = place if isinstance(place, Slot) else None
        if slot is not None:
            slot.kill_all()  # whatever a dropped sandbox left
            _write_limits(slot, memory_mb)
        status_r, status_w = os.pipe()
        (in_r, in_w), (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe(), os.pipe()
        cmd = [*self._launch_prefix(slot), *self._bwrap_args(status_w, self._runner_command(PYTHON))]
        try:
            proc = self._starter.submit(self.reaper.spawn, cmd, stdin=in_r, stdout=out_w, stderr=err_w,
                                        pass_fds=[status_w], start_new_session=True, env=HOST_ENV).result()
        except OSError as err:
            for fd in (status_r, in_w, out_r, err_r):
                os.close(fd)
            raise BoxError(f"cannot start bwrap: {err}") from err
        finally:
            for fd in (status_w, in_r, out_w, err_w):  # the child's ends live in the child only
                os.close(fd)
        channel = PipeChannel(in_w, out_r, err_r, f"local sandbox {proc.pid}")
        sandbox = _Sandbox(proc, status_r, None)
        box = Box(slot, channel, memory_mb, channel.name, cgroup=slot, handle=sandbox)
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            channel.receive(deadline)  # the runner's "ready": bwrap set the sandbox up
            sandbox.runner_pid = _bwrap_status(status_r, deadline)
        except (ChannelError, ValueError) as err:
            self._kill(box)
            proc.wait()
            reason = channel.drain_stderr().strip()[-2000:] or str(err)
            self._drop(box)
            raise BoxError(f"the sandbox did not start: {reason}") from err
        box.keep = frozenset({proc.pid, sandbox.runner_pid or proc.pid})
        return box

    def _set_memory(self, box: Box, memory_mb: int) -> None:
        if box.cgroup is not None:
            _write_limits(box.cgroup, memory_mb)

    def _kill(self, box: Box) -> None:
        sandbox: _Sandbox = box.handle  # type: ignore[assignment]
        if box.cgroup is not None:
            box.cgroup.kill_all()
        try:  # bwrap's monitor; the runner dies with it (--die-with-parent), and the pid ns with the runner
            os.killpg(sandbox.proc.pid, 9)
        except ProcessLookupError:
            pass

    def _drop(self, box: Box) -> None:
        sandbox: _Sandbox = box.handle  # type: ignore[assignment]
        self._kill(box)
        box.channel.close()
        sandbox.proc.wait()
        self.reaper.forget(sandbox.proc.pid)
        if sandbox.runner_pid is not None:  # orphaned when bwrap died first: reaped here (reaper.py)
            self.reaper.reap(sandbox.runner_pid, SETTLE_S)
        os.close(sandbox.status_r)
        slot = box.cgroup
        try:
            if slot is not None and not slot.wait_uncharged(SETTLE_S):
                log.warning("slot %s still charges %d pids after its sandbox ended", slot.dirs, slot.charged_pids())
        except OSError:  # the pool was closed meanwhile: its slots are gone
            pass

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
        run_probe(self, g, uid_is_host_non_root=not self.privileged or self.setpriv is not None)
        if self.pool is None:
            self._probe_without_cgroup(g, pool_reason)
        return g

    def _probe_without_cgroup(self, g: Guarantees, pool_reason: str) -> None:
        """What holds without a cgroup, run for real: the namespace's own pids limit (fork past it)
        and the kill of every process at the deadline (a `setsid` escapee must not survive)."""
        if not os.path.exists(PRLIMIT):
            g.set("pids_limit", False, f"{pool_reason}; and no {PRLIMIT} to set RLIMIT_NPROC in the namespace")
        else:
            forked = self.run(RunRequest(code=PIDS_PROBE, stdin=str(PIDS_MAX + 16).encode(), run_timeout=30), 1 << 12)
            try:
                n = int(forked.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                n = -1
            g.set("pids_limit", 0 < n < PIDS_MAX,
                  f"{pool_reason}; RLIMIT_NPROC in the sandbox's user namespace did not stop a fork bomb "
                  f"({n} of {PIDS_MAX + 16} forks succeeded; the kernel may count the host user's processes)")
        killed = self.run(RunRequest(code=SETSID_PROBE, run_timeout=1), 1024)
        g.set("kill_all_on_timeout", killed.outcome is Outcome.TIMEOUT,
              f"{pool_reason}; the timeout probe ended {killed.outcome.value}")
        if not g.held["memory_limit"]:
            g.set("memory_limit", False, f"{pool_reason}; without a cgroup nothing bounds a whole sandbox's "
                  "memory (not root: give the service a delegated cgroup, or run it as root)")

    def stats(self) -> dict[str, float]:
        return {"cgroup_slots": float(len(self.pool.slots)) if self.pool else 0.0,
                "cgroup_version": float(self.pool.version) if self.pool else 0.0, **self.pool_stats("local")}

    def close(self) -> None:
        super().close()
        self._starter.shutdown(wait=False)
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        self.reaper.close()


def _swap_enabled() -> bool:
    try:
        with open("/proc/swaps") as fh:
            return len(fh.read().strip().splitlines()) > 1
    except OSError:
        return False
