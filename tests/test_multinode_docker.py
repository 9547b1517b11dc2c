"""Two Ray nodes that share no filesystem, in Docker (issue #51; docs/multinode.md).

Two containers from the project's train image (tests/docker_images.py ``train_image``: the CPU
set as ``make install`` installs it, vLLM's CPU build included) on an internal Docker network, with
no volume between them:

- **node A** (``ray start --head``, no GPU) runs the driver, the CLI as the launch scripts call it
  (``python -m openrlhf_sgrpo.cli.train_ppo_ray``). Only A has the agent config, the agent file
  named by ``--train.agent_func_path`` and the prompt file;
- **node B** (``ray start --address``, 2 fake GPUs) is the only node with GPU resources, so Ray
  places OpenRLHF's GPU actors there by resources: the policy (``PolicyModelActor``, DeepSpeed)
  and the vLLM engine (``RolloutRayActor``, vLLM's CPU build) with our agent in it;
- the tool services are the compose stack's ``retriever`` and ``sandbox`` (docker-compose.yml as
  shipped, attached to the same network), reached by their service names.

The CLI runs 2 steps of ``stratified_grpo`` with the fitted tiny policy (tests/fitted_policy.py),
saving a checkpoint each step, then a second invocation resumes from it and runs a third.

What cannot run on a CPU as OpenRLHF wrote it is stood in for in every Ray process of both nodes
by ``tests/multinode_site/sitecustomize.py`` (CUDA device calls, the ``cuda`` device mesh, the
replay buffer's ``cuda`` device, bf16 on a processor without bf16 instructions); the rest is the
real thing: Ray across two nodes, OpenRLHF's ``train()``, DeepSpeed (CPU accelerator, gloo),
vLLM's engine, our agent, estimator, records and CPU weight sync.

``--sgrpo.shared_fs /run``: the CLI refuses a multi-node run whose output folders are not on
storage every node mounts. Here ``/run`` is *not* shared, on purpose: each node's ``/run`` shows
what that node wrote, which is what docs/multinode.md's "What runs where" says; the resume is
given the trainer-side folder (``_actor`` under ``--ckpt.path``) as a shared mount would show it,
by ``docker cp`` from B to A, and nothing else.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from docker_images import (docker_env, engine_socket, require_engine, run, sandbox_image, skip, tools_image, train_image,
                           vllm_cpu_closure)

# the image checks, the stack, two training runs: 9-13.5 min with the images cached (quiet / busy 2-core box), ~23 min with every
# image rebuilt, on a busy 2-core machine (docs/multinode.md)
pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(2700)]

REPO = Path(__file__).resolve().parent.parent
SITE = Path(__file__).resolve().parent / "multinode_site"
PREFIX = f"sgrpo-mn-{os.getpid()}"
NET = PREFIX
NODE_A, NODE_B = f"{PREFIX}-a", f"{PREFIX}-b"
RETRIEVER_URL, SANDBOX_URL = "http://retriever:8000/retrieve", "http://sandbox:8080/run_code"
# The tools' token (issue #58): compose mounts it into both services; only the CLI's environment on
# node A holds it, so B's engine can reach the services only with what the CLI's runtime env carries.
TOOLS_TOKEN = "5eed" * 12
N = 2  # samples per prompt
ALPHA = 0.6
CORPUS = [
    {"id": "1", "contents": '"Paris"\nParis is the capital and largest city of France.'},
    {"id": "2", "contents": '"Nile"\nThe Nile flows north through Cairo into the Mediterranean.'},
    {"id": "3", "contents": '"Hamlet"\nHamlet is a tragedy written by William Shakespeare.'},
    {"id": "4", "contents": '"Berlin"\nBerlin is the capital of Germany.'},
]
# Node A only: the agent file, the agent config and the prompts. The agent file is ours plus a
# probe: in every process that loads it (OpenRLHF's _load_agent_executor, in the engine), it
# writes where it ran, from which path, and the config the agent's own loader returns there.
AGENT_DIR = "/home/driver/agent"
AGENT_FILE = f"{AGENT_DIR}/probe_agent.py"
AGENT_CONFIG = "/home/driver/agent_config.yaml"
PROBE = "/tmp/sgrpo-probe-agent.json"
PROBE_AGENT = f'''"""The project's agent (agent_env/openrlhf_agent.py) plus a probe of where it was loaded."""
import dataclasses, json, os, socket

from agent_env.config import load_config
from agent_env.executor import AgentExecutor, AgentInstance

with open({PROBE!r}, "w") as f:
    json.dump({{"host": socket.gethostname(), "file": __file__,
               "config": dataclasses.asdict(load_config()),
               "config_path": os.environ.get("SGRPO_AGENT_CONFIG"),
               "config_path_exists": os.path.exists(os.environ.get("SGRPO_AGENT_CONFIG") or "/nonexistent"),
               "named_file_exists": os.path.exists({AGENT_FILE!r})}}, f)

__all__ = ["AgentExecutor", "AgentInstance"]
'''
MODEL = "/models/policy"  # copied to both nodes (the trainer reads its tokenizer, B the weights)
DATA = "/home/driver/train.jsonl"
RUN = "/run/sgrpo"
CKPT, OUT, RECORDS, TB = f"{RUN}/ckpt", f"{RUN}/model", f"{RUN}/records", f"{RUN}/tb"
NODE_ENV = {"PYTHONPATH": "/opt/multinode_site", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "RAY_DEDUP_LOGS": "0",
            "RAY_USAGE_STATS_ENABLED": "0", "TOKENIZERS_PARALLELISM": "false",
            # vLLM's CPU sampler is a torch.compile'd function; inductor needs a C++ compiler, which
            # the image (offline, no build tools) lacks: run it eagerly, as enforce_eager does the model
            "TORCHDYNAMO_DISABLE": "1"}


def docker(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return run(["docker", *args], timeout=timeout)


def sh(container: str, script: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    return docker("exec", *[a for k, v in env.items() for a in ("-e", f"{k}={v}")], container, "bash", "-c", script,
                  timeout=timeout)


def must(proc: subprocess.CompletedProcess, what: str) -> str:
    assert proc.returncode == 0, f"{what} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


def exists(container: str, path: str) -> bool:
    return sh(container, f"test -e {path}", timeout=60).returncode == 0


def files_under(container: str, path: str) -> list[str]:
    proc = sh(container, f"cd {path} 2>/dev/null && find . -type f | sort", timeout=60)
    return [ln[2:] for ln in proc.stdout.split()] if proc.returncode == 0 else []


def compose_command() -> list[str]:
    if run(["docker", "compose", "version"], timeout=60).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    pytest.skip("neither `docker compose` nor `docker-compose` is installed (apt-get install docker-compose)")


def stack_on_network(compose: list[str], env: dict[str, str], dest: Path) -> Path:
    """docker-compose.yml as Compose renders it with `env`, its two services attached to the
    test's network (an external one) instead of publishing ports."""
    proc = subprocess.run([*compose, "--project-directory", str(REPO), "-f", str(REPO / "docker-compose.yml"),
                           "config"], capture_output=True, text=True, env=env, cwd=REPO, timeout=120, check=False)
    config = yaml.safe_load(must(proc, "compose config"))
    for name in ("retriever", "sandbox"):
        del config["services"][name]["ports"]
        config["services"][name]["networks"] = [NET]
    config["networks"] = {NET: {"external": True, "name": NET}}
    dest.write_text(yaml.safe_dump(config, sort_keys=False))
    return dest


def small_index(dest: Path) -> Path:
    """The 4-passage MiniLM index, its model folder inside it (the retriever sees only INDEX_DIR)."""
    from openrlhf_sgrpo.assets import AssetMissing, minilm_dir

    try:
        model = minilm_dir()
    except AssetMissing as err:
        pytest.skip(f"MiniLM missing: {err}")
    (dest / "corpus.jsonl").write_text("".join(json.dumps(p) + "\n" for p in CORPUS))
    index = dest / "index"
    index.mkdir()
    shutil.copytree(model, index / "minilm")
    proc = subprocess.run([sys.executable, "-m", "retriever_server.build_index", "--corpus", str(dest / "corpus.jsonl"),
                           "--model", str(index / "minilm"), "--out", str(index), "--batch-size", "32"],
                          capture_output=True, text=True, timeout=600, check=False)
    must(proc, "build_index")
    for path in [index, *index.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return index


def start_node(name: str, hostname: str, image: str) -> None:
    env = [a for k, v in NODE_ENV.items() for a in ("-e", f"{k}={v}")]
    must(docker("run", "-d", "--name", name, "--hostname", hostname, "--network", NET, "--shm-size", "2g",
                *env, image, "sleep", "infinity"), f"docker run {name}")
    must(docker("cp", str(SITE), f"{name}:/opt/multinode_site"), "docker cp the site")
    must(sh(name, "rm -rf /opt/multinode_site/__pycache__"), "site")


def wait_for_service(url: str, deadline_s: float = 300) -> None:
    end = time.monotonic() + deadline_s
    probe = f"import urllib.request; urllib.request.urlopen({url!r}, timeout=5)"
    while time.monotonic() < end:
        if sh(NODE_A, f"python3 -c {json.dumps(probe)}", timeout=60).returncode == 0:
            return
        time.sleep(2)
    raise AssertionError(f"{url} did not answer from node A within {deadline_s} s")


def fetch(url: str) -> str:
    code = (f"import urllib.request as u; r = u.Request({url!r}, headers={{'Authorization': 'Bearer {TOOLS_TOKEN}'}}); "
            "print(u.urlopen(r, timeout=10).read().decode())")
    return must(sh(NODE_A, f"python3 -c {json.dumps(code)}"), f"GET {url}")


def train_cmd(*extra: str) -> str:
    flags = [
        "--actor.model_name_or_path", MODEL, "--train.agent_func_path", AGENT_FILE,
        "--data.prompt_dataset", DATA, "--data.input_key", "question", "--data.label_key", "answers",
        "--actor.num_nodes", "1", "--actor.num_gpus_per_node", "1", "--vllm.num_engines", "1", "--vllm.enforce_eager",
        "--data.max_len", "512", "--rollout.max_new_tokens", "16", "--rollout.temperature", "0.5",
        "--rollout.batch_size", "3", "--rollout.n_samples_per_prompt", str(N), "--rollout.micro_batch_size", "6",
        "--train.batch_size", "6", "--train.micro_batch_size", "6", "--algo.kl.init_coef", "0",
        "--algo.advantage.estimator", "stratified_grpo", "--algo.advantage.sgrpo_alpha", str(ALPHA),
        "--ds.attn_implementation", "eager", "--sgrpo.optimizer", "torch_fused",
        "--ckpt.save_steps", "1", "--ckpt.path", CKPT, "--ckpt.output_dir", OUT,
        "--sgrpo.dump_rollouts", "3", "--sgrpo.run_dir", RECORDS, "--logger.tensorboard_dir", TB,
        "--sgrpo.shared_fs", RUN, *extra]
    return "cd /tmp && python3 -m openrlhf_sgrpo.cli.train_ppo_ray " + " ".join(flags)


class World:
    def __init__(self, tmp: Path, logs: Path):
        self.tmp, self.logs = tmp, logs
        self.runs: list[subprocess.CompletedProcess] = []
        self.seconds: list[float] = []
        self.probe: dict = {}
        self.files: dict[str, dict[str, list[str]]] = {}

    def train(self, *extra: str, timeout: float = 1500) -> subprocess.CompletedProcess:
        t0 = time.monotonic()
        proc = sh(NODE_A, train_cmd(*extra), timeout=timeout, SGRPO_AGENT_CONFIG=AGENT_CONFIG, RAY_ADDRESS="auto",
                  VLLM_RPC_BASE_PATH="/tmp", SGRPO_TOOLS_TOKEN=TOOLS_TOKEN)
        self.seconds.append(time.monotonic() - t0)
        self.runs.append(proc)
        (self.logs / f"train{len(self.runs)}.log").write_text(f"{proc.stdout}\n----- stderr\n{proc.stderr}")
        return proc

    def snapshot(self, label: str) -> None:
        self.files[label] = {node: files_under(c, RUN) for node, c in (("A", NODE_A), ("B", NODE_B))}

    def records(self) -> list[dict]:
        dest = self.tmp / "records"
        shutil.rmtree(dest, ignore_errors=True)
        must(docker("cp", f"{NODE_A}:{RECORDS}", str(dest)), "docker cp the records")
        out = []
        for path in sorted(dest.rglob("step_*.jsonl")):
            out += [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
        return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The network, the stack, the two nodes, Ray across them; both training runs. Torn down after."""
    require_engine()
    compose = compose_command()
    if "vllm-cpu" not in vllm_cpu_closure():  # the image installs it as make install does, where this venv has it
        skip("this venv has no vLLM CPU build (scripts/install_vllm_cpu.sh: an x86-64 with AVX2 or AVX-512)")
    image = train_image()
    images = {"TOOLS_IMAGE": tools_image(), "SANDBOX_IMAGE": sandbox_image()}
    from fitted_policy import QUESTIONS, fitted_policy_dir

    policy = fitted_policy_dir()
    tmp = Path(tempfile.mkdtemp(prefix="sgrpo-multinode-"))
    w = World(tmp, tmp_path_factory.mktemp("multinode-logs"))
    index = small_index(tmp)
    token_file = tmp / "tools.token"  # tmp is 0700; the file 0644: the retriever runs as nobody
    token_file.write_text(TOOLS_TOKEN + "\n")
    token_file.chmod(0o644)
    settings = {**images, "INDEX_DIR": str(index), "RETRIEVER_PORT": "8000", "SANDBOX_PORT": "8080",
                "DOCKER_SOCKET": engine_socket(), "RETRIEVER_ARGS": "--model /index/minilm", "HF_HUB_OFFLINE": "1",
                "SANDBOX_CONCURRENCY": "2", "TOOLS_TOKEN_FILE": str(token_file)}
    env = {k: v for k, v in docker_env().items() if not k.startswith(("RETRIEVER_", "SANDBOX_", "INDEX_DIR"))}
    env.update(settings)
    stack = [*compose, "--project-name", PREFIX, "--project-directory", str(REPO),
             "-f", str(stack_on_network(compose, env, tmp / "docker-compose.yml"))]
    try:
        must(docker("network", "create", "--internal", NET), "docker network create")
        must(run([*stack, "up", "-d", "--no-build", "retriever", "sandbox"], env=env, timeout=600), "compose up")
        start_node(NODE_A, "node-a", image)
        start_node(NODE_B, "node-b", image)
        # what only node A has: the agent config, the agent file, the prompts
        (tmp / "agent_config.yaml").write_text(
            f"retriever_url: {RETRIEVER_URL}\nsandbox_url: {SANDBOX_URL}\ntemplate: deep_research\nmax_turns: 2\n"
            "topk: 2\nmax_obs_tokens: 48\nmax_tokens_per_turn: 16\nreward: em\n")
        (tmp / "probe_agent.py").write_text(PROBE_AGENT)
        (tmp / "train.jsonl").write_text("".join(json.dumps({"question": q, "answers": [g]}) + "\n"
                                                 for q, g in QUESTIONS))
        must(sh(NODE_A, f"mkdir -p {AGENT_DIR}"), "mkdir")
        for src, dst in (("agent_config.yaml", AGENT_CONFIG), ("probe_agent.py", AGENT_FILE), ("train.jsonl", DATA)):
            must(docker("cp", str(tmp / src), f"{NODE_A}:{dst}"), f"docker cp {src}")
        for node in (NODE_A, NODE_B):  # the model at the same path on both nodes: copied, not shared
            must(sh(node, "mkdir -p /models"), "mkdir")
            must(docker("cp", str(policy), f"{node}:{MODEL}", timeout=600), "docker cp the model")
        must(sh(NODE_A, "ray start --head --port=6379 --num-cpus=4 --num-gpus=0 --include-dashboard=false "
                        "--disable-usage-stats", timeout=300), "ray start --head on A")
        must(sh(NODE_B, "ray start --address=node-a:6379 --num-cpus=4 --num-gpus=2 --disable-usage-stats",
                timeout=300), "ray start on B")
        wait_for_service("http://retriever:8000/health")
        wait_for_service("http://sandbox:8080/health")
        w.first = w.train("--train.num_episodes", "2")
        w.snapshot("first")
        w.probe = json.loads(must(sh(NODE_B, f"cat {PROBE}"), "the agent probe on B"))
        w.probe_on_a = exists(NODE_A, PROBE)
        w.metrics = {"retriever": json.loads(fetch("http://retriever:8000/metrics.json")),
                     "sandbox": fetch("http://sandbox:8080/metrics")}
        w.records_first = w.records() if w.first.returncode == 0 else []
        if w.first.returncode == 0:
            # the trainer-side view of the checkpoint a shared mount would give node A (see the docstring)
            local = tmp / "ckpt_actor"
            must(docker("cp", f"{NODE_B}:{CKPT}/_actor", str(local)), "docker cp _actor from B")
            must(sh(NODE_A, f"mkdir -p {CKPT}"), "mkdir")
            must(docker("cp", str(local), f"{NODE_A}:{CKPT}/_actor"), "docker cp _actor to A")
            w.resume = w.train("--train.num_episodes", "3", "--ckpt.load_enable")
            w.snapshot("resume")
            w.records_all = w.records()
        yield w
    finally:
        for node in (NODE_A, NODE_B):
            logs = docker("logs", "--tail", "5", node, timeout=60)
            del logs
            docker("rm", "-f", node, timeout=120)
        run([*stack, "down", "-v", "--remove-orphans"], env=env, timeout=300)
        docker("network", "rm", NET, timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)


def _tail(proc: subprocess.CompletedProcess) -> str:
    errors = [ln for ln in proc.stderr.splitlines() if "Error" in ln and "raise" not in ln][:20]
    return "\n".join(["first error lines:", *errors, "last lines:", proc.stderr[-3000:]])


def test_two_steps_on_two_nodes_then_a_resume(world):
    assert world.first.returncode == 0, _tail(world.first)
    assert world.resume.returncode == 0, _tail(world.resume)
    steps = sorted({r["step"] for r in world.records_all})
    assert steps == [1, 2, 3], steps  # two steps, then the resume's third (numbering continued)
    print(f"two-node run: first invocation {world.seconds[0]:.0f} s, resume {world.seconds[1]:.0f} s")


def test_the_agent_on_b_has_the_drivers_config_and_file_without_files_on_b(world):
    assert world.first.returncode == 0, _tail(world.first)
    probe = world.probe
    assert probe["host"] == "node-b"  # the engine, hence the agent, ran on B
    assert not world.probe_on_a  # and on no engine of A
    cfg = probe["config"]
    assert (cfg["retriever_url"], cfg["sandbox_url"]) == (RETRIEVER_URL, SANDBOX_URL)
    assert (cfg["template"], cfg["max_turns"], cfg["max_tokens_per_turn"]) == ("deep_research", 2, 16)
    assert probe["config_path"] == AGENT_CONFIG and not probe["config_path_exists"]  # no such file on B
    assert not exists(NODE_B, AGENT_CONFIG) and not exists(NODE_B, AGENT_FILE) and not exists(NODE_B, DATA)
    # the agent file: the named path is not on B; B loaded the copy the worker wrote from its content
    assert not probe["named_file_exists"]
    assert probe["file"].startswith("/tmp/sgrpo-agent-") and probe["file"].endswith("/probe_agent.py")
    assert must(sh(NODE_B, f"cat {probe['file']}"), "cat") == must(sh(NODE_A, f"cat {AGENT_FILE}"), "cat")


def test_tool_calls_from_b_reach_the_services_and_are_counted(world):
    """The fitted policy searches on its first question and runs code on its second, so both
    services are called in every step; each answered call is one query or run in their counters.
    Both services require the token, which only the CLI's environment on node A had: B's engine
    got it from the runtime env the CLI gives the workers (a 401 would be the turn's output)."""
    assert world.first.returncode == 0, _tail(world.first)
    samples = [s for g in world.records_first for s in g["samples"]]
    turns = [t for s in samples for t in s["turns"]]
    assert sum(s["search_calls"] for s in samples) > 0 and sum(s["code_calls"] for s in samples) > 0
    titles = [c["contents"].split("\n")[0].strip('"') for c in CORPUS]
    found = [t for t in turns if t["kind"] == "search" and any(x in (t.get("output") or "") for x in titles)]
    ran = [t for t in turns if t["kind"] == "code" and "42" in (t.get("output") or "")]
    assert found and ran, [(t["kind"], t.get("output")) for t in turns if t["kind"] in ("search", "code")]
    retriever = world.metrics["retriever"]
    assert retriever["requests"].get("/retrieve", 0) >= 1 and retriever["queries"] >= len(found), retriever
    runs = sum(int(float(ln.rsplit(" ", 1)[1])) for ln in world.metrics["sandbox"].splitlines()
               if ln.startswith("sandbox_runs_total"))
    assert runs >= len(ran), world.metrics["sandbox"]


def _partition(ids: list) -> list[list[int]]:
    """Each group's ids relabelled by first appearance: equal lists mean equal strata."""
    out = []
    for g in range(0, len(ids), N):
        first: dict = {}
        out.append([first.setdefault(i, len(first)) for i in ids[g:g + N]])
    return out


def test_strata_and_advantages_equal_the_one_node_computation(world):
    """Recomputed on this host from the records, with the estimator the one-node path calls."""
    import torch

    from openrlhf_sgrpo.advantages import stratified_advantages
    from openrlhf_sgrpo.strata import strata_from_info

    assert world.first.returncode == 0, _tail(world.first)
    by_step: dict[int, list[dict]] = {}
    for g in world.records_first:
        by_step.setdefault(g["step"], []).append(g)
    assert sorted(by_step) == [1, 2]
    for step, groups in by_step.items():
        groups.sort(key=lambda g: g["group"])
        samples = [s for g in groups for s in g["samples"]]
        assert all(g["n"] == N for g in groups) and len(samples) == 3 * N
        strata = strata_from_info({"tool_calls": torch.tensor([float(s["tool_calls"]) for s in samples])},
                                  "tool_calls")
        # the same strata: the same partition of each prompt's samples (ids are only batch-local)
        assert _partition([s["stratum"] for s in samples]) == _partition(strata.tolist()), step
        rewards = torch.tensor([s["reward"] for s in samples], dtype=torch.float32)
        expected = stratified_advantages(rewards, strata, N, alpha=ALPHA)
        trained = torch.tensor([s["advantage"] for s in samples], dtype=torch.float32)
        assert torch.allclose(trained, expected.float(), atol=1e-5), (step, trained, expected)


def test_outputs_land_where_the_docs_say(world):
    """docs/multinode.md "What runs where": the checkpoint (every rank's shards, `latest`) on the
    policy rank's node (B), the final model too (rank 0's); rollout records and TensorBoard on
    the PPOTrainer actor's node, which the CLI pins to the driver's (A)."""
    assert world.first.returncode == 0, _tail(world.first)
    a, b = world.files["first"]["A"], world.files["first"]["B"]
    assert "ckpt/_actor/latest" in b and any(f.startswith("ckpt/_actor/global_step2/") for f in b), b
    assert not any(f.startswith("ckpt/") for f in a), a
    assert "model/config.json" in b and "model/model.safetensors" in b, b  # the final model: rank 0's node
    assert not any(f.startswith("model/") for f in a), a
    assert {"records/rollouts/train/step_000001.jsonl", "records/rollouts/train/step_000002.jsonl"} <= set(a), a
    assert any(f.startswith("tb/") and "tfevents" in f for f in a), a
    assert not any(f.startswith(("records/", "tb/")) for f in b), b
