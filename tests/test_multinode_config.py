"""Issue #51 (a): what a worker node needs from the driver travels by content, not by path.

The agent config ($SGRPO_AGENT_CONFIG) and the ``--train.agent_func_path`` file are read and
checked by the CLI at launch; the config's YAML reaches every Ray worker as
$SGRPO_AGENT_CONFIG_YAML, the agent file's text is written by each worker's setup hook
(:mod:`openrlhf_sgrpo.cli.worker_setup`) to the path OpenRLHF is given. "No file on node B" is
simulated honestly on one machine: the driver deletes both files after Ray has started and before
any worker reads them; the worker then builds the agent with OpenRLHF's own
``_load_agent_executor``, exactly as a vLLM engine actor does.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent_env.config import CONFIG_ENV, CONFIG_YAML_ENV, ConfigError, load_config

REPO = Path(__file__).resolve().parent.parent
AGENT_FILE = str(REPO / "agent_env" / "openrlhf_agent.py")
# Values no default has, so a worker that fell back to the defaults cannot pass.
DISTINCT = {"retriever_url": "http://retriever.multinode.test:8000/retrieve", "sandbox_url": None,
            "max_turns": 3, "topk": 5, "max_obs_tokens": 77, "reward": "f1"}
CONFIG_TEXT = "".join(f"{k}: {'null' if v is None else v}\n" for k, v in DISTINCT.items())
DRY = ["--actor.model_name_or_path", "Qwen/Qwen2.5-3B", "--rollout.n_samples_per_prompt", "4",
       "--algo.advantage.estimator", "stratified_grpo", "--dry_run"]


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    monkeypatch.delenv(CONFIG_YAML_ENV, raising=False)
    return monkeypatch


# ------------------------------------------------------------------ the agent's loader (agent_env)

def test_the_content_wins_over_a_path_that_names_nothing_here(clean_env):
    clean_env.setenv(CONFIG_ENV, "/head/only/agent_config.yaml")
    clean_env.setenv(CONFIG_YAML_ENV, CONFIG_TEXT)
    cfg = load_config()
    assert {k: getattr(cfg, k) for k in DISTINCT} == DISTINCT


def test_a_path_that_exists_on_the_node_still_works(clean_env, tmp_path):
    path = tmp_path / "agent_config.yaml"
    path.write_text(CONFIG_TEXT)
    clean_env.setenv(CONFIG_ENV, str(path))
    assert {k: getattr(load_config(), k) for k in DISTINCT} == DISTINCT


def test_bad_content_is_refused_naming_the_variable_and_the_file_it_came_from(clean_env):
    clean_env.setenv(CONFIG_ENV, "/runs/x/agent_config.yaml")
    clean_env.setenv(CONFIG_YAML_ENV, "max_turn: 3\n")
    with pytest.raises(ConfigError, match=r"\$SGRPO_AGENT_CONFIG_YAML \(the content of '/runs/x/agent_config.yaml'\)"
                                          r".*unknown agent config keys \['max_turn'\]"):
        load_config()
    clean_env.setenv(CONFIG_YAML_ENV, "- a list\n")
    with pytest.raises(ConfigError, match="must be a YAML mapping"):
        load_config()


# ---------------------------------------------------------------------- the CLI, at launch

def test_the_cli_refuses_a_missing_config_file_naming_it(clean_env, tmp_path):
    """Through the real entry (``python -m``), before Ray: the file the driver cannot read."""
    missing = tmp_path / "nowhere" / "agent_config.yaml"
    env = {**os.environ, CONFIG_ENV: str(missing)}
    out = subprocess.run([sys.executable, "-m", "openrlhf_sgrpo.cli.train_ppo_ray", *DRY,
                          "--train.agent_func_path", AGENT_FILE],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert f"agent config file {str(missing)!r}" in out.stderr and "does not exist" in out.stderr
    assert out.stdout == ""  # nothing printed as if it had worked


def test_the_cli_refuses_a_bad_config_file_naming_it_and_the_key(clean_env, tmp_path, capsys):
    from openrlhf_sgrpo.cli.train_ppo_ray import main

    bad = tmp_path / "agent_config.yaml"
    bad.write_text("max_turn: 3\n")
    clean_env.setenv(CONFIG_ENV, str(bad))
    assert main([*DRY, "--train.agent_func_path", AGENT_FILE]) == 2
    err = capsys.readouterr().err
    assert f"agent config {str(bad)!r}" in err and "unknown agent config keys ['max_turn']" in err


def test_the_cli_refuses_a_missing_agent_file_naming_it(clean_env, tmp_path, capsys):
    from openrlhf_sgrpo.cli.train_ppo_ray import main

    missing = str(tmp_path / "my_agent.py")
    assert main([*DRY, "--train.agent_func_path", missing]) == 2
    assert f"--train.agent_func_path {missing!r} does not exist" in capsys.readouterr().err


def test_a_large_agent_file_is_refused_saying_how_to_make_it_work(clean_env, tmp_path):
    from openrlhf_sgrpo.cli import worker_setup
    from openrlhf_sgrpo.cli.train_ppo_ray import CliError, agent_file_at_launch

    big = tmp_path / "big_agent.py"
    big.write_text("#" * (worker_setup.MAX_AGENT_SOURCE_BYTES + 1))
    with pytest.raises(CliError, match="import the agent from a package installed on every node"):
        agent_file_at_launch(str(big))


def test_the_runtime_env_carries_the_content_and_the_hook_that_writes_the_agent_file(clean_env, tmp_path):
    from openrlhf_sgrpo.cli import worker_setup
    from openrlhf_sgrpo.cli.train_ppo_ray import ray_runtime_env, worker_payload

    path = tmp_path / "agent_config.yaml"
    path.write_text(CONFIG_TEXT)
    clean_env.setenv(CONFIG_ENV, str(path))
    payload = worker_payload(AGENT_FILE)
    env = ray_runtime_env(payload=payload)
    assert env["env_vars"][CONFIG_YAML_ENV] == CONFIG_TEXT
    assert env["env_vars"][worker_setup.AGENT_SOURCE_ENV] == Path(AGENT_FILE).read_text()
    assert env["env_vars"][worker_setup.AGENT_PATH_ENV] == payload.agent_path != AGENT_FILE
    assert payload.agent_path.endswith("/openrlhf_agent.py")
    assert env["worker_process_setup_hook"] == "openrlhf_sgrpo.cli.worker_setup.install_missing_flash_attn"
    # nothing shipped: the plain stand-in installer, as before
    assert ray_runtime_env()["worker_process_setup_hook"].startswith("openrlhf_sgrpo.openrlhf_ext.gpu_import_standins.")


# ------------------------------------------------------------------------------ real Ray

def _agent_in_a_worker(agent_func_path: str, config_file: str, agent_file: str) -> dict:
    """In a Ray worker: build the agent as an engine actor does, from the path the CLI gave."""
    from openrlhf.trainer.ray.vllm_engine import _load_agent_executor

    executor = _load_agent_executor(agent_func_path)
    return {"config": dataclasses.asdict(executor.config), "executor": type(executor).__module__,
            "config_file_here": os.path.exists(config_file), "agent_file_here": os.path.exists(agent_file),
            "shipped_text": Path(agent_func_path).read_text(), "pid": os.getpid()}


@pytest.mark.slow
def test_a_worker_without_the_drivers_files_builds_the_agent_with_the_drivers_config(clean_env, tmp_path):
    import ray
    from ray import cloudpickle

    from openrlhf_sgrpo.cli.train_ppo_ray import ray_runtime_env, worker_payload

    config_file = tmp_path / "head_only" / "agent_config.yaml"
    config_file.parent.mkdir()
    config_file.write_text(CONFIG_TEXT)
    agent_file = tmp_path / "head_only" / "my_agent.py"  # a user's own file, outside any package
    agent_text = "# a user's agent file\nfrom agent_env.executor import AgentExecutor, AgentInstance  # noqa: F401\n"
    agent_file.write_text(agent_text)
    clean_env.setenv(CONFIG_ENV, str(config_file))

    payload = worker_payload(str(agent_file))
    shipped = Path(payload.agent_path)
    shutil.rmtree(shipped.parent, ignore_errors=True)  # a stale copy from an earlier run would prove nothing
    assert shipped != agent_file and not shipped.exists()
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(address="local", runtime_env=ray_runtime_env(hf_engines=True, payload=payload), num_cpus=1, num_gpus=0,
             include_dashboard=False, log_to_driver=False)
    try:
        assert not shipped.exists()  # the driver never writes it: only a worker can have
        shutil.rmtree(config_file.parent)  # the head's files are gone before any worker reads them
        probe = ray.remote(num_cpus=1)(_agent_in_a_worker)
        got = ray.get(probe.remote(str(shipped), str(config_file), str(agent_file)), timeout=600)
    finally:
        ray.shutdown()
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert got["pid"] != os.getpid()
    assert not got["config_file_here"] and not got["agent_file_here"]
    assert got["shipped_text"] == agent_text
    assert got["executor"] == "agent_env.executor"
    assert {k: got["config"][k] for k in DISTINCT} == DISTINCT
    assert got["config"] == dataclasses.asdict(payload.agent_config)
    shutil.rmtree(shipped.parent, ignore_errors=True)


# ------------------------------------------------------------- the launch scripts' submission

RAY_STAND_IN = """#!/usr/bin/env python3
# Stands in for the Ray CLI on PATH: records what `ray job submit` was asked to run, runs nothing.
import json, os, sys
open(os.environ["SUBMITTED"], "w").write(json.dumps(sys.argv[1:]))
"""


def test_the_launch_script_submits_the_config_by_content_and_the_head_needs_no_file(tmp_path):
    """``examples/lib/launch.sh`` without DRY_RUN: what it hands ``ray job submit`` (the Ray CLI
    itself is stood in for: no cluster here) carries the rendered config's *text*; the submitted
    command, run as the job's driver would run it on a head that lacks the rendered file (deleted)
    and sees only the job's variables, parses and validates."""
    import json

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ray").write_text(RAY_STAND_IN)
    (bin_dir / "ray").chmod(0o755)
    save = tmp_path / "shared" / "run"
    submitted = tmp_path / "submitted.json"
    env = {**{k: v for k, v in os.environ.items() if k not in (CONFIG_ENV, CONFIG_YAML_ENV)},
           "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": sys.executable, "SUBMITTED": str(submitted),
           "NUM_NODES": "2", "SAVE_PATH": str(save), "DATA_DIR": str(tmp_path / "data"),
           "RETRIEVER_URL": "http://retriever:8000/retrieve", "SKIP_HEALTH_CHECK": "1", "SERPER_API_KEY": "secret"}
    proc = subprocess.run(["bash", str(REPO / "examples/qwen2.5-3b/train_sgrpo_base.sh")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    argv = json.loads(submitted.read_text())
    assert argv[:2] == ["job", "submit"]
    runtime_env = json.loads(next(a for a in argv if a.startswith("--runtime-env-json=")).split("=", 1)[1])
    job_env = runtime_env["env_vars"]
    rendered = save / "agent_config.yaml"
    assert job_env[CONFIG_YAML_ENV] == rendered.read_text()
    assert "retriever_url: http://retriever:8000/retrieve" in job_env[CONFIG_YAML_ENV]
    assert "SERPER_API_KEY" not in job_env
    cli = argv[argv.index("--") + 1:]
    assert cli[:3] == ["python", "-m", "openrlhf_sgrpo.cli.train_ppo_ray"]
    assert cli[cli.index("--sgrpo.shared_fs") + 1] == str(save)
    rendered.unlink()  # the head does not have the submitting machine's file
    head_env = {k: v for k, v in os.environ.items() if k not in (CONFIG_ENV, CONFIG_YAML_ENV)} | job_env
    out = subprocess.run([sys.executable, *cli[1:], "--dry_run"], env=head_env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout[out.stdout.index("{\n"):])["sgrpo"]["shared_fs"] == [str(save)]
