"""Docker backend: a warm pool of locked-down containers, or one fresh container per run (cold).

Resident pool (default): each container's pid 1 is the resident runner (resident_runner.py, the
local backend's own), which takes jobs over the attached stdin: it proves the container clean,
writes the code and files into the tmpfs /work, spawns `python3 -E -s main.py`, enforces the
deadline and reports the program's wait status (-N for a death by signal N), then wipes /work,
/tmp, /dev/shm, /dev/mqueue and SysV IPC objects. After a run every other process is SIGKILLed
(from the host's view of the container cgroup, and by the runner); a container that is not
provably clean, was OOM-killed or died is removed and replaced in the background, so the pool
heals. The host side of all this is shared with the local backend (resident.py); this module says
how a container is made, resized, killed and removed.
Cold (the benchmark baseline): one fresh resident-runner container per run, removed after it.
"""

from __future__ import annotations

import logging
import os
import time
import uuid

import docker
import requests
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.types import Ulimit

from ..api import DEFAULT_MEMORY_MB, Outcome, RunRequest
from ..cgroups import slot_of_process
from ..probe import run_probe
from .base import EnvironmentMissing, Guarantees
from .channel import ChannelError
from .docker_stream import SocketChannel
from .resident import MODES, Box, BoxError, ResidentPool

log = logging.getLogger(__name__)

DEFAULT_IMAGE = "sgrpo-sandbox:latest"
ENV_FILE = os.path.join(os.environ.get("SGRPO_DOCKER_DIR", "/tmp/sgrpo-docker"), "env")
USER = "65534:65534"
PIDS_LIMIT = 64
NANO_CPUS = 1_000_000_000
SCRATCH = "size=64m,mode=1777"
TMPFS = {"/work": f"rw,exec,{SCRATCH}", "/tmp": f"rw,{SCRATCH}"}
SHM_BYTES = 64 << 20  # /dev/shm, capped like /work
ULIMITS = [Ulimit(name="nofile", soft=256, hard=256), Ulimit(name="core", soft=0, hard=0),
           Ulimit(name="fsize", soft=64 << 20, hard=64 << 20)]
START_TIMEOUT_S = 60.0
LABEL = "sgrpo-sandbox"
CLOSE_TIMEOUT_S = 30.0  # for the engine to finish removing the service's containers


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


class DockerBackend(ResidentPool):
    name = "docker"

    def __init__(self, image: str = DEFAULT_IMAGE, pool_size: int = 4, mode: str = "resident",
                 memory_mb: int = DEFAULT_MEMORY_MB) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.image, self.pool_size, self.memory_mb = image, pool_size, memory_mb
        self.client = connect(image)
        self.service_id = uuid.uuid4().hex[:12]
        super().__init__(mode, [None] * pool_size)
        self._warm_up()

    # ---- container lifecycle ----------------------------------------------------------------
    def _host_config(self, memory_mb: int) -> dict:
        return dict(network_mode="none", mem_limit=f"{memory_mb}m", memswap_limit=f"{memory_mb}m",
                    pids_limit=PIDS_LIMIT, nano_cpus=NANO_CPUS, read_only=True, tmpfs=dict(TMPFS),
                    shm_size=SHM_BYTES, cap_drop=["ALL"], security_opt=["no-new-privileges"], ulimits=ULIMITS)

    def _container_kwargs(self, memory_mb: int, command: list[str]) -> dict:
        return dict(image=self.image, command=command, user=USER, working_dir="/work",
                    labels={LABEL: self.service_id}, environment={"HOME": "/work", "LANG": "C.UTF-8"},
                    **self._host_config(memory_mb))

    def _new_box(self, place: object, memory_mb: int) -> Box:
        # the runner exits when the stdin this service holds closes, i.e. when the service goes
        # away, even by SIGKILL; auto_remove then leaves no stopped container behind
        try:
            c = self.client.containers.create(stdin_open=True, auto_remove=True, **self._container_kwargs(
                memory_mb, self._runner_command("python3")))
        except DockerException as err:
            raise BoxError(f"cannot create a sandbox container: {err}") from err
        box = Box(place, None, memory_mb, c.short_id, handle=c)  # type: ignore[arg-type]
        try:
            # attach before start, so no byte of the runner is missed
            sock = c.attach_socket(params={"stdin": 1, "stream": 1, "stdout": 1, "stderr": 1})
            box.channel = SocketChannel(getattr(sock, "_sock", sock), c.short_id)
            c.start()
            box.oom_kills = max(int(box.channel.receive(time.monotonic() + START_TIMEOUT_S)["oom_kills"]), 0)
            c.reload()
        except (DockerException, ChannelError) as err:
            self._drop(box)
            raise BoxError(f"sandbox container {c.short_id} did not start: {err}") from err
        init_pid = int(c.attrs["State"].get("Pid") or 0)
        box.cgroup = slot_of_process(init_pid) if init_pid else None
        box.keep = frozenset({init_pid})
        return box

    def _set_memory(self, box: Box, memory_mb: int) -> None:
        try:
            box.handle.update(mem_limit=f"{memory_mb}m", memswap_limit=f"{memory_mb}m")  # type: ignore[union-attr]
        except (NotFound, APIError) as err:
            raise BoxError(f"cannot resize container {box.name}: {err}") from err

    def _kill(self, box: Box) -> None:
        try:
            if box.cgroup is not None:
                box.cgroup.kill_all()
            else:
                box.handle.kill()  # type: ignore[union-attr]
        except (NotFound, APIError, OSError, RuntimeError):
            pass

    def _drop(self, box: Box) -> None:
        if box.channel is not None:
            box.channel.close()
        try:
            box.handle.remove(force=True)  # type: ignore[union-attr]
        except (NotFound, APIError):
            pass

    def _engine_oom(self, box: Box) -> bool:
        try:
            box.handle.reload()  # type: ignore[union-attr]
            return bool(box.handle.attrs["State"].get("OOMKilled"))  # type: ignore[union-attr]
        except DockerException:
            return False

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
        return self.pool_stats("docker")

    def live_containers(self) -> list[str]:
        """Ids of containers labelled with this service (tests prove cleanup with it).

        The low-level list: the high-level one inspects every id, and a container that
        auto-removes in between would make it raise NotFound."""
        found = self.client.api.containers(all=True, filters={"label": f"{LABEL}={self.service_id}"})
        return [c["Id"] for c in found]

    def close(self) -> None:
        """Remove every container of this service, and return once the engine lists none.

        A container that exited (killed from outside, its runner gone) is removed by the engine
        itself in the background (``auto_remove``); a forced remove then answers 409 "removal in
        progress" at once, and without the wait a caller listing containers right after close
        still found one ("Removal In Progress", seen in CI)."""
        super().close()
        try:
            deadline = time.monotonic() + CLOSE_TIMEOUT_S
            while left := self.live_containers():  # any container this service made and lost track of
                if time.monotonic() > deadline:
                    log.warning("docker still lists %d container(s) of service %s after %.0f s: %s",
                                len(left), self.service_id, CLOSE_TIMEOUT_S, left)
                    break
                for cid in left:
                    try:
                        self.client.api.remove_container(cid, force=True)
                    except (NotFound, APIError):
                        pass  # gone meanwhile, or its removal is under way
                time.sleep(0.1)
        finally:
            self.client.close()
