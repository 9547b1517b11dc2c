"""Issue #58, the cluster path: the tools' token reaches a Ray worker by value, never as a path.

The paper's launch script (``examples/qwen2.5-3b/train_sgrpo_base.sh``, the Ray CLI stood in for:
no cluster here) is given ``TOOLS_TOKEN_FILE``; what it submits carries the file's *content* as
``SGRPO_TOOLS_TOKEN``, and the path nowhere. That job environment then reaches the CLI's own
``connect_ray`` the way Ray hands a job's runtime env to its driver (``RAY_JOB_CONFIG_JSON_ENV_VAR``
plus the variables set), with the token file deleted and the token gone from this process's
environment before the local Ray cluster starts: a worker can only have it from the runtime env.
In a worker, the agent's own clients, built from the agent config the CLI shipped by content
(``$SGRPO_AGENT_CONFIG_YAML``), search through the real retriever's ``/search`` and run code in
the real sandbox, both started with the token; a worker whose runtime env empties the variable
gets the 401 as a ToolError naming it. Without ``RAY_OVERRIDE_JOB_RUNTIME_ENV=1`` (which the
script now submits) Ray refuses to start the job's driver at all: the job and the CLI both set
the agent config's variables.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from fake_serper import FakeSerper

from agent_env.config import CONFIG_ENV, CONFIG_YAML_ENV
from agent_env.tools import TOKEN_ENV
from retriever_server.background import RunningServer
from retriever_server.config import ServerConfig
from retriever_server.websearch import SerperClient
from sandbox.process import SandboxProcess, SandboxStartError

REPO = Path(__file__).resolve().parent.parent
RESPONSES = json.loads((Path(__file__).parent / "fixtures" / "serper" / "responses.json").read_text())["responses"]
RAY_STAND_IN = """#!/usr/bin/env python3
# Stands in for the Ray CLI on PATH: records what `ray job submit` was asked to run, runs nothing.
import json, os, sys
open(os.environ["SUBMITTED"], "w").write(json.dumps(sys.argv[1:]))
"""


def _tools_in_a_worker() -> dict:
    """In a Ray worker: the agent's clients as an engine actor builds them (config from the
    environment Ray gave this process), one search and one run through them."""
    import asyncio

    from agent_env.config import load_config
    from agent_env.tools import ToolError, get_toolset

    cfg = load_config()

    async def main() -> dict:
        tools = get_toolset(cfg)
        out: dict = {"token_set": bool(os.environ.get("SGRPO_TOOLS_TOKEN")), "pid": os.getpid()}
        try:
            out["search"] = [d.id for d in await tools.search.search("capital of France")]
        except ToolError as err:
            out["search_error"] = str(err)
        try:
            out["run"] = await tools.sandbox.run("print(6 * 7)")
        except ToolError as err:
            out["run_error"] = str(err)
        await tools.close()
        return out

    return asyncio.run(main())


@pytest.fixture(scope="module")
def token() -> str:
    return secrets.token_hex(32)


@pytest.fixture(scope="module")
def services(token, tmp_path_factory):
    """The /search proxy (a fake Serper behind it: the paid provider) and the sandbox, both
    requiring ``token``."""
    with FakeSerper(RESPONSES) as fake:
        web = SerperClient("test-key", url=fake.url, cache_path=tmp_path_factory.mktemp("web") / "s.sqlite")
        with RunningServer(ServerConfig(auth_token=token.encode()), web=web) as srv:
            try:
                with SandboxProcess(backend="local", max_concurrency=1, env={TOKEN_ENV: token}) as sb:
                    yield srv.url + "/search", sb.url + "/run_code"
            except SandboxStartError as err:
                if not err.environment_missing:
                    raise
                pytest.skip(f"this host lacks what the local sandbox needs: {err}")


def _submitted_job(tmp_path: Path, token_file: Path, search_url: str, sandbox_url: str) -> tuple[dict, list]:
    """What the launch script hands `ray job submit`: (the job's env_vars, the command)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ray").write_text(RAY_STAND_IN)
    (bin_dir / "ray").chmod(0o755)
    submitted = tmp_path / "submitted.json"
    env = {**{k: v for k, v in os.environ.items() if k not in (CONFIG_ENV, CONFIG_YAML_ENV, TOKEN_ENV)},
           "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": sys.executable, "SUBMITTED": str(submitted),
           "SAVE_PATH": str(tmp_path / "run"), "DATA_DIR": str(tmp_path / "data"), "SKIP_HEALTH_CHECK": "1",
           "TOOLS_TOKEN_FILE": str(token_file),
           # the deep-research script renders web search and the sandbox into the agent config
           "WEB_SEARCH_URL": search_url, "SANDBOX_URL": sandbox_url}
    proc = subprocess.run(["bash", str(REPO / "examples/qwen3-8b/train_deep_research.sh")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    argv = json.loads(submitted.read_text())
    runtime_env = json.loads(next(a for a in argv if a.startswith("--runtime-env-json=")).split("=", 1)[1])
    return runtime_env["env_vars"], argv


@pytest.mark.slow  # a local Ray cluster: about a minute on 2 busy cores
def test_the_launch_script_submits_the_token_by_value_and_a_worker_gets_through_with_it(
        services, token, tmp_path, monkeypatch):
    import ray
    from ray import cloudpickle
    from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR

    from openrlhf_sgrpo.cli.train_ppo_ray import connect_ray, ray_runtime_env, worker_payload

    search_url, sandbox_url = services
    token_file = tmp_path / "secrets" / "tools.token"
    token_file.parent.mkdir()
    token_file.write_text(token + "\n")
    job_env, argv = _submitted_job(tmp_path, token_file, search_url, sandbox_url)
    assert job_env[TOKEN_ENV] == token  # the content, stripped of its newline ...
    assert str(token_file) not in json.dumps(argv) and "TOOLS_TOKEN_FILE" not in job_env  # ... never the path
    assert job_env["RAY_OVERRIDE_JOB_RUNTIME_ENV"] == "1"
    assert f"web_search_url: {search_url}" in job_env[CONFIG_YAML_ENV]
    token_file.unlink()  # the head has no file of the submitting machine's

    # the head: the job's driver runs with the job's variables; Ray gives it the job's runtime env
    for key in (CONFIG_ENV, CONFIG_YAML_ENV, TOKEN_ENV):
        monkeypatch.delenv(key, raising=False)
    for key, val in job_env.items():
        monkeypatch.setenv(key, val)
    assert ray_runtime_env(payload=worker_payload())["env_vars"][TOKEN_ENV] == token  # a CLI started by hand
    monkeypatch.setenv(RAY_JOB_CONFIG_JSON_ENV_VAR, json.dumps({"runtime_env": {"env_vars": job_env}}))
    monkeypatch.delenv(TOKEN_ENV)  # from here only the runtime env can carry it to a worker
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        connect_ray(address="local", num_cpus=1, num_gpus=0, include_dashboard=False, log_to_driver=False)
        probe = ray.remote(num_cpus=1)(_tools_in_a_worker)
        got = ray.get(probe.remote(), timeout=600)
        without = ray.get(probe.options(runtime_env={"env_vars": {TOKEN_ENV: ""}}).remote(), timeout=600)
    finally:
        ray.shutdown()
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert got["pid"] != os.getpid() and got["token_set"]
    assert got["search"][0] == RESPONSES["capital of France"]["organic"][0]["link"], got
    assert got["run"] == "42\n", got
    assert not without["token_set"]
    for key in ("search_error", "run_error"):
        assert "HTTP 401" in without[key] and f"set ${TOKEN_ENV}" in without[key], without


def test_without_the_override_ray_refuses_the_jobs_driver(monkeypatch):
    """Why the script submits RAY_OVERRIDE_JOB_RUNTIME_ENV=1: the job's env and the CLI's own
    ray.init both set the agent config's variables, and Ray refuses two runtime envs that set one
    variable (no cluster is started: the merge is checked first)."""
    import ray
    from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR

    monkeypatch.delenv("RAY_OVERRIDE_JOB_RUNTIME_ENV", raising=False)
    monkeypatch.setenv(RAY_JOB_CONFIG_JSON_ENV_VAR, json.dumps({"runtime_env": {"env_vars": {CONFIG_ENV: "/x"}}}))
    with pytest.raises(ValueError, match="RAY_OVERRIDE_JOB_RUNTIME_ENV=1"):
        ray.init(address="local", runtime_env={"env_vars": {CONFIG_ENV: "/x"}}, num_cpus=1, include_dashboard=False)
    assert not ray.is_initialized()
