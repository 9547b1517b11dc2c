"""scripts/docker_ci.sh, CI's own Docker engine: its data-root is kept between runs (the layer cache),
so a data-root a killed engine left unusable must cost a rebuild, never the run, and `stop` must
leave nothing mounted. A second engine on its own state folder, socket and data-root runs beside
CI's (scripts/docker_ci.sh keeps every path of an engine under those two folders)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.docker

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "docker_ci.sh"


def mounts_at_or_below(root: Path) -> list[str]:
    points = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    return [p for p in points if p == str(root) or p.startswith(f"{root}/")]


@pytest.fixture
def engine_dirs():
    if os.geteuid() != 0 or not shutil.which("dockerd") or not shutil.which("docker"):
        pytest.skip("docker_ci.sh starts its engine as root with dockerd and the docker CLI installed")
    # a short folder: containerd's socket lands under the state folder, and a unix socket's path
    # must fit 108 bytes (pytest's tmp_path here is too long: containerd never answers)
    root = Path(tempfile.mkdtemp(prefix="sgrpo-dci-", dir="/tmp"))
    state, data = root / "state", root / "data"
    env = {**os.environ, "SGRPO_DOCKER_DIR": str(state), "SGRPO_DOCKER_DATA": str(data)}
    env.pop("DOCKER_HOST", None)

    def script(command: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(SCRIPT), command], env=env, capture_output=True, text=True,
                              timeout=180, check=False)

    try:
        yield script, state, data
    finally:
        script("stop")
        for point in mounts_at_or_below(root):  # only if stop failed
            subprocess.run(["umount", "-l", point], check=False)
        shutil.rmtree(root, ignore_errors=True)


def test_a_kept_data_root_the_engine_cannot_read_is_started_empty_and_stop_unmounts_it(engine_dirs):
    script, state, data = engine_dirs
    (data / "image" / "overlay2").mkdir(parents=True)
    (data / "image" / "overlay2" / "repositories.json").write_text("{not json")  # dockerd refuses to start
    up = script("start")
    assert up.returncode == 0, up.stdout + up.stderr
    assert f"did not start on the kept data-root {data}; starting it empty" in up.stderr
    assert "0 images kept" in up.stdout
    assert not (data / "image" / "overlay2" / "repositories.json").read_text().startswith("{not")
    host = (state / "env").read_text().split("DOCKER_HOST=")[1].split()[0]
    version = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True,
                             text=True, timeout=60, env={**os.environ, "DOCKER_HOST": host}, check=False)
    assert version.returncode == 0 and version.stdout.strip(), version.stderr

    down = script("stop")
    assert down.returncode == 0, down.stderr
    assert mounts_at_or_below(data) == [] and mounts_at_or_below(state) == []
    assert not state.exists() and data.is_dir()  # the data-root is kept for the next run

    again = script("start")  # the kept (now sound) data-root starts as it is
    assert again.returncode == 0 and "starting it empty" not in again.stderr, again.stdout + again.stderr
