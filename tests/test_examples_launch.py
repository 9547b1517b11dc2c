"""Launch scripts under examples/: DRY_RUN=1 runs OpenRLHF's real parser through our CLI's
--dry_run, and the parsed values must be the paper's settings.

The dry runs take ~10 s of CPU each (OpenRLHF's parser imports torch), so one module-scoped
fixture starts them all at once and every test reads its result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent_env.config import load_config

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
SHARED_RETRIEVER = "http://10.0.0.5:8000/retrieve"


@dataclass
class DryRun:
    rc: int
    stdout: str
    stderr: str
    save_path: Path
    data_dir: Path

    @property
    def config(self) -> dict:
        assert self.rc == 0, f"dry run failed (rc={self.rc}):\n{self.stderr[-3000:]}"
        return json.loads(self.stdout[self.stdout.index("{\n"):])

    @property
    def agent_config(self):
        return load_config(self.save_path / "agent_config.yaml")


# name -> (script, extra environment)
CASES = {
    "sgrpo_base": ("qwen2.5-3b/train_sgrpo_base.sh", {}),
    "sgrpo_instruct": ("qwen2.5-3b/train_sgrpo_instruct.sh", {}),
    "grpo_base": ("qwen2.5-3b/train_grpo_base.sh", {}),
    "multinode": ("qwen2.5-3b/train_sgrpo_base.sh", {"NUM_NODES": "2", "RETRIEVER_URL": SHARED_RETRIEVER}),
    "bad_alpha": ("qwen2.5-3b/train_grpo_base.sh", {"EXTRA_ARGS": "--algo.advantage.sgrpo_alpha 1.5"}),
    "deep_research": ("qwen3-8b/train_deep_research.sh", {"SANDBOX_URL": "http://sandbox:8080/run_code"}),
    # a shell that exported SAPO settings and a wandb key, resuming (issue #57)
    "exported_env": ("qwen2.5-3b/train_sgrpo_base.sh", {"SAPO": "1", "UPDATES_PER_STEP": "2",
                                                         "WANDB_API_KEY": "not-a-real-key",
                                                         "EXTRA_ARGS": "--ckpt.load_enable"}),
}


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory) -> dict[str, DryRun]:
    root = tmp_path_factory.mktemp("launch")
    procs = {}
    for name, (script, extra) in CASES.items():
        env = {**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable, "SAVE_PATH": str(root / name / "run"),
               "DATA_DIR": str(root / name / "data"), **extra}
        if "RETRIEVER_URL" not in extra:
            env.pop("RETRIEVER_URL", None)
        procs[name] = subprocess.Popen(["bash", str(EXAMPLES / script)], env=env, cwd=root,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    runs = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=600)
        runs[name] = DryRun(proc.returncode, out, err, root / name / "run", root / name / "data")
    return runs


def assert_paper_settings(cfg: dict) -> None:
    """The paper's Qwen2.5-3B setting, read back from OpenRLHF's own parsed namespace."""
    rollout, train, actor, algo, data = cfg["rollout"], cfg["train"], cfg["actor"], cfg["algo"], cfg["data"]
    assert actor["num_nodes"] * actor["num_gpus_per_node"] == 8
    assert rollout["batch_size"] == 256  # global batch (prompts per step)
    assert rollout["n_samples_per_prompt"] == 8
    assert train["batch_size"] == 256 * 8  # mini-batch of 256 prompts, in samples
    steps = data["max_samples"] // rollout["batch_size"] * train["num_episodes"]
    optimizer_steps = data["max_samples"] * rollout["n_samples_per_prompt"] // train["batch_size"]
    assert steps == optimizer_steps == 200
    assert train["max_epochs"] == 1
    assert actor["adam"]["lr"] == 1e-6
    assert actor["lr_warmup_ratio"] == 0.1
    assert algo["kl"]["init_coef"] == 0.001 and algo["kl"]["use_loss"] and algo["kl"]["estimator"] == "k3"
    assert actor["eps_clip"] == 0.2 and actor["eps_clip_low_high"] == [0.2, 0.2]
    assert rollout["temperature"] == 1.0 and rollout["top_p"] == 1.0
    assert rollout["max_new_tokens"] == 500  # tokens per turn
    assert data["max_len"] >= 4 * (500 + 500)
    assert data["input_key"] == "prompt" and data["label_key"] == "answers"
    agent_file = Path(train["agent_func_path"])
    assert agent_file.is_file() and agent_file.parts[-2:] == ("agent_env", "openrlhf_agent.py")
    assert cfg["reward"]["remote_url"] == ["agent"]  # OpenRLHF's marker for agent rewards


def assert_search_r1_agent(run: DryRun, retriever_url: str) -> None:
    agent = run.agent_config
    assert (agent.max_turns, agent.topk, agent.max_obs_tokens, agent.max_tokens_per_turn) == (4, 3, 500, 500)
    assert agent.retriever_url == retriever_url and agent.search_backend == "local"
    assert agent.template == "none" and agent.reward == "em"


@pytest.mark.slow
def test_sgrpo_base_paper_settings(dry_runs):
    run = dry_runs["sgrpo_base"]
    cfg = run.config
    assert_paper_settings(cfg)
    adv = cfg["algo"]["advantage"]
    assert (adv["estimator"], adv["sgrpo_alpha"], adv["stratify_by"]) == ("stratified_grpo", 0.6, "tool_calls")
    assert cfg["actor"]["model_name_or_path"] == "Qwen/Qwen2.5-3B"
    assert cfg["data"]["apply_chat_template"] is False
    assert cfg["data"]["prompt_dataset"] == str(run.data_dir / "train.jsonl")
    assert_search_r1_agent(run, "http://127.0.0.1:8000/retrieve")


@pytest.mark.slow
def test_exported_sapo_does_not_leak_and_wandb_and_resume_are_passed(dry_runs):
    """SAPO and UPDATES_PER_STEP are the scripts' own (an exported SAPO=1 once changed
    train_sgrpo_base.sh silently); WANDB_API_KEY turns on OpenRLHF's wandb logger with the
    placeholder key `env`, never the key itself on the command line; EXTRA_ARGS resumes."""
    run = dry_runs["exported_env"]
    cfg = run.config
    assert_paper_settings(cfg)
    assert cfg["algo"]["sapo"]["enable"] is False and cfg["train"]["batch_size"] == 256 * 8
    assert cfg["logger"]["wandb"]["key"] == "env" and "not-a-real-key" not in run.stdout + run.stderr
    assert cfg["ckpt"]["load_enable"] is True
    assert cfg["ckpt"]["path"] == str(run.save_path / "checkpoints")


@pytest.mark.slow
def test_sgrpo_instruct_paper_settings(dry_runs):
    cfg = dry_runs["sgrpo_instruct"].config
    assert_paper_settings(cfg)
    adv = cfg["algo"]["advantage"]
    assert (adv["estimator"], adv["sgrpo_alpha"]) == ("stratified_grpo", 0.8)
    assert cfg["actor"]["model_name_or_path"] == "Qwen/Qwen2.5-3B-Instruct"
    assert cfg["data"]["apply_chat_template"] is True
    assert_search_r1_agent(dry_runs["sgrpo_instruct"], "http://127.0.0.1:8000/retrieve")


@pytest.mark.slow
def test_grpo_baseline_differs_only_in_estimator(dry_runs):
    base, grpo = dry_runs["sgrpo_base"].config, dry_runs["grpo_base"].config
    assert_paper_settings(grpo)
    assert grpo["algo"]["advantage"]["estimator"] == "group_norm"

    def comparable(cfg: dict) -> dict:
        cfg = json.loads(json.dumps(cfg))
        del cfg["algo"]["advantage"]
        for key in ("tensorboard_dir", "wandb"):
            cfg["logger"].pop(key)
        cfg.pop("ckpt")
        cfg["data"].pop("prompt_dataset")
        return cfg

    assert comparable(base) == comparable(grpo)


@pytest.mark.slow
def test_multinode_scales_placement_and_uses_one_shared_retriever(dry_runs):
    run = dry_runs["multinode"]
    cfg = run.config
    assert cfg["actor"]["num_nodes"] == cfg["ref"]["num_nodes"] == 2
    assert cfg["vllm"]["num_engines"] == 16
    assert_search_r1_agent(run, SHARED_RETRIEVER)


def test_multinode_refuses_a_loopback_retriever(tmp_path):
    env = {**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable, "SAVE_PATH": str(tmp_path), "NUM_NODES": "2"}
    env.pop("RETRIEVER_URL", None)
    proc = subprocess.run(["bash", str(EXAMPLES / "qwen2.5-3b/train_sgrpo_base.sh")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "RETRIEVER_URL=http://127.0.0.1:8000/retrieve is a loopback address" in proc.stderr


@pytest.mark.slow
def test_bad_value_is_reported_by_the_cli(dry_runs):
    run = dry_runs["bad_alpha"]
    assert run.rc == 2
    assert "--algo.advantage.sgrpo_alpha must be in [0, 1], got 1.5" in run.stderr


@pytest.mark.slow
def test_deep_research_settings(dry_runs):
    run = dry_runs["deep_research"]
    cfg = run.config
    adv = cfg["algo"]["advantage"]
    assert adv["estimator"] == "stratified_grpo" and adv["stratify_by"] == "search_calls,code_calls"
    assert cfg["actor"]["model_name_or_path"] == "Qwen/Qwen3-8B"
    # the agent renders the deep-research prompt (with the chat template) from the raw question
    assert cfg["data"]["input_key"] == "question" and not cfg["data"]["apply_chat_template"]
    assert cfg["data"]["max_len"] == 16384 and cfg["vllm"]["tensor_parallel_size"] == 2
    agent = run.agent_config
    assert agent.max_turns == 10 and agent.search_backend == "web" and agent.template == "deep_research"
    assert agent.max_tokens_per_turn == 4096
    assert agent.sandbox_url == "http://sandbox:8080/run_code" and agent.allowed_actions == ("search", "code", "answer")


def test_render_agent_config_rejects_unknown_keys(tmp_path):
    proc = subprocess.run([sys.executable, str(EXAMPLES / "lib/render_agent_config.py"),
                           "--base", str(EXAMPLES / "configs/search_r1_base.yaml"), "--out", str(tmp_path / "a.yaml"),
                           "max_turn=4"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "unknown agent config keys ['max_turn']" in proc.stderr
    assert not (tmp_path / "a.yaml").exists()


@pytest.mark.parametrize("path", sorted((EXAMPLES / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_example_agent_configs_load(path):
    cfg = load_config(path)
    assert cfg.max_turns >= 1


@pytest.mark.parametrize("path", sorted(EXAMPLES.rglob("*.sh")), ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_shell_syntax(path):
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def write_prompts(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run_eval_script(script: str, tmp_path: Path, **env_extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable, "MODEL": str(tmp_path / "ckpt"), **env_extra}
    return subprocess.run(["bash", str(EXAMPLES / script)], env=env, capture_output=True, text=True, timeout=120)


def test_eval_qa_dry_run(tmp_path):
    """The script is a thin call of `python -m openrlhf_sgrpo.eval`: one prepare_qa.py test file,
    reported per datasource, with the paper's agent settings."""
    rows = [{"prompt": "p", "question": "q", "answers": ["a"], "datasource": ds} for ds in ("nq", "bamboogle")]
    write_prompts(tmp_path / "data" / "test.jsonl", rows)
    proc = run_eval_script("eval/eval_qa.sh", tmp_path, DATA_DIR=str(tmp_path / "data"), CHAT="1")
    assert proc.returncode == 0, proc.stderr
    cfg = json.loads(proc.stdout)
    assert cfg["datasets"] == {"nq": 1, "bamboogle": 1} and cfg["engine"] == "vllm"
    assert (cfg["max_len"], cfg["max_tokens_per_turn"], cfg["tensor_parallel_size"]) == (4512, 500, 1)
    agent = cfg["agent"]
    assert (agent["max_turns"], agent["topk"], agent["max_obs_tokens"], agent["template"]) == (4, 3, 500, "search_r1_chat")
    assert agent["reward"] == "em" and agent["retriever_url"] == "http://127.0.0.1:8000/retrieve"


def test_eval_gaia_dry_run(tmp_path):
    metadata = Path(__file__).parent / "fixtures" / "gaia" / "metadata.jsonl"
    proc = run_eval_script("qwen3-8b/eval_gaia.sh", tmp_path, GAIA_METADATA=str(metadata))
    assert proc.returncode == 0, proc.stderr
    cfg = json.loads(proc.stdout)
    assert cfg["gaia_questions"] == 5 and cfg["tensor_parallel_size"] == 2
    agent = cfg["gaia_agent"]
    assert agent["reward"] == "gaia" and agent["max_turns"] == 10 and agent["search_backend"] == "web"
    assert agent["template"] == "deep_research" and agent["sandbox_url"] == "http://127.0.0.1:8080/run_code"


def test_eval_reports_missing_data(tmp_path):
    proc = run_eval_script("eval/eval_qa.sh", tmp_path, DATA_DIR=str(tmp_path / "nowhere"))
    assert proc.returncode == 2
    assert f"dataset file not found: {tmp_path / 'nowhere' / 'test.jsonl'}" in proc.stderr


@pytest.mark.slow
def test_sapo_example_takes_two_optimizer_steps_per_rollout(tmp_path):
    """SAPO acts only when the updated policy differs from the sampling one: 2 mini-batches per rollout."""
    env = {**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable, "SAVE_PATH": str(tmp_path / "run")}
    proc = subprocess.run(["bash", str(EXAMPLES / "qwen2.5-3b" / "train_sapo_sgrpo_base.sh")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    cfg = json.loads(proc.stdout)
    samples = cfg["rollout"]["batch_size"] * cfg["rollout"]["n_samples_per_prompt"]
    assert cfg["algo"]["sapo"]["enable"] and samples // cfg["train"]["batch_size"] == 2
    assert cfg["train"]["max_epochs"] == 1 and cfg["algo"]["advantage"]["estimator"] == "stratified_grpo"
    assert "has no effect" not in proc.stderr
