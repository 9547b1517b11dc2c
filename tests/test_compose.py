"""docker-compose.yml with the installed Compose (Debian's docker-compose v1 or the `docker compose`
plugin): its config says what the tool stack needs (healthchecks on /health, restart policies, the
index volume, the Docker socket for the sandbox, the optional GPU override), and the stack comes
`up` for real on the offline engine: `/retrieve` and `/run_code` answer through the services'
ports, then `down`."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import yaml
from docker_images import docker_env, engine_socket, run, sandbox_image, tools_image

REPO = Path(__file__).resolve().parent.parent
GPU_OVERRIDE = REPO / "examples" / "docker" / "docker-compose.gpu.yml"


def compose_command() -> list[str]:
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True,
                                                                 check=False).returncode == 0:
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
                          capture_output=True, text=True, env=full_env, cwd=REPO, timeout=120, check=False)


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


def test_services_listen_on_the_port_they_publish():
    """So that with host networking (no `ports:`) a service serves on the very port it would publish."""
    proc = compose_config(REPO / "docker-compose.yml", RETRIEVER_PORT="9100", SANDBOX_PORT="9200",
                          SANDBOX_LOCAL_PORT="9300", LISTEN_HOST="127.0.0.1")
    assert proc.returncode == 0, proc.stderr
    services = yaml.safe_load(proc.stdout)["services"]
    for name, port in (("retriever", 9100), ("sandbox", 9200), ("sandbox-local", 9300)):
        svc = services[name]
        command = svc["command"] if isinstance(svc["command"], str) else " ".join(svc["command"])
        assert "--host 127.0.0.1" in command and f"--port {port}" in command
        assert [(p["published"], p["target"]) for p in svc["ports"]] == [(port, port)]
        assert f"127.0.0.1:{port}/health" in " ".join(svc["healthcheck"]["test"])


TOKEN_TARGET = "/run/secrets/sgrpo_tools_token"
TOKEN_SERVICES = ("retriever", "sandbox", "sandbox-local")


def command_of(svc: dict) -> str:
    return svc["command"] if isinstance(svc["command"], str) else " ".join(svc["command"])


def token_mount(svc: dict) -> tuple[str, bool]:
    """(host source, read-only) of the volume mounted where --auth-token-file points."""
    for v in svc["volumes"]:
        src, target, mode = (v.split(":") + ["rw"])[:3] if isinstance(v, str) else \
            (v["source"], v["target"], "ro" if v.get("read_only") else "rw")
        if target == TOKEN_TARGET:
            return src, mode == "ro"
    raise AssertionError(f"no volume at {TOKEN_TARGET}: {svc['volumes']}")


def test_every_service_requires_the_one_token_file_by_default(config):
    """Issue #58: both bind every interface, so both get --auth-token-file on one read-only mount;
    unset, TOOLS_TOKEN_FILE mounts an empty file, which both services refuse to start with."""
    for name in TOKEN_SERVICES:
        svc = config["services"][name]
        assert f"--auth-token-file {TOKEN_TARGET}" in command_of(svc), name
        assert token_mount(svc) == ("/dev/null", True), name


def test_the_token_file_and_the_trusted_network_switch_come_from_the_environment(tmp_path):
    token = tmp_path / "tools.token"
    proc = compose_config(REPO / "docker-compose.yml", TOOLS_TOKEN_FILE=str(token), MAX_QUERIES_PER_DAY="5000")
    assert proc.returncode == 0, proc.stderr
    services = yaml.safe_load(proc.stdout)["services"]
    for name in TOKEN_SERVICES:
        assert token_mount(services[name]) == (str(token), True), name
    assert "--max-queries-per-day 5000" in command_of(services["retriever"])
    proc = compose_config(REPO / "docker-compose.yml", TOOLS_AUTH="--no-auth")
    assert proc.returncode == 0, proc.stderr
    for name, svc in yaml.safe_load(proc.stdout)["services"].items():
        if name in TOKEN_SERVICES:
            assert "--no-auth" in command_of(svc) and "--auth-token-file" not in command_of(svc), name


def test_the_rendered_commands_parse_with_the_services_own_parsers(config, tmp_path):
    """The flags compose writes are ones the two CLIs take (a budget of 0 is "no limit"), the token
    file read from where the mount puts it (here a file of the same content)."""
    import shlex

    from retriever_server import serve as retriever_serve
    from sandbox import serve as sandbox_serve

    token = tmp_path / "tools.token"
    token.write_text("0123456789abcdef" * 4 + "\n")

    def argv(svc: dict) -> list[str]:
        words = shlex.split(command_of(svc).replace(TOKEN_TARGET, str(token)))
        if words[:2] == ["sh", "-c"]:  # the retriever's: the inner command, its $RETRIEVER_ARGS empty
            words = shlex.split(words[2].replace("$${RETRIEVER_ARGS:-}", "").replace("${RETRIEVER_ARGS:-}", ""))
        words = words[1:] if words[0] == "exec" else words
        assert words[:2] == ["python3", "-m"] and words[2] in ("retriever_server.serve", "sandbox.serve"), words
        return words[3:]

    a, cfg = retriever_serve.parse_args(argv(config["services"]["retriever"]))
    retriever_serve.resolve_token(a, cfg)
    assert cfg.auth_token == token.read_text().strip().encode() and cfg.max_queries_per_minute is None
    for name in ("sandbox", "sandbox-local"):
        scfg = sandbox_serve.parse_args(argv(config["services"][name]))
        assert scfg.token == token.read_text().strip().encode() and scfg.host == "0.0.0.0", name


# ---------------------------------------------------------------- the stack, up for real
# The corpus: these answer articles among real distractors; each question is about its article.
STACK_QUESTIONS = {
    "Which German-born theoretical physicist is best known for relativity?": "Albert Einstein",
    "What is the highest mountain on Earth above sea level?": "Mount Everest",
    "How do plants turn light into chemical energy?": "Photosynthesis",
}
DISTRACTOR_STRIDE = 400  # every 400th of the 10,033 extracts: 26 real distractor articles
STACK_TOKEN = "c0ffee" * 8  # what TOOLS_TOKEN_FILE holds for the stack
STACK_AUTH = {"Authorization": f"Bearer {STACK_TOKEN}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def small_index(tmp_path_factory) -> Path:
    """A MiniLM index of ~30 Wikipedia extracts, made the way the quick start makes wiki-18's: a
    Search-R1-style file pair (the corpus and an IndexFlatIP whose row i is line i, here built with
    the real build CLI) imported by ``PREBUILT=1 examples/data/prepare_wiki.sh`` into
    ``$OUT/e5-index``. The container sees only INDEX_DIR, so the flat file must be in the folder
    itself (a hard link; a symlink to ``$OUT/e5_Flat.index`` would dangle there). The model folder
    is inside it too. World-readable: the retriever runs as nobody."""
    from openrlhf_sgrpo.assets import AssetMissing, minilm_dir
    from retriever_server.corpora import wiki_extracts_path, wiki_extracts_to_jsonl

    try:
        extracts, model = wiki_extracts_path(), minilm_dir()
    except (FileNotFoundError, AssetMissing) as err:
        pytest.skip(f"small index assets missing: {err}")
    data = json.loads(extracts.read_text(encoding="utf-8"))
    keys = dict.fromkeys([*list(data)[::DISTRACTOR_STRIDE], *STACK_QUESTIONS.values()])
    src = tmp_path_factory.mktemp("stack-corpus")
    (src / "subset.json").write_text(json.dumps({k: data[k] for k in keys}))
    wiki_extracts_to_jsonl(src / "subset.json", src / "corpus.jsonl")
    out = Path(tempfile.mkdtemp(prefix="sgrpo-stack-index-"))
    index = out / "e5-index"
    try:
        build = [sys.executable, "-m", "retriever_server.build_index", "--corpus", str(src / "corpus.jsonl"),
                 "--model", str(model), "--out", str(src / "built"), "--batch-size", "32"]
        proc = subprocess.run(build, capture_output=True, text=True, timeout=600, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        shutil.copyfile(src / "built" / "index.faiss", out / "e5_Flat.index")  # the pair as Search-R1 ships it
        shutil.copyfile(src / "corpus.jsonl", out / "wiki-18.jsonl")
        env = {"PATH": os.environ["PATH"], "HOME": str(out), "PYTHON": sys.executable, "PREBUILT": "1",
               "OUT": str(out), "CORPUS": str(out / "wiki-18.jsonl"), "MODEL": str(model), "INDEX_TYPE": "flat"}
        proc = subprocess.run(["bash", str(REPO / "examples" / "data" / "prepare_wiki.sh")], env=env,
                              capture_output=True, text=True, timeout=600, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        placed = index / "index.faiss"
        assert not placed.is_symlink() and placed.stat().st_nlink == 2, "the flat file must be hard-linked in"
        shutil.copytree(model, index / "minilm")
        for path in [index, *index.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        yield index
    finally:
        shutil.rmtree(out, ignore_errors=True)


@dataclass
class Stack:
    retriever: str
    sandbox: str
    compose: list[str]
    env: dict[str, str]

    def container(self, service: str) -> str:
        proc = run([*self.compose, "ps", "-q", service], env=self.env, timeout=60)
        assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr
        return proc.stdout.strip()

    def logs(self) -> str:
        return run([*self.compose, "logs", "--no-color", "--tail", "40"], env=self.env, timeout=60).stdout[-4000:]


def wait_answering(url: str, stack: Stack, deadline_s: float = 240) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            if requests.get(url, timeout=3).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(1)
    raise AssertionError(f"{url} did not answer within {deadline_s} s; compose logs:\n{stack.logs()}")


def on_host_network(env: dict[str, str], dest: Path) -> Path:
    """docker-compose.yml as Compose renders it with `env`, the two services moved onto the host's
    network: `network_mode: host` and no `ports:` (the engine ignores them there, and Compose v1,
    which has no `!reset` to drop them in an override file, refuses the pair)."""
    proc = compose_config(REPO / "docker-compose.yml", **env)
    assert proc.returncode == 0, proc.stderr
    config = yaml.safe_load(proc.stdout)
    for name in ("retriever", "sandbox"):
        config["services"][name]["network_mode"] = "host"
        del config["services"][name]["ports"]
    dest.write_text(yaml.safe_dump(config, sort_keys=False))
    return dest


@pytest.fixture(scope="module")
def stack(request, tmp_path_factory) -> Stack:
    """`up` the retriever and the Docker-backend sandbox of docker-compose.yml, `down -v` after,
    whatever happened.

    Why host networking: CI's engine (scripts/docker_ci.sh) runs with `--bridge=none
    --iptables=false` so that the tests never change the host's network, so it has no bridge
    network: a container's only choices are `host` and `none`, and a `ports:` mapping has nothing
    to forward to. With `network_mode: host` each service listens on RETRIEVER_PORT / SANDBOX_PORT
    itself (the compose file makes a service listen on the port it publishes), and the test
    reaches it there. LISTEN_HOST=127.0.0.1 keeps both on loopback; the ports are free ones.
    Everything else is the file as shipped (commands, healthchecks, volumes, socket mount).
    """
    compose = compose_command()
    images = {"TOOLS_IMAGE": tools_image(), "SANDBOX_IMAGE": sandbox_image()}
    small_index = request.getfixturevalue("small_index")  # after the skips: its build takes a while
    secrets_dir = tmp_path_factory.mktemp("secrets")  # 0700: only its owner enters it on the host ...
    token_file = secrets_dir / "tools.token"
    token_file.write_text(STACK_TOKEN + "\n")
    token_file.chmod(0o644)  # ... while nobody (uid 65534) reads the mounted file in the container
    settings = {**images, "INDEX_DIR": str(small_index), "RETRIEVER_PORT": str(free_port()),
                "SANDBOX_PORT": str(free_port()), "LISTEN_HOST": "127.0.0.1", "DOCKER_SOCKET": engine_socket(),
                "RETRIEVER_ARGS": "--model /index/minilm", "HF_HUB_OFFLINE": "1", "SANDBOX_CONCURRENCY": "2",
                "TOOLS_TOKEN_FILE": str(token_file)}
    env = {k: v for k, v in docker_env().items() if not k.startswith(("RETRIEVER_", "SANDBOX_", "INDEX_DIR"))}
    env.update(settings)
    rendered = on_host_network(settings, tmp_path_factory.mktemp("compose") / "docker-compose.yml")
    cmd = [*compose, "--project-name", f"sgrpo-ci-{os.getpid()}", "--project-directory", str(REPO),
           "-f", str(rendered)]
    st = Stack(f"http://127.0.0.1:{settings['RETRIEVER_PORT']}", f"http://127.0.0.1:{settings['SANDBOX_PORT']}",
               cmd, env)
    try:
        up = run([*cmd, "up", "-d", "--no-build", "retriever", "sandbox"], env=env, timeout=600)
        assert up.returncode == 0, f"compose up failed:\n{up.stdout[-2000:]}\n{up.stderr[-3000:]}"
        wait_answering(st.retriever + "/health", st)
        wait_answering(st.sandbox + "/health", st)
        yield st
    finally:
        down = run([*cmd, "down", "-v", "--remove-orphans"], env=env, timeout=300)
        assert down.returncode == 0, f"compose down failed:\n{down.stderr[-2000:]}"


@pytest.mark.slow
@pytest.mark.docker
def test_stack_healthchecks_turn_healthy(stack):
    """Compose's own healthchecks (run inside each container) reach the service on its port."""
    status = {}
    end = time.monotonic() + 120
    while time.monotonic() < end:
        for service in ("retriever", "sandbox"):
            proc = run(["docker", "inspect", "-f", "{{.State.Health.Status}}", stack.container(service)], timeout=60)
            status[service] = proc.stdout.strip()
        if set(status.values()) == {"healthy"}:
            return
        time.sleep(3)
    raise AssertionError(f"healthchecks say {status}; compose logs:\n{stack.logs()}")


@pytest.mark.slow
@pytest.mark.docker
def test_retrieve_through_the_stack_finds_each_article(stack):
    """The body Search-R1's `_batch_search` posts, with the token compose mounted; each question's
    own article ranks first. Without the token: 401."""
    body = {"queries": list(STACK_QUESTIONS), "topk": 3, "return_scores": True}
    assert requests.post(stack.retriever + "/retrieve", json=body, timeout=120).status_code == 401
    resp = requests.post(stack.retriever + "/retrieve", json=body, headers=STACK_AUTH, timeout=120)
    assert resp.status_code == 200, resp.text
    result = resp.json()["result"]
    top = [hits[0]["document"]["contents"].split("\n")[0].strip('"') for hits in result]
    assert top == list(STACK_QUESTIONS.values())


@pytest.mark.slow
@pytest.mark.docker
def test_run_code_through_the_stack_runs_in_a_sandbox_container(stack):
    """SandboxFusion's request and answer against the compose sandbox, with the token (its own
    client sends no header: that takes --no-auth): the code runs in a container the service
    started through the mounted socket, as nobody, with no network. Without the token: 401."""
    sandbox_fusion = pytest.importorskip("sandbox_fusion", reason="pip install sandbox-fusion (a test dependency)")
    code = ("import os, socket\nprint('hello from compose', os.getuid())\n"
            "print(sorted(n for _, n in socket.if_nameindex()))")
    body = sandbox_fusion.RunCodeRequest(code=code, language="python").dict()  # what its client posts
    assert requests.post(stack.sandbox + "/run_code", json=body, timeout=120).status_code == 401
    r = requests.post(stack.sandbox + "/run_code", json=body, headers=STACK_AUTH, timeout=120)
    assert r.status_code == 200, r.text
    resp = sandbox_fusion.RunCodeResponse(**r.json())
    assert resp.status == "Success", resp
    assert resp.run_result.stdout == "hello from compose 65534\n['lo']\n"
