"""Docker backend: a warm pool of locked-down containers, or one fresh container per run (cold).

Warm: each container idles under a tiny pid-1 reaper; a run is one `docker exec` of
`sh -c RUN` whose prefix wipes /work, /tmp and /dev/shm and proves the container clean, then
`timeout -s KILL T python3 -c BOOT` unpacks code/files from stdin into the tmpfs /work and runs
the program. Afterwards every other process is SIGKILLed (from the host's view of the container
cgroup, else by a cleanup exec); a container that fails the proof, was OOM-killed or died is
removed and replaced in the background, so the pool heals.
Resident: the same pool, but pid 1 is `resident_runner.py`, which spawns that same `sh -c RUN`
command itself for each job sent over the attached stdin, skipping runc's ~100 ms per exec.
Cold (for the benchmark baseline): `docker run` semantics, one container per execution.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import docker
from docker.errors import APIError, DockerException, NotFound
from docker.types import Ulimit

from ..api import DEFAULT_MEMORY_MB, RUN_ERROR, RUN_FINISHED, RUN_MEMORY, RUN_TIMEOUT, ExecResult, RunRequest
from ..cgroups import Slot, slot_of_process
from ..output import CappedBuffer
from ..probe import run_probe
from .base import Backend, Guarantees
from .docker_stream import ChannelError, ResidentChannel, exchange

log = logging.getLogger(__name__)

DEFAULT_IMAGE = "sgrpo-sandbox:latest"
MODES = ("warm", "resident", "cold")
ENV_FILE = os.path.join(os.environ.get("SGRPO_DOCKER_DIR", "/tmp/sgrpo-docker"), "env")
USER = "65534:65534"
PIDS_LIMIT = 64
NANO_CPUS = 1_000_000_000
TMPFS = {"/work": "rw,exec,size=64m,mode=1777", "/tmp": "rw,size=64m,mode=1777"}
ULIMITS = [Ulimit(name="nofile", soft=256, hard=256), Ulimit(name="core", soft=0, hard=0),
           Ulimit(name="fsize", soft=64 << 20, hard=64 << 20)]
GRACE_S = 5.0
LABEL = "sgrpo-sandbox"

# pid 1 of a warm container: reaps orphans (SIGKILL from inside the pid ns cannot touch pid 1),
# and exits when its stdin, held by the service, closes: a killed service leaves no container.
REAPER = ("import os, signal, threading\nsignal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])\n"
          "threading.Thread(target=lambda: (os.read(0, 1), os._exit(0)), daemon=True).start()\nwhile True:\n"
          "    signal.sigwait([signal.SIGCHLD])\n    try:\n        while os.waitpid(-1, os.WNOHANG)[0]: pass\n"
          "    except ChildProcessError: pass\n")
# Reads a length-prefixed JSON header from unbuffered stdin (the rest stays for the program), writes
# the files, then runs main.py in this same interpreter (one Python start-up per run, not two).
BOOT = ("import base64, json, os, sys\ndef rd(n):\n    b = b''\n    while len(b) < n:\n"
        "        c = os.read(0, n - len(b))\n        if not c: break\n        b += c\n    return b\n"
        "m = json.loads(rd(int(rd(10))))\nfor p, d in m['files'].items():\n"
        "    os.makedirs(os.path.dirname(p) or '.', exist_ok=True)\n"
        "    open(p, 'wb').write(base64.b64decode(d))\nopen('main.py', 'w').write(m['code'])\n"
        "sys.argv = ['main.py']\ng = {'__name__': '__main__', '__file__': 'main.py', '__builtins__': __builtins__}\n"
        "exec(compile(m['code'], 'main.py', 'exec'), g)\n")
CLEANUP = ("i=0; while :; do kill -9 -1 2>/dev/null; set -- /proc/[0-9]*; [ $# -le 2 ] && break; "
           "i=$((i+1)); [ $i -ge 100 ] && break; sleep 0.02; done; n=$#; "
           "chmod -R u+rwx /work /tmp /dev/shm 2>/dev/null; "
           "for d in /work /tmp /dev/shm; do find $d -mindepth 1 -delete 2>/dev/null; done; "
           "left=$(ls -A /work /tmp /dev/shm | grep -cv -e '^/' -e '^$'); "
           "oom=$(cat /sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/memory.events 2>/dev/null "
           "| sed -n 's/^oom_kill //p' | head -n 1); echo \"procs=$n left=$left oom=${oom:--1}\"")
SCRATCH_GLOBS = " ".join(f"{d}/* {d}/.[!.]* {d}/..?*" for d in ("/work", "/tmp", "/dev/shm"))
DIRTY_RC = 222
DIRTY_MARK = "sgrpo-sandbox: container not clean"
# Prefix of every warm run, before any untrusted code: wipe scratch dirs, then refuse to run
# (exit DIRTY_RC) unless only pid 1 and this shell exist and the dirs are empty.
RUN = ('t="$0"; b="$1"; rm -rf ' + SCRATCH_GLOBS + ' 2>/dev/null || { chmod -R u+rwx /work /tmp /dev/shm; '
       'rm -rf ' + SCRATCH_GLOBS + ' 2>/dev/null; }; set -- /proc/[0-9]*; '
       f'[ $# -le 2 ] || {{ echo "{DIRTY_MARK}: $# processes" >&2; exit {DIRTY_RC}; }}; '
       'for f in ' + SCRATCH_GLOBS + f'; do [ -e "$f" ] && {{ echo "{DIRTY_MARK}: $f" >&2; exit {DIRTY_RC}; }}; done; '
       'exec timeout -s KILL "$t" python3 -E -s -c "$b"')
with open(os.path.join(os.path.dirname(__file__), "resident_runner.py")) as _fh:
    RUNNER = _fh.read()  # shipped as `python3 -c` source: the image needs no rebuild for it


def docker_host() -> str | None:
    """DOCKER_HOST from the environment, else from scripts/docker_ci.sh's env file."""
    if os.environ.get("DOCKER_HOST"):
        return os.environ["DOCKER_HOST"]
    try:
        with open(ENV_FILE) as fh:
            for line in fh:
                if line.startswith("export DOCKER_HOST="):
                    return line.split("=", 1)[1].strip()
    except OSError:
        pass
    return None


def docker_client() -> docker.DockerClient:
    host = docker_host()
    return docker.DockerClient(base_url=host, timeout=120) if host else docker.from_env(timeout=120)


def _payload(request: RunRequest) -> bytes:
    header = json.dumps({"code": request.code,
                         "files": {p: base64.b64encode(d).decode() for p, d in request.files.items()}}).encode()
    return b"%010d" % len(header) + header + request.stdin


def _kept_output(reply: dict, key: str, cap: int) -> str:
    """Rebuild a capped stream from the runner's kept bytes and dropped count."""
    buf = CappedBuffer(cap)
    buf.write(base64.b64decode(reply[key]))
    buf.dropped += int(reply[f"{key}_dropped"])
    return buf.text()


@dataclass
class _Outcome:
    """What one run produced, whichever way it was started."""

    rc: int | None
    elapsed: float
    hung: bool
    stdout: str
    stderr: str


@dataclass
class _Box:
    """A pooled container and the memory limit it currently has."""

    container: object
    memory_mb: int
    oom_kills: int = 0  # the container cgroup's oom_kill counter after the last cleanup
    init_pid: int = 0  # host pid of the reaper or resident runner (pid 1 inside)
    cgroup: Slot | None = None  # the container's cgroups as seen from this host, when visible
    lifeline: socket.socket | None = None  # pid 1's attached stdin: closing it ends the container
    channel: ResidentChannel | None = None  # resident mode: the runner's stdin/stdout, on the lifeline


class DockerBackend(Backend):
    name = "docker"

    def __init__(self, image: str = DEFAULT_IMAGE, pool_size: int = 4, mode: str = "resident",
                 memory_mb: int = DEFAULT_MEMORY_MB) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.image, self.pool_size, self.mode, self.memory_mb = image, pool_size, mode, memory_mb
        self.client = docker_client()
        self.client.ping()
        self.client.images.get(image)  # fail fast: ImageNotFound names the image to build
        self.service_id = uuid.uuid4().hex[:12]
        self._free: queue.Queue[_Box] = queue.Queue()
        self._lock = threading.Lock()
        self._boxes: set[str] = set()
        self.recycled = 0
        self.replaced = 0
        self.closed = False
        if mode != "cold":
            for _ in range(pool_size):
                self._free.put(self._new_box())

    # ---- container lifecycle ----------------------------------------------------------------
    def _host_config(self, memory_mb: int) -> dict:
        return dict(network_mode="none", mem_limit=f"{memory_mb}m", memswap_limit=f"{memory_mb}m",
                    pids_limit=PIDS_LIMIT, nano_cpus=NANO_CPUS, read_only=True, tmpfs=dict(TMPFS),
                    cap_drop=["ALL"], security_opt=["no-new-privileges"], ulimits=ULIMITS)

    def _container_config(self) -> dict:
        return dict(user=USER, working_dir="/work", labels={LABEL: self.service_id},
                    environment={"HOME": "/work", "LANG": "C.UTF-8"})

    def _container_kwargs(self, memory_mb: int, command: list[str]) -> dict:
        return dict(image=self.image, command=command, **self._container_config(), **self._host_config(memory_mb))

    def _new_box(self) -> _Box:
        # pid 1 (runner or reaper) exits when the stdin this service holds closes, i.e. when the
        # service goes away, even by SIGKILL; auto_remove then leaves no stopped container behind
        pid1 = [RUNNER, RUN, BOOT] if self.mode == "resident" else [REAPER]
        c = self.client.containers.create(stdin_open=True, auto_remove=True, **self._container_kwargs(
            self.memory_mb, ["python3", "-E", "-s", "-c", *pid1]))
        with self._lock:
            self._boxes.add(c.id)
        box = _Box(c, self.memory_mb)
        try:
            # attach before start, so no byte of the runner is missed
            streams = {"stdout": 1, "stderr": 1} if self.mode == "resident" else {}
            sock = c.attach_socket(params={"stdin": 1, "stream": 1, **streams})
            box.lifeline = getattr(sock, "_sock", sock)
            if self.mode == "resident":
                box.channel = ResidentChannel(box.lifeline, c.short_id)
            c.start()
            if box.channel is not None:
                box.oom_kills = max(int(box.channel.receive(time.monotonic() + 60)["oom_kills"]), 0)
            c.reload()
        except (DockerException, ChannelError):
            self._discard(box)
            raise
        box.init_pid = int(c.attrs["State"].get("Pid") or 0)
        box.cgroup = slot_of_process(box.init_pid) if box.init_pid else None
        return box

    def _discard(self, box: _Box) -> None:
        if box.lifeline is not None:
            try:
                box.lifeline.close()
            except OSError:
                pass
        with self._lock:
            self._boxes.discard(box.container.id)
        try:
            box.container.remove(force=True)
        except (NotFound, APIError):
            pass

    def _replace(self, box: _Box) -> None:
        """Heal the pool: drop a suspect container and add a fresh one."""
        self._discard(box)
        if self.closed:
            return
        self.replaced += 1
        try:
            self._free.put(self._new_box())
        except (DockerException, ChannelError):
            log.exception("could not replace a sandbox container; pool shrinks by one")

    # ---- execution --------------------------------------------------------------------------
    def run(self, request: RunRequest, max_output_bytes: int) -> ExecResult:
        if self.mode == "cold":
            return self._run_cold(request, max_output_bytes)
        for attempt in range(2):
            box = self._free.get()
            try:
                if box.memory_mb != request.memory_limit_mb:
                    box.container.update(mem_limit=f"{request.memory_limit_mb}m",
                                         memswap_limit=f"{request.memory_limit_mb}m")
                    box.memory_mb = request.memory_limit_mb
                if self.mode == "resident":
                    result = self._run_resident(box, request, max_output_bytes)
                else:
                    exec_id = self.client.api.exec_create(
                        box.container.id, ["sh", "-c", RUN, f"{request.run_timeout}s", BOOT],
                        stdin=True, user=USER, workdir="/work")["Id"]
                    result = self._exec(box, exec_id, request, max_output_bytes)
            except (NotFound, APIError, ChannelError) as err:  # died before the code ran: heal, retry once
                log.warning("sandbox container unusable (%s); replacing", err)
                threading.Thread(target=self._replace, args=(box,), daemon=True).start()
                if attempt:
                    raise
                continue
            if result is not None:
                return result
        return ExecResult(RUN_ERROR, None, "", "", 0.0, sandbox_error="no clean sandbox container available")

    def _exec(self, box: _Box, exec_id: str, request: RunRequest, cap: int) -> ExecResult | None:
        """One run by `docker exec`; None if the container refused it as not clean (it is then replaced)."""
        oom_before = box.cgroup.oom_kills() if box.cgroup else 0
        start = time.monotonic()
        sock = self.client.api.exec_start(exec_id, socket=True)
        raw = getattr(sock, "_sock", sock)
        try:
            stdout, stderr, hung = exchange(raw, _payload(request), start + request.run_timeout + GRACE_S, cap)
        finally:
            raw.close()
        elapsed = time.monotonic() - start
        rc = self.client.api.exec_inspect(exec_id).get("ExitCode")
        if self._refused_as_dirty(box, rc, stderr):
            return None
        return self._settle(box, request, _Outcome(rc, elapsed, hung, stdout, stderr), oom_before,
                            lambda: self._cleanup(box))

    def _run_resident(self, box: _Box, request: RunRequest, cap: int) -> ExecResult | None:
        """One run by the container's resident runner; None if it refused it as not clean.

        Raises ChannelError (started=False) when the runner was gone before it took the job.
        """
        assert box.channel is not None
        try:
            oom_before = box.cgroup.oom_kills() if box.cgroup else 0
        except OSError as err:  # the container's cgroup is gone: so is the container
            raise ChannelError(f"container {box.container.short_id} is gone ({err})") from err
        start = time.monotonic()
        job = {"timeout": request.run_timeout, "grace": GRACE_S, "cap": cap}
        try:
            reply = box.channel.call(job, _payload(request), start + request.run_timeout + 3 * GRACE_S)
        except ChannelError as err:
            if not err.started:
                raise
            return self._lost_mid_run(box, err, time.monotonic() - start, oom_before)
        out, err_out = _kept_output(reply, "out", cap), _kept_output(reply, "err", cap)
        if self._refused_as_dirty(box, reply["rc"], err_out):
            return None
        return self._settle(box, request, _Outcome(reply["rc"], reply["elapsed"], reply["hung"], out, err_out),
                            oom_before, lambda: (reply["procs_left"] == 0, int(reply["oom_kills"])))

    def _lost_mid_run(self, box: _Box, err: ChannelError, elapsed: float, oom_before: int) -> ExecResult:
        """The runner died during a run (the OOM killer may pick pid 1 too): report it, heal the pool."""
        oom = False
        try:
            if box.cgroup is not None:
                oom = box.cgroup.oom_kills() > oom_before
            box.container.reload()
            oom = oom or bool(box.container.attrs["State"].get("OOMKilled"))
        except (DockerException, OSError, RuntimeError):
            pass
        log.warning("%s; replacing", err)
        threading.Thread(target=self._replace, args=(box,), daemon=True).start()
        if oom:
            return ExecResult(RUN_MEMORY, 137, "", "", elapsed)
        return ExecResult(RUN_ERROR, None, "", "", elapsed, sandbox_error=f"sandbox container lost during the run: {err}")

    def _refused_as_dirty(self, box: _Box, rc: int | None, stderr: str) -> bool:
        if rc == DIRTY_RC and stderr.startswith(DIRTY_MARK):
            log.warning("%s; replacing", stderr.strip())
            threading.Thread(target=self._replace, args=(box,), daemon=True).start()
            return True
        return False

    def _settle(self, box: _Box, request: RunRequest, run: _Outcome, oom_before: int,
                in_box_report: Callable[[], tuple[bool, int]]) -> ExecResult:
        """After a run: leftovers killed, OOM decided, the container recycled or replaced.

        With a host view of the container's cgroup we kill and count OOMs from here; otherwise
        `in_box_report` gives (provably clean?, the cgroup's oom_kill counter or -1) from inside.
        """
        if box.cgroup is not None:
            try:
                box.cgroup.kill_all(keep=frozenset({box.init_pid}))
                healthy, oom_kills = True, box.cgroup.oom_kills() - oom_before
            except (OSError, RuntimeError):
                healthy, oom_kills = False, -1
            oom = oom_kills > 0
        else:
            healthy, oom_kills = in_box_report()
            oom = oom_kills > box.oom_kills
            box.oom_kills = max(oom_kills, box.oom_kills)
        if oom_kills < 0 and run.rc == 137 and run.elapsed < request.run_timeout:
            # cgroup counter unreadable in the container: fall back to the engine's sticky flag
            box.container.reload()
            oom = bool(box.container.attrs["State"].get("OOMKilled"))
            healthy = healthy and not oom  # the flag only resets with a new container
        if healthy:
            self.recycled += 1
            self._free.put(box)
        else:
            threading.Thread(target=self._replace, args=(box,), daemon=True).start()
        status = self._status(run.rc, run.elapsed, request.run_timeout, run.hung, oom)
        return ExecResult(status, run.rc, run.stdout, run.stderr, run.elapsed)

    @staticmethod
    def _status(rc: int | None, elapsed: float, run_timeout: float, hung: bool, oom: bool) -> str:
        if hung or (rc in (124, 137) and elapsed >= run_timeout * 0.98):
            return RUN_TIMEOUT
        if oom:
            return RUN_MEMORY
        if rc is None or rc > 128:
            return RUN_ERROR
        return RUN_FINISHED

    def _cleanup(self, box: _Box) -> tuple[bool, int]:
        """Kill leftovers, wipe scratch dirs; (provably clean?, cgroup oom_kill count or -1)."""
        try:
            out = box.container.exec_run(["sh", "-c", CLEANUP], user=USER).output.decode()
            fields = dict(kv.split("=") for kv in out.split())
            return int(fields["procs"]) <= 2 and int(fields["left"]) == 0, int(fields["oom"])
        except (DockerException, ValueError, KeyError) as err:
            log.warning("cleanup failed (%s); container will be replaced", err)
            return False, -1

    def _run_cold(self, request: RunRequest, cap: int) -> ExecResult:
        command = ["timeout", "-s", "KILL", f"{request.run_timeout}s", "python3", "-E", "-s", "-c", BOOT]
        # docker-py sets StdinOnce with stdin_open, so our half-close reaches the program as EOF
        c = self.client.containers.create(stdin_open=True, **self._container_kwargs(request.memory_limit_mb, command))
        try:
            sock = c.attach_socket(params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
            raw = getattr(sock, "_sock", sock)
            start = time.monotonic()
            c.start()
            try:
                stdout, stderr, hung = exchange(raw, _payload(request), start + request.run_timeout + GRACE_S, cap)
            finally:
                raw.close()
            if hung:
                c.kill()
            rc = c.wait(timeout=30)["StatusCode"]
            elapsed = time.monotonic() - start
            c.reload()
            oom = bool(c.attrs["State"].get("OOMKilled"))
            return ExecResult(self._status(rc, elapsed, request.run_timeout, hung, oom), rc, stdout, stderr, elapsed)
        finally:
            c.remove(force=True)

    # ---- probe, stats, close ----------------------------------------------------------------
    def probe(self) -> Guarantees:
        g = Guarantees()
        run_probe(self, g)
        kw = self._container_kwargs(self.memory_mb, [])
        g.set("memory_limit", kw["mem_limit"] == kw["memswap_limit"], "memory != memswap")
        info = self.client.info()
        g.set("pids_limit", bool(info.get("PidsLimit", True)), "engine reports no pids cgroup support")
        if info.get("MemoryLimit") is False or info.get("SwapLimit") is False:
            g.set("memory_limit", False, "engine reports no memory/swap limit support")
        killed = self.run(RunRequest(code="import os, time\nif os.fork() == 0:\n    os.setsid()\n"
                                          "    time.sleep(60)\nelse:\n    time.sleep(60)\n", run_timeout=1), 1024)
        g.set("kill_all_on_timeout", killed.status == RUN_TIMEOUT, f"timeout probe ended {killed.status}")
        return g

    def stats(self) -> dict[str, float]:
        return {"docker_pool_free": float(self._free.qsize()), "docker_containers": float(len(self._boxes)),
                "docker_recycled_total": float(self.recycled), "docker_replaced_total": float(self.replaced)}

    def live_containers(self) -> list[str]:
        """Ids of containers labelled with this service (tests prove cleanup with it).

        The low-level list: the high-level one inspects every id, and a container that
        auto-removes in between would make it raise NotFound."""
        found = self.client.api.containers(all=True, filters={"label": f"{LABEL}={self.service_id}"})
        return [c["Id"] for c in found]

    def close(self) -> None:
        self.closed = True
        for cid in self.live_containers():
            try:
                self.client.api.remove_container(cid, force=True)
            except (NotFound, APIError):
                pass
        with self._lock:
            self._boxes.clear()
        self.client.close()
