"""Build the Dockerfile's `tools` stage offline and check its two services answer /health.

Offline means: no registry and no PyPI inside the build (`--network=none`). The base is a
Debian bookworm rootfs from debootstrap imported with `docker import` (sandbox/image/build.sh,
with python3-venv + bubblewrap added), and the Python deps are wheels downloaded on the host
into the build context's wheelhouse. Every missing prerequisite skips with the reason.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BASE_IMAGE = "sgrpo-tools-base:bookworm"
IMAGE = "sgrpo-tools:ci"
SANDBOX_IMAGE = "sgrpo-sandbox:latest"
DOCKER_ENV_FILE = Path(os.environ.get("SGRPO_DOCKER_DIR", "/tmp/sgrpo-docker")) / "env"

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def docker_env() -> dict[str, str]:
    env = dict(os.environ)
    if "DOCKER_HOST" not in env and DOCKER_ENV_FILE.is_file():
        for line in DOCKER_ENV_FILE.read_text().splitlines():
            key, _, value = line.removeprefix("export ").partition("=")
            if key == "DOCKER_HOST":
                env["DOCKER_HOST"] = value
    return env


def run(cmd: list[str], timeout: int = 900, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, env=docker_env(), timeout=timeout, **kw)


def skip(reason: str) -> None:
    print(f"SKIP test_tools_image: {reason}", file=sys.stderr)
    pytest.skip(reason)


def socket_path() -> str:
    host = docker_env().get("DOCKER_HOST", "unix:///var/run/docker.sock")
    return host.removeprefix("unix://")


@pytest.fixture(scope="module")
def tools_image(tmp_path_factory) -> str:
    if not shutil.which("docker"):
        skip("no docker CLI (scripts/docker_ci.sh install)")
    if run(["docker", "version"], timeout=30).returncode != 0:
        skip(f"no Docker engine answers at {socket_path()} (scripts/docker_ci.sh start)")
    if run(["docker", "image", "inspect", BASE_IMAGE]).returncode != 0:
        env = {**docker_env(), "SANDBOX_IMAGE": BASE_IMAGE, "EXTRA_PACKAGES": "python3-venv,bubblewrap"}
        proc = subprocess.run([str(REPO / "sandbox" / "image" / "build.sh")], capture_output=True, text=True,
                              env=env, timeout=1200)
        if proc.returncode != 0:
            skip(f"offline base image (debootstrap + docker import) failed: {proc.stderr.strip()[-400:]}")
    ctx = tmp_path_factory.mktemp("tools-context")
    for part in ("retriever_server", "sandbox"):
        shutil.copytree(REPO / part, ctx / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(REPO / "Dockerfile", ctx / "Dockerfile")
    docker_dir = ctx / "examples" / "docker"
    (docker_dir / "wheelhouse").mkdir(parents=True)
    shutil.copy(REPO / "examples" / "docker" / "requirements-tools.txt", docker_dir / "requirements-tools.txt")
    dl = run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", "3.11",
              "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_28_x86_64",
              "--implementation", "cp", "-d", str(docker_dir / "wheelhouse"),
              "-r", str(docker_dir / "requirements-tools.txt")])
    if dl.returncode != 0:
        skip(f"could not download the tools wheels from PyPI on the host: {dl.stderr.strip()[-400:]}")
    build = run(["docker", "build", "--network=none", "--target", "tools", "-t", IMAGE,
                 "--build-arg", f"TOOLS_BASE={BASE_IMAGE}", "--build-arg", "PIP_OFFLINE=1",
                 "--build-arg", "TOOLS_ENCODERS=", str(ctx)], timeout=1800)
    assert build.returncode == 0, f"offline build of the tools stage failed:\n{build.stdout[-3000:]}\n{build.stderr[-3000:]}"
    return IMAGE


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_health(url: str, container: str, deadline_s: float = 90) -> dict:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=3) as resp:
                return {"status": resp.status, "body": resp.read().decode()}
        except OSError:
            time.sleep(1)
    logs = run(["docker", "logs", container]).stderr[-2000:]
    raise AssertionError(f"{url} did not answer within {deadline_s} s; container logs:\n{logs}")


@pytest.fixture
def containers():
    started: list[str] = []
    yield started
    for cid in started:
        run(["docker", "rm", "-f", cid], timeout=60)


def test_retriever_answers_health(tools_image, containers):
    port = free_port()
    proc = run(["docker", "run", "-d", "--network", "host", tools_image, "python3", "-m", "retriever_server.serve",
                "--host", "127.0.0.1", "--port", str(port)], timeout=120)
    assert proc.returncode == 0, proc.stderr
    containers.append(proc.stdout.strip())
    health = wait_health(f"http://127.0.0.1:{port}/health", containers[-1])
    assert health["status"] == 200


def test_sandbox_answers_health_through_the_docker_socket(tools_image, containers):
    if run(["docker", "image", "inspect", SANDBOX_IMAGE]).returncode != 0:
        proc = run([str(REPO / "sandbox" / "image" / "build.sh")], timeout=1200)
        if proc.returncode != 0:
            skip(f"{SANDBOX_IMAGE} could not be built offline: {proc.stderr.strip()[-400:]}")
    port = free_port()
    proc = run(["docker", "run", "-d", "--network", "host", "--user", "0:0",
                "-v", f"{socket_path()}:/var/run/docker.sock", tools_image,
                "python3", "-m", "sandbox.serve", "--backend", "docker", "--host", "127.0.0.1", "--port", str(port),
                "--max-concurrency", "2"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    containers.append(proc.stdout.strip())
    health = wait_health(f"http://127.0.0.1:{port}/health", containers[-1])
    assert health["status"] == 200
