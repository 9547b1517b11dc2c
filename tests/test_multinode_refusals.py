"""Issue #51 (b): on more than one node, a loopback tool URL or a checkpoint/log path not on shared
storage is refused at launch, each message naming the value, before any actor starts.

"More than one node" comes from the flags (``--actor.num_nodes 2``: what the launch scripts pass for
``NUM_NODES``) or, at launch, from the Ray cluster the CLI joined: tested on a real two-node Ray
cluster on this machine (``ray.cluster_utils.Cluster``: two raylets, two node ids), where the
flags say one node.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_env.config import CONFIG_ENV, CONFIG_YAML_ENV, AgentConfig
from openrlhf_sgrpo.cli.multinode import is_loopback_host, multinode_errors

REPO = Path(__file__).resolve().parent.parent
AGENT_FILE = str(REPO / "agent_env" / "openrlhf_agent.py")
SHARED_URL = "http://retriever:8000/retrieve"
BASE = ["--actor.model_name_or_path", "Qwen/Qwen2.5-3B", "--rollout.n_samples_per_prompt", "4",
        "--algo.advantage.estimator", "stratified_grpo", "--train.agent_func_path", AGENT_FILE]


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    monkeypatch.delenv(CONFIG_YAML_ENV, raising=False)
    return monkeypatch


def parsed(*argv: str):
    from openrlhf_sgrpo.cli.train_ppo_ray import parse_config

    return parse_config([*BASE, *argv])


def shared_paths(root: str) -> list[str]:
    return ["--ckpt.output_dir", f"{root}/model", "--ckpt.path", f"{root}/ckpt", "--ckpt.save_steps", "1",
            "--sgrpo.dump_rollouts", "1", "--sgrpo.run_dir", f"{root}/run", "--logger.tensorboard_dir", f"{root}/tb"]


@pytest.mark.parametrize("host", ["127.0.0.1", "127.9.8.7", "localhost", "LOCALHOST", "api.localhost", "::1", "[::1]",
                                  "0.0.0.0", "::"])
def test_loopback_hosts(host):
    assert is_loopback_host(host)


@pytest.mark.parametrize("host", ["retriever", "10.0.0.5", "128.0.0.1", "localhost.example.com", "::2", None, ""])
def test_hosts_every_node_can_mean_the_same_service(host):
    assert not is_loopback_host(host)


def test_one_node_refuses_nothing():
    """The agent's loopback defaults and relative paths are fine on one host."""
    assert multinode_errors(parsed(), AgentConfig()) == []


def test_two_nodes_refuse_each_loopback_url_and_unshared_path_by_name():
    args = parsed("--actor.num_nodes", "2", "--ref.num_nodes", "2", *shared_paths("/local/disk"))
    errors = multinode_errors(args, AgentConfig(retriever_url="http://localhost:8000/retrieve",
                                                sandbox_url="http://127.0.0.1:8080/run_code", template="deep_research"))
    text = "\n".join(errors)
    assert len(errors) == 6, text
    assert "agent config retriever_url 'http://localhost:8000/retrieve' is a loopback address" in text
    assert "agent config sandbox_url 'http://127.0.0.1:8080/run_code' is a loopback address" in text
    for flag, path in [("--ckpt.output_dir", "/local/disk/model"), ("--ckpt.path", "/local/disk/ckpt"),
                       ("--sgrpo.run_dir", "/local/disk/run"), ("--logger.tensorboard_dir", "/local/disk/tb")]:
        assert f"{flag} {path!r} is not on storage every node sees (no --sgrpo.shared_fs was given)" in text
    assert all("(--actor.num_nodes 2)" in e for e in errors)


def test_shared_storage_and_named_services_pass_on_two_nodes():
    args = parsed("--actor.num_nodes", "2", *shared_paths("/shared/run1"), "--sgrpo.shared_fs", "/shared")
    assert multinode_errors(args, AgentConfig(retriever_url=SHARED_URL, sandbox_url=None)) == []
    # a path beside the shared folder, not in it, is still refused
    args = parsed("--actor.num_nodes", "2", *shared_paths("/shared-not/run1"), "--sgrpo.shared_fs", "/shared")
    errors = multinode_errors(args, AgentConfig(retriever_url=SHARED_URL, sandbox_url=None))
    assert len(errors) == 4 and all("not under --sgrpo.shared_fs /shared" in e for e in errors)


def test_relative_paths_are_refused_on_two_nodes_and_the_checkpoint_path_only_when_used():
    args = parsed("--ref.num_nodes", "2")  # OpenRLHF's defaults: ./ckpt, no saving
    errors = multinode_errors(args, None)
    assert errors == [e for e in errors if e.startswith("--ckpt.output_dir './ckpt' is a relative path")] != []
    assert len(errors) == 1  # --ckpt.path is neither written (save_steps -1) nor read (no load_enable)
    errors = multinode_errors(parsed("--ref.num_nodes", "2", "--ckpt.load_enable"), None)
    assert any(e.startswith("--ckpt.path './ckpt/checkpoints_ppo_ray' is a relative path") for e in errors)


def test_the_sandbox_url_matters_only_to_a_template_that_offers_code():
    """Search-R1's templates never send <code>; their (default, loopback) sandbox_url is never called."""
    args = parsed("--actor.num_nodes", "2", *shared_paths("/shared/r"), "--sgrpo.shared_fs", "/shared")
    assert multinode_errors(args, AgentConfig(retriever_url=SHARED_URL)) == []
    errors = multinode_errors(args, AgentConfig(retriever_url=SHARED_URL, template="deep_research"))
    assert len(errors) == 1 and errors[0].startswith("agent config sandbox_url 'http://127.0.0.1:8080/run_code'")


def test_a_cluster_of_two_alive_nodes_counts_even_when_the_flags_say_one():
    errors = multinode_errors(parsed(), AgentConfig(), alive_nodes=2)
    assert errors and all("(the Ray cluster has 2 alive nodes)" in e for e in errors)
    assert multinode_errors(parsed(), AgentConfig(), alive_nodes=1) == []


def test_a_loopback_remote_reward_model_is_refused():
    from openrlhf_sgrpo.cli.train_ppo_ray import parse_config

    args = parse_config(["--actor.model_name_or_path", "m", "--reward.remote_url", "http://localhost:5000/get_reward",
                         "--actor.num_nodes", "2", "--ckpt.output_dir", "/shared/m", "--sgrpo.shared_fs", "/shared"])
    assert multinode_errors(args, None) == [e for e in multinode_errors(args, None)
                                            if e.startswith("--reward.remote_url 'http://localhost:5000/get_reward'")]
    assert len(multinode_errors(args, None)) == 1


def test_a_relative_shared_fs_is_refused_by_the_parser():
    from openrlhf_sgrpo.cli.train_ppo_ray import CliError

    with pytest.raises(CliError, match=r"--sgrpo.shared_fs 'runs' must be an absolute path"):
        parsed("--sgrpo.shared_fs", "runs")


def test_the_cli_dry_run_refuses_the_agents_loopback_defaults_on_two_nodes(clean_env, tmp_path):
    """Through the real entry: no agent config given, so the agent would use its defaults
    (a 127.0.0.1 retriever); with --actor.num_nodes 2 that is refused, naming it."""
    out = subprocess.run([sys.executable, "-m", "openrlhf_sgrpo.cli.train_ppo_ray", *BASE, "--actor.num_nodes", "2",
                          "--ref.num_nodes", "2", *shared_paths(str(tmp_path)), "--sgrpo.shared_fs", str(tmp_path),
                          "--dry_run"],
                         cwd=REPO, env={k: v for k, v in os.environ.items() if k not in (CONFIG_ENV, CONFIG_YAML_ENV)},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "agent config retriever_url 'http://127.0.0.1:8000/retrieve' is a loopback address" in out.stderr
    assert "sandbox_url" not in out.stderr  # Search-R1's template never calls the sandbox
    assert "--ckpt" not in out.stderr  # the paths are under the shared folder
    assert out.stdout == ""


def test_the_launch_scripts_refuse_a_relative_save_path_on_two_nodes(tmp_path):
    """NUM_NODES=2 states SAVE_PATH as shared storage (examples/lib/launch.sh); a relative one is refused."""
    env = {**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable, "NUM_NODES": "2", "SAVE_PATH": "runs/x",
           "RETRIEVER_URL": SHARED_URL, "DATA_DIR": str(tmp_path)}
    proc = subprocess.run(["bash", str(REPO / "examples/qwen2.5-3b/train_sgrpo_base.sh")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "--sgrpo.shared_fs 'runs/x' must be an absolute path" in proc.stderr


@pytest.mark.slow
def test_launch_on_a_two_node_ray_cluster_refuses_before_any_actor_starts(clean_env, tmp_path, capsys):
    """The flags say one node; the Ray cluster the CLI joins (RAY_ADDRESS) has two. The real
    ``main`` (no dry run) connects, counts the alive nodes, refuses the agent's loopback retriever
    and the unshared checkpoint folder, and leaves no actor behind."""
    import ray
    from ray.cluster_utils import Cluster

    from openrlhf_sgrpo.cli.train_ppo_ray import main

    config = tmp_path / "agent_config.yaml"
    config.write_text("retriever_url: http://127.0.0.1:8000/retrieve\nsandbox_url: null\n")
    clean_env.setenv(CONFIG_ENV, str(config))
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    clean_env.setenv("RAY_ADDRESS", cluster.address)
    try:
        rc = main([*BASE, "--ckpt.output_dir", str(tmp_path / "model")])
        err = capsys.readouterr().err
        assert not ray.is_initialized()  # the CLI let go of the cluster it joined
        ray.init(address=cluster.address)
        from ray._private import state

        actors = state.actors()
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert rc == 2, err[-3000:]
    assert "agent config retriever_url 'http://127.0.0.1:8000/retrieve' is a loopback address" in err
    assert f"--ckpt.output_dir {str(tmp_path / 'model')!r} is not on storage every node sees" in err
    assert "(the Ray cluster has 2 alive nodes)" in err
    assert actors == {}
