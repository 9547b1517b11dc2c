"""GPU smoke run of the real cluster pipeline on one GPU, then a per-step table; non-zero exit on failure.

    python scripts/gpu_smoke.py [--out runs/gpu_smoke] [--steps 3]
    python scripts/gpu_smoke.py --dry-run      # CPU: prepares data, parses both runs with OpenRLHF's parser

What runs: ``python -m openrlhf_sgrpo.cli.train_ppo_ray`` (OpenRLHF 0.11.2's trainer with our actor
classes) on one GPU — one colocated vLLM engine, DeepSpeed, Ray, our agent (loaded by OpenRLHF
from ``agent_env/openrlhf_agent.py``), the real retriever (MiniLM over the Wikipedia extracts)
and the real sandbox on loopback, SmolLM2-135M-Instruct saved as an HF folder. Run A: ``--steps``
steps of ``stratified_grpo``. Run B: the same with SAPO and CalibAdv on and two optimizer steps
per rollout (mini-batch = half the rollout), so SAPO's ratio can leave 1. After each run the
TensorBoard log is read back (``openrlhf_sgrpo.cli.tb_summary``): reward, tool calls, strata per
prompt, the ``sgrpo/*`` monitors (and ``sapo/*``, ``calibadv/*`` for run B) for every step.
Needs a CUDA machine with ``requirements-gpu.txt`` installed; docs/deploy.md records runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROMPTS_PER_STEP = 4
SAMPLES_PER_PROMPT = 8
ALPHA = 0.8  # instruct model
REQUIRED_A = ["reward", "tool_calls", "sgrpo/strata_per_prompt", "sgrpo/var_reduction"]
REQUIRED_B = REQUIRED_A + ["sapo/term", "sapo/penalized_share", "calibadv/mean_turn_score"]


def prepare(out: Path, steps: int) -> dict[str, Path]:
    """Prompts (FanOutQA sub-questions answerable from the extracts), corpus, policy folder."""
    from openrlhf_sgrpo import assets
    from openrlhf_sgrpo.demo.corpus import write_corpus
    from openrlhf_sgrpo.demo.fanout import answerable_subquestions, load_extracts
    from openrlhf_sgrpo.local.models import policy_folder

    out.mkdir(parents=True, exist_ok=True)
    extracts = load_extracts(assets.wiki_extracts_json())
    questions = answerable_subquestions(assets.fanoutqa_dev_json(), extracts)[: steps * PROMPTS_PER_STEP]
    data = out / "train.jsonl"
    data.write_text("".join(json.dumps({"question": q.question, "answers": list(q.golds)}) + "\n"
                            for q in questions))
    corpus = write_corpus(extracts, {q.evidence_title for q in questions}, n_distractors=500)
    return {"data": data, "corpus": corpus, "policy": policy_folder("smollm2")}


def cli_args(paths: dict[str, Path], out: Path, run: str, steps: int, agent_func_path: str) -> list[str]:
    """The train_ppo_ray flags of run A (``stratified_grpo``) or B (+ SAPO, CalibAdv, 2 updates/rollout)."""
    batch = PROMPTS_PER_STEP * SAMPLES_PER_PROMPT
    args = [
        "--actor.model_name_or_path", str(paths["policy"]), "--actor.num_nodes", "1", "--actor.num_gpus_per_node", "1",
        "--vllm.num_engines", "1", "--vllm.tensor_parallel_size", "1", "--vllm.gpu_memory_utilization", "0.3",
        "--train.colocate_all", "--vllm.enable_sleep", "--ds.enable_sleep", "--ds.zero_stage", "2",
        "--ds.param_dtype", "bf16",
        "--data.prompt_dataset", str(paths["data"]), "--data.input_key", "question", "--data.label_key", "answers",
        "--data.max_samples", str(steps * PROMPTS_PER_STEP), "--data.max_len", "2048",
        "--train.agent_func_path", agent_func_path,
        "--rollout.batch_size", str(PROMPTS_PER_STEP), "--rollout.n_samples_per_prompt", str(SAMPLES_PER_PROMPT),
        "--rollout.micro_batch_size", "8", "--train.micro_batch_size", "8",
        "--train.batch_size", str(batch if run == "A" else batch // 2),
        "--train.num_episodes", "1", "--train.max_epochs", "1",
        "--rollout.max_new_tokens", "128", "--rollout.temperature", "1.0",
        "--actor.adam.lr", "1e-6", "--algo.kl.init_coef", "0",
        "--algo.advantage.estimator", "stratified_grpo", "--algo.advantage.sgrpo_alpha", str(ALPHA),
        "--logger.tensorboard_dir", str(out / f"tb_{run}"),
        "--ckpt.path", str(out / f"ckpt_{run}"), "--ckpt.output_dir", str(out / f"model_{run}"),
        "--ckpt.save_steps", "-1",
    ]
    if run == "B":
        args += ["--algo.sapo.enable", "--algo.calibadv.enable"]
    return args


def agent_config(out: Path, retriever_url: str, sandbox_url: str | None) -> Path:
    path = out / "agent_config.yaml"
    lines = [f"retriever_url: {retriever_url}", "template: search_r1_chat", "max_turns: 3", "topk: 3",
             "max_obs_tokens: 256", "max_tokens_per_turn: 128", "reward: f1", "format_reward: true"]
    if sandbox_url:
        lines.append(f"sandbox_url: {sandbox_url}")
    path.write_text("\n".join(lines) + "\n")
    return path


def run_cli(args: list[str], env: dict[str, str], dry_run: bool) -> int:
    cmd = [sys.executable, "-m", "openrlhf_sgrpo.cli.train_ppo_ray", *args, *(["--dry_run"] if dry_run else [])]
    print("[gpu_smoke]", " ".join(cmd), flush=True)
    return subprocess.run(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL if dry_run else None).returncode


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/gpu_smoke")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--dry-run", action="store_true", help="prepare and parse only (CPU)")
    a = p.parse_args(argv)
    if a.steps < 1:
        p.error(f"--steps must be >= 1, got {a.steps}")
    out = Path(a.out).resolve()

    from agent_env.config import CONFIG_ENV
    from openrlhf_sgrpo.cli import tb_summary
    from openrlhf_sgrpo.local.services import cached_index_for, local_services

    paths = prepare(out, a.steps)
    agent_file = str(REPO / "agent_env" / "openrlhf_agent.py")
    with local_services(cached_index_for(paths["corpus"]), sandbox=not a.dry_run) as urls:
        env = {**os.environ, CONFIG_ENV: str(agent_config(out, urls.retriever_url, urls.sandbox_url))}
        for run, required in (("A", REQUIRED_A), ("B", REQUIRED_B)):
            code = run_cli(cli_args(paths, out, run, a.steps, agent_file), env, a.dry_run)
            if code != 0:
                print(f"[gpu_smoke] run {run} failed with exit code {code}", file=sys.stderr)
                return code
            if a.dry_run:
                continue
            print(f"[gpu_smoke] run {run} ({'stratified_grpo' if run == 'A' else '+ SAPO + CalibAdv'}):")
            check = ["--steps", str(a.steps)] + [x for key in required for x in ("--require", key)]
            code = tb_summary.main([str(out / f"tb_{run}"), *check])
            if code != 0:
                return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
