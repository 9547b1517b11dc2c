"""docker-compose.yml validates with the installed Compose (Debian's docker-compose v1 or the
`docker compose` plugin) and says what the tool stack needs: healthchecks on /health, restart
policies, the index volume, the Docker socket for the sandbox, the optional GPU override."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
GPU_OVERRIDE = REPO / "examples" / "docker" / "docker-compose.gpu.yml"


def compose_command() -> list[str]:
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    pytest.skip("neither `docker compose` nor `docker-compose` is installed (apt-get install docker-compose)")


def compose_config(*files: Path, **env: str) -> subprocess.CompletedProcess:
    args = [a for f in files for a in ("-f", str(f))]
    # Config only reads files; a stale DOCKER_HOST must not matter.
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("RETRIEVER_", "SANDBOX_", "INDEX_DIR"))}
    full_env.update(env)
    return subprocess.run([*compose_command(), "--project-directory", str(REPO), *args, "config"],
                          capture_output=True, text=True, env=full_env, cwd=REPO, timeout=120)


@pytest.fixture(scope="module")
def config() -> dict:
    proc = compose_config(REPO / "docker-compose.yml", RETRIEVER_PORT="9100", INDEX_DIR="/data/e5-index")
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)


def published(service: dict) -> set[str]:
    out = set()
    for p in service.get("ports", []):
        out.add(str(p["published"]) if isinstance(p, dict) else str(p).split(":")[0])
    return out


def test_services_have_health_and_restart(config):
    for name in ("retriever", "sandbox"):
        svc = config["services"][name]
        assert "/health" in " ".join(svc["healthcheck"]["test"]), name
        assert svc["restart"] == "unless-stopped"
        assert svc["build"]["target"] == "tools"


def test_retriever_index_volume_and_env_overrides(config):
    svc = config["services"]["retriever"]
    vols = [v if isinstance(v, str) else f"{v['source']}:{v['target']}" for v in svc["volumes"]]
    assert any(v.startswith("/data/e5-index:/index") for v in vols), vols
    assert published(svc) == {"9100"}
    assert "--index /index" in " ".join(svc["command"] if isinstance(svc["command"], list) else [svc["command"]])


def test_sandbox_uses_the_docker_socket(config):
    svc = config["services"]["sandbox"]
    vols = [v if isinstance(v, str) else f"{v['source']}:{v['target']}" for v in svc["volumes"]]
    assert "/var/run/docker.sock:/var/run/docker.sock" in [v.split(":rw")[0] for v in vols]
    assert "--backend docker" in " ".join(svc["command"] if isinstance(svc["command"], list) else [svc["command"]])
    assert config["services"]["sandbox-image"]["image"] == "sgrpo-sandbox:latest"


def test_gpu_override_reserves_a_gpu():
    proc = compose_config(REPO / "docker-compose.yml", GPU_OVERRIDE)
    assert proc.returncode == 0, proc.stderr
    devices = yaml.safe_load(proc.stdout)["services"]["retriever"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]


def test_invalid_compose_is_rejected(tmp_path):
    broken = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    broken["services"]["retriever"]["healthcheck"]["interval"] = ["not", "a", "duration"]
    path = tmp_path / "docker-compose.yml"
    path.write_text(yaml.safe_dump(broken))
    proc = compose_config(path)
    assert proc.returncode != 0
