"""The Dockerfile's `tools` stage built offline (tests/docker_images.py: debootstrap base, host-side
wheelhouse, `--network=none`), and sandbox/image/build.sh's exit status, which tells a missing
host piece (3: callers skip) from our own failure (1: callers fail).

The compose test (tests/test_compose.py) runs both services of this image for real; here the
image's own contract: only the two services, as nobody, and the retriever starts without an index.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from docker_images import BUILD_SH, docker_env, require_engine, run, tools_image

from sandbox.serve import EXIT_ENVIRONMENT

pytestmark = pytest.mark.docker


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- build.sh's exit status
def build_sh(tmp_path: Path, path: str | None = None, **env: str):
    """build.sh for an image that is not there, with an empty cache: it must decide before debootstrap."""
    full = {**docker_env(), "SANDBOX_IMAGE": "sgrpo-buildsh-probe:never", "SGRPO_CACHE": str(tmp_path / "cache"), **env}
    if path is not None:
        full["PATH"] = path
    return run([shutil.which("bash"), str(BUILD_SH)], timeout=120, env=full)


def only_these_commands(tmp_path: Path, *names: str) -> str:
    """A PATH holding links to just these commands."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in names:
        (bin_dir / name).symlink_to(shutil.which(name))
    return str(bin_dir)


@pytest.fixture
def engine():
    require_engine()


def test_build_sh_without_debootstrap_is_an_environment_gap(engine, tmp_path):
    path = only_these_commands(tmp_path, "docker", "md5sum", "cut", "mkdir")
    proc = build_sh(tmp_path, path=path)
    assert proc.returncode == EXIT_ENVIRONMENT, proc.stderr
    assert "debootstrap not installed" in proc.stderr


def needs_debootstrap_as_root():
    if not shutil.which("debootstrap") or os.geteuid() != 0:
        pytest.skip("the mirror check runs only where debootstrap could run (installed, as root)")


def test_build_sh_with_the_mirror_out_of_reach_is_an_environment_gap(engine, tmp_path):
    needs_debootstrap_as_root()
    proc = build_sh(tmp_path, DEBIAN_MIRROR=f"http://127.0.0.1:{free_port()}/debian")
    assert proc.returncode == EXIT_ENVIRONMENT, proc.stderr
    assert "the Debian mirror cannot be reached" in proc.stderr


def test_build_sh_with_a_wrong_suite_is_our_error(engine, tmp_path):
    """A mirror that answers 404 for the suite is a setting to fix: status 1, never a skip."""
    needs_debootstrap_as_root()
    (tmp_path / "debian").mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        proc = build_sh(tmp_path, DEBIAN_MIRROR=f"http://127.0.0.1:{server.server_port}/debian",
                        DEBIAN_SUITE="no-such-suite")
    finally:
        server.shutdown()
        server.server_close()
    assert proc.returncode == 1, proc.stderr
    assert "404" in proc.stderr and "DEBIAN_SUITE" in proc.stderr


def recipe_of(image: str) -> str:
    proc = run(["docker", "image", "inspect", image, "--format", '{{index .Config.Labels "sgrpo.recipe"}}'],
               timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.mark.slow
def test_build_sh_keeps_its_own_image_and_rebuilds_another_recipes(engine, tmp_path):
    """CI's engine keeps its images between runs (scripts/docker_ci.sh), so an image can outlive the
    build.sh that made it: build.sh keeps an image its own recipe labelled and rebuilds one that
    another recipe (an older build.sh) labelled. From the cached rootfs tarball: no debootstrap."""
    from docker_images import sandbox_image

    ours = recipe_of(sandbox_image())
    probe = "sgrpo-buildsh-probe:recipe"
    (tmp_path / "Dockerfile").write_text(f"FROM {sandbox_image()}\nLABEL sgrpo.recipe=an-older-recipe\n")
    made = run(["docker", "build", "-q", "--network=none", "-t", probe, str(tmp_path)], timeout=300)
    assert made.returncode == 0, made.stderr
    try:
        env = {**docker_env(), "SANDBOX_IMAGE": probe}
        rebuilt = run([str(BUILD_SH)], timeout=600, env=env)
        assert rebuilt.returncode == 0, rebuilt.stderr
        assert f"made by another recipe (an-older-recipe, now {ours})" in rebuilt.stdout
        assert recipe_of(probe) == ours
        kept = run([str(BUILD_SH)], timeout=120, env=env)
        assert kept.returncode == 0 and "already present" in kept.stdout, kept.stdout + kept.stderr
    finally:
        run(["docker", "rmi", "-f", probe], timeout=120)


# ---------------------------------------------------------------- the tools image
@pytest.fixture
def containers():
    started: list[str] = []
    yield started
    for cid in started:
        run(["docker", "rm", "-f", cid], timeout=60)


@pytest.mark.slow
def test_image_holds_only_the_two_services_and_runs_as_nobody(engine):
    probe = ("import importlib.util as u, os; print(os.getuid(), "
             "[m for m in ('retriever_server', 'sandbox', 'openrlhf_sgrpo', 'agent_env') if u.find_spec(m)])")
    proc = run(["docker", "run", "--rm", "--network", "none", tools_image(), "python3", "-c", probe], timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "65534 ['retriever_server', 'sandbox']"


@pytest.mark.slow
def test_retriever_without_an_index_answers_health(engine, containers):
    """Web-search-only mode (no --index): the image's default command minus the index."""
    port = free_port()
    proc = run(["docker", "run", "-d", "--network", "host", tools_image(), "python3", "-m", "retriever_server.serve",
                "--host", "127.0.0.1", "--port", str(port)], timeout=120)
    assert proc.returncode == 0, proc.stderr
    containers.append(proc.stdout.strip())
    url, end = f"http://127.0.0.1:{port}/health", time.monotonic() + 180
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url, timeout=3) as resp:
                assert resp.status == 200
                return
        except OSError:
            time.sleep(1)
    logs = run(["docker", "logs", containers[-1]]).stderr[-2000:]
    raise AssertionError(f"{url} did not answer within 180 s; container logs:\n{logs}")
