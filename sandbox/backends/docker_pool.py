"""Docker backend: a warm pool of locked-down containers, or one fresh container per run (cold).

Resident pool (default): each container's pid 1 is `resident_runner.py`, which takes jobs over the
attached stdin: it proves the container clean, writes the code and files into the tmpfs /work,
spawns `python3 -E -s main.py` (as the local backend does), enforces the deadline and reports the
program's wait status (-N for a death by signal N), then wipes /work, /tmp, /dev/shm,
/dev/mqueue and SysV IPC objects. After a run every other process is SIGKILLed (from the host's
view of the container cgroup, and by the runner); a container that is not provably clean, was
OOM-killed or died is removed and replaced in the background, so the pool heals.
Cold (the benchmark baseline): one fresh resident-runner container per run, removed after it.

A run is classified only from what the service and its runner saw, never from the program's
output: the deadline the runner enforced, the container cgroup's oom_kill counter, and the
runner's acceptance of the job (refused when the container is not clean: the job then goes to
another container).
"""

from __future__ import annotations

import base64
import logging
import os
import queue
import socket
import threading
import time
import uuid
from dataclasses import dataclass

import docker
import requests
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.types import Ulimit

from .. import fetch
from ..api import DEFAULT_MEMORY_MB, MAX_FETCH_BYTES, ExecResult, Outcome, RunRequest
from ..cgroups import Slot, slot_of_process
from ..output import CappedBuffer
from ..probe import run_probe
from .base import Backend, EnvironmentMissing, Guarantees
from .docker_stream import ChannelError, ResidentChannel

log = logging.getLogger(__name__)

DEFAULT_IMAGE = "sgrpo-sandbox:latest"
MODES = ("resident", "cold")
ENV_FILE = os.path.join(os.environ.get("SGRPO_DOCKER_DIR", "/tmp/sgrpo-docker"), "env")
USER = "65534:65534"
PIDS_LIMIT = 64
NANO_CPUS = 1_000_000_000
SCRATCH = "size=64m,mode=1777"
TMPFS = {"/work": f"rw,exec,{SCRATCH}", "/tmp": f"rw,{SCRATCH}"}
SHM_BYTES = 64 << 20  # /dev/shm, capped like /work
ULIMITS = [Ulimit(name="nofile", soft=256, hard=256), Ulimit(name="core", soft=0, hard=0),
           Ulimit(name="fsize", soft=64 << 20, hard=64 << 20)]
GRACE_S = 5.0
LABEL = "sgrpo-sandbox"

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


def connect(image: str) -> docker.DockerClient:
    """A client whose engine answers and holds `image`, or EnvironmentMissing saying which is lacking."""
    try:
        client = docker_client()
        client.ping()
    except (DockerException, requests.RequestException, OSError) as err:
        raise EnvironmentMissing(f"no Docker engine answers (DOCKER_HOST={docker_host()!r}): {err}") from err
    try:
        client.images.get(image)
    except ImageNotFound as err:
        client.close()
        raise EnvironmentMissing(f"Docker image {image!r} is not built: run sandbox/image/build.sh "
                                 "(or scripts/docker_ci.sh build-image)") from err
    return client


def _job(request: RunRequest, cap: int) -> dict:
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


@dataclass
class _Outcome:
    """What one run produced, as the container's resident runner reported it."""

    rc: int | None  # -N for a death by signal N
    elapsed: float
    timed_out: bool
    stdout: str
    stderr: str
    fetched: bytes | None  # the fetch collector's answer
    clean: bool  # the runner killed and reaped every other process after the run
    oom_kills: int  # the runner's reading of the container cgroup's oom_kill counter (-1: unreadable)
    setup_error: str | None = None  # the runner could not write the run's files: the code never ran


@dataclass
class _Box:
    """A pooled container and the memory limit it currently has."""

    container: object
    memory_mb: int
    oom_kills: int = 0  # the container cgroup's oom_kill counter after the last cleanup
    init_pid: int = 0  # host pid of the resident runner (pid 1 inside)
    cgroup: Slot | None = None  # the container's cgroups as seen from this host, when visible
    lifeline: socket.socket | None = None  # pid 1's attached stdin: closing it ends the container
    channel: ResidentChannel | None = None  # the runner's stdin/stdout, on the lifeline
    oom_before: int = 0  # the host-visible oom_kill counter when the current run started


class DockerBackend(Backend):
    name = "docker"

    def __init__(self, image: str = DEFAULT_IMAGE, pool_size: int = 4, mode: str = "resident",
                 memory_mb: int = DEFAULT_MEMORY_MB) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.image, self.pool_size, self.mode, self.memory_mb = image, pool_size, mode, memory_mb
        self.client = connect(image)
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
                    shm_size=SHM_BYTES, cap_drop=["ALL"], security_opt=["no-new-privileges"], ulimits=ULIMITS)

    def _container_kwargs(self, memory_mb: int, command: list[str]) -> dict:
        return dict(image=self.image, command=command, user=USER, working_dir="/work",
                    labels={LABEL: self.service_id}, environment={"HOME": "/work", "LANG": "C.UTF-8"},
                    **self._host_config(memory_mb))

    def _new_box(self, memory_mb: int | None = None) -> _Box:
        # the runner exits when the stdin this service holds closes, i.e. when the service goes
        # away, even by SIGKILL; auto_remove then leaves no stopped container behind
        memory_mb = memory_mb or self.memory_mb
        c = self.client.containers.create(stdin_open=True, auto_remove=True, **self._container_kwargs(
            memory_mb, ["python3", "-E", "-s", "-c", RUNNER, fetch.SOURCE]))
        with self._lock:
            self._boxes.add(c.id)
        box = _Box(c, memory_mb)
        try:
            # attach before start, so no byte of the runner is missed
            sock = c.attach_socket(params={"stdin": 1, "stream": 1, "stdout": 1, "stderr": 1})
            box.lifeline = getattr(sock, "_sock", sock)
            box.channel = ResidentChannel(box.lifeline, c.short_id)
            c.start()
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

    def _replace_later(self, box: _Box, why: object) -> None:
        log.warning("%s; replacing container %s", why, box.container.short_id)
        threading.Thread(target=self._replace, args=(box,), daemon=True).start()

    # ---- execution --------------------------------------------------------------------------
    def run(self, request: RunRequest, max_output_bytes: int) -> ExecResult:
        if self.mode == "cold":
            return self._run_cold(request, max_output_bytes)
        why = ""
        for _ in range(2):
            box = self._free.get()
            try:
                if box.memory_mb != request.memory_limit_mb:
                    box.container.update(mem_limit=f"{request.memory_limit_mb}m",
                                         memswap_limit=f"{request.memory_limit_mb}m")
                    box.memory_mb = request.memory_limit_mb
                run = self._run_resident(box, request, max_output_bytes)
            except (NotFound, APIError, ChannelError) as err:  # the code never ran: heal, retry once elsewhere
                self._replace_later(box, f"sandbox container unusable ({err})")
                why = str(err)
                continue
            if isinstance(run, ExecResult):  # lost mid-run: already classified
                return run
            return self._settle(box, request, run)
        return ExecResult(Outcome.SANDBOX_ERROR, None, "", "", 0.0, sandbox_error=f"no usable sandbox container: {why}")

    @staticmethod
    def _note_oom_baseline(box: _Box) -> None:
        """Read the container's oom_kill counter before a run (ChannelError: the container is gone)."""
        try:
            box.oom_before = box.cgroup.oom_kills() if box.cgroup else 0
        except OSError as err:  # the container's cgroup is gone: so is the container
            raise ChannelError(f"container {box.container.short_id} is gone ({err})") from err

    def _run_resident(self, box: _Box, request: RunRequest, cap: int) -> _Outcome | ExecResult:
        """One run by the container's resident runner (an ExecResult if the runner was lost mid-run).

        Raises ChannelError (started=False) when the runner was gone before it took the job.
        """
        assert box.channel is not None
        self._note_oom_baseline(box)
        start = time.monotonic()
        try:
            reply = box.channel.call(_job(request, cap), request.stdin, start + request.run_timeout + 3 * GRACE_S,
                                     stream_cap=2 * fetch.ANSWER_CAP)
        except ChannelError as err:
            if not err.started:
                raise
            return self._lost_mid_run(box, err, time.monotonic() - start)
        if "setup_error" in reply:
            return _Outcome(None, 0.0, False, "", "", None, True, -1, setup_error=str(reply["setup_error"]))
        out, err_out = _kept_output(reply, "out", cap), _kept_output(reply, "err", cap)
        return _Outcome(reply["rc"], reply["elapsed"], reply["timed_out"], out, err_out, reply.get("fetched"),
                        reply["procs_left"] == 0, int(reply["oom_kills"]))

    def _lost_mid_run(self, box: _Box, err: ChannelError, elapsed: float) -> ExecResult:
        """The runner died during a run (the OOM killer may pick pid 1 too): report it, heal the pool."""
        oom = False
        try:
            if box.cgroup is not None:
                oom = box.cgroup.oom_kills() > box.oom_before
            box.container.reload()
            oom = oom or bool(box.container.attrs["State"].get("OOMKilled"))
        except (DockerException, OSError, RuntimeError):
            pass
        self._replace_later(box, err)
        if oom:
            return ExecResult(Outcome.MEMORY, None, "", "", elapsed)
        return ExecResult(Outcome.SANDBOX_ERROR, None, "", "", elapsed,
                          sandbox_error=f"sandbox container lost during the run: {err}")

    def _settle(self, box: _Box, request: RunRequest, run: _Outcome, reuse: bool = True) -> ExecResult:
        """After a run: leftovers killed, OOM decided, the container recycled or replaced.

        With a host view of the container's cgroup we kill and count OOMs from here; otherwise the
        runner's report says whether it is provably clean, and its oom_kill counter (-1: unreadable).
        """
        if box.cgroup is not None:
            try:
                box.cgroup.kill_all(keep=frozenset({box.init_pid}))
                healthy, oom = True, box.cgroup.oom_kills() > box.oom_before
            except (OSError, RuntimeError):
                healthy, oom = False, False
        else:
            healthy, oom_kills = run.clean, run.oom_kills
            oom = oom_kills > box.oom_kills
            box.oom_kills = max(oom_kills, box.oom_kills)
            if oom_kills < 0 and run.rc == -9 and not run.timed_out:
                # cgroup counter unreadable in the container: fall back to the engine's sticky flag
                box.container.reload()
                oom = bool(box.container.attrs["State"].get("OOMKilled"))
                healthy = healthy and not oom  # the flag only resets with a new container
        if not reuse:
            self._discard(box)
        elif healthy:
            self.recycled += 1
            self._free.put(box)
        else:
            self._replace_later(box, "cleanup could not prove the container clean")
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

    def _run_cold(self, request: RunRequest, cap: int) -> ExecResult:
        """A fresh resident-runner container for this one run, removed after it."""
        box = self._new_box(memory_mb=request.memory_limit_mb)
        try:
            run = self._run_resident(box, request, cap)
        except ChannelError as err:
            self._discard(box)
            return ExecResult(Outcome.SANDBOX_ERROR, None, "", "", 0.0, sandbox_error=f"cold container failed: {err}")
        if isinstance(run, ExecResult):
            return run
        return self._settle(box, request, run, reuse=False)

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
        g.set("kill_all_on_timeout", killed.outcome is Outcome.TIMEOUT, f"timeout probe ended {killed.outcome}")
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
