"""GPU smoke run of the real cluster pipeline on one GPU, then a per-step table; non-zero exit on failure.

    python scripts/gpu_smoke.py [--out runs/gpu_smoke] [--steps 3]
    python scripts/gpu_smoke.py --dry-run      # CPU: prepares data, parses both runs with OpenRLHF's parser
    python scripts/gpu_smoke.py --engine hf --policy DIR --template none --no-sandbox   # a GPU without vLLM

What runs: ``python -m openrlhf_sgrpo.cli.train_ppo_ray`` (OpenRLHF 0.11.2's trainer with our actor
classes) on one GPU — one colocated vLLM engine, DeepSpeed, Ray, our agent (loaded by OpenRLHF
from ``agent_env/openrlhf_agent.py``), the real retriever (MiniLM over the Wikipedia extracts)
and the real sandbox on loopback, SmolLM2-135M-Instruct saved as an HF folder. Run A: ``--steps``
steps of ``stratified_grpo``. Run B: the same with SAPO and CalibAdv on and two optimizer steps
per rollout (mini-batch = half the rollout), so SAPO's ratio can leave 1. After each run the
TensorBoard log is read back (``openrlhf_sgrpo.cli.tb_summary``): reward, tool calls, strata per
prompt, the ``sgrpo/*`` monitors (and ``sapo/*``, ``calibadv/*`` for run B) and OpenRLHF's
``timing/*`` for every step, then the per-step time split (``openrlhf_sgrpo.cli.step_times``:
generation, the retriever wait measured where the smoke serves it, experience making, training,
weight sync). The policy's optimizer is torch's fused AdamW (``--sgrpo.optimizer torch_fused``):
no CUDA extension is compiled on the GPU machine. With vLLM, every weight sync (OpenRLHF's CUDA IPC
path) is checked by value (``--sgrpo.verify_weight_sync -1``): each run's output is kept in
``OUT/run_{A,B}.log`` and the summary prints the ``[sgrpo] weight sync N verified`` lines; a failed
check, or none at all, fails the smoke.
Needs a CUDA machine with ``requirements-gpu.txt`` installed; docs/deploy.md records runs.

``--engine hf`` runs the same two runs with ``--sgrpo.rollout_engine hf`` (the project's HF engine
in vLLM's place, weights synced over CUDA IPC) and SDPA attention, for a GPU machine where vLLM
and flash-attn are not installed; ``--policy`` trains another HF folder (e.g. a tiny model fitted
to the action format, with ``--template none``), ``--no-sandbox`` skips the code sandbox (the
search-only templates never call it).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from openrlhf_sgrpo.cli.step_times import ToolIntervals

REPO = Path(__file__).resolve().parent.parent
PROMPTS_PER_STEP = 4
SAMPLES_PER_PROMPT = 8
ALPHA = 0.8  # instruct model
# OpenRLHF's own per-phase seconds (PPOTrainer.fit); the smoke adds the tool wait (step_times)
TIMING = ["timing/generation", "timing/make_experience", "timing/ppo_train", "timing/broadcast"]
REQUIRED_A = ["reward", "tool_calls", "sgrpo/strata_per_prompt", "sgrpo/var_reduction", *TIMING]
REQUIRED_B = REQUIRED_A + ["sapo/term", "sapo/penalized_share", "calibadv/mean_turn_score"]


def prepare(out: Path, steps: int, policy: str | None = None) -> dict[str, Path]:
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
    return {"data": data, "corpus": corpus, "policy": policy_folder(policy or "smollm2")}


def flash_attn_installed() -> bool:
    """Whether the real flash-attn is installed: its distribution, so that the import-only stand-in
    our CLI puts in a process (``gpu_import_standins``) never counts as one."""
    try:
        importlib.metadata.distribution("flash-attn")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def cli_args(paths: dict[str, Path], out: Path, run: str, steps: int, agent_func_path: str,
             engine: str = "vllm", lr: float = 1e-6, sapo_ratio_threshold: float | None = None) -> list[str]:
    """The train_ppo_ray flags of run A (``stratified_grpo``) or B (+ SAPO, CalibAdv, 2 updates/rollout)."""
    batch = PROMPTS_PER_STEP * SAMPLES_PER_PROMPT
    args = [
        "--actor.model_name_or_path", str(paths["policy"]), "--actor.num_nodes", "1", "--actor.num_gpus_per_node", "1",
        "--vllm.num_engines", "1", "--vllm.tensor_parallel_size", "1", "--vllm.gpu_memory_utilization", "0.3",
        "--train.colocate_all", "--ds.zero_stage", "2",
        "--ds.param_dtype", "bf16",
        "--data.prompt_dataset", str(paths["data"]), "--data.input_key", "question", "--data.label_key", "answers",
        "--data.max_samples", str(steps * PROMPTS_PER_STEP), "--data.max_len", "2048",
        "--train.agent_func_path", agent_func_path,
        "--rollout.batch_size", str(PROMPTS_PER_STEP), "--rollout.n_samples_per_prompt", str(SAMPLES_PER_PROMPT),
        "--rollout.micro_batch_size", "8", "--train.micro_batch_size", "8",
        "--train.batch_size", str(batch if run == "A" else batch // 2),
        "--train.num_episodes", "1", "--train.max_epochs", "1",
        "--rollout.max_new_tokens", "128", "--rollout.temperature", "1.0",
        "--actor.adam.lr", str(lr), "--algo.kl.init_coef", "0",
        "--algo.advantage.estimator", "stratified_grpo", "--algo.advantage.sgrpo_alpha", str(ALPHA),
        "--logger.tensorboard_dir", str(out / f"tb_{run}"),
        "--ckpt.path", str(out / f"ckpt_{run}"), "--ckpt.output_dir", str(out / f"model_{run}"),
        "--ckpt.save_steps", "-1",
        # torch's fused AdamW through DeepSpeed's torch_adam: nothing for nvcc to build in the policy actor
        "--sgrpo.optimizer", "torch_fused",
    ]
    if run == "B":
        args += ["--algo.sapo.enable", "--algo.calibadv.enable"]
        if sapo_ratio_threshold is not None:
            args += ["--algo.sapo.ratio_threshold", str(sapo_ratio_threshold)]
    if engine == "hf":  # nothing to put to sleep: the HF engine holds no KV cache between batches
        args += ["--sgrpo.rollout_engine", "hf"]
    else:
        args += ["--vllm.enable_sleep", "--ds.enable_sleep"]
        # every sync into vLLM checked by value (openrlhf_ext/sync_verify.py): a tensor that did not
        # arrive fails the run, naming it
        args += ["--sgrpo.verify_weight_sync", "-1"]
    if engine == "hf" or not flash_attn_installed():  # no wheel for every CUDA torch
        args += ["--ds.attn_implementation", "sdpa"]
    return args


def agent_config(out: Path, retriever_url: str, sandbox_url: str | None, template: str = "search_r1_chat") -> Path:
    path = out / "agent_config.yaml"
    lines = [f"retriever_url: {retriever_url}", f"template: {template}", "max_turns: 3", "topk: 3",
             "max_obs_tokens: 256", "max_tokens_per_turn: 128", "reward: f1", "format_reward: true"]
    lines.append(f"sandbox_url: {sandbox_url or 'null'}")  # null: no code tool, nothing sent
    path.write_text("\n".join(lines) + "\n")
    return path


@contextlib.contextmanager
def smoke_services(index_dir: Path, sandbox: bool, tool_spans: ToolIntervals) -> Iterator[tuple[str, str | None]]:
    """The retriever (each request's span recorded for the step-time split) and, if asked, the
    sandbox, on loopback; as ``local_services`` starts them, both stopped on exit."""
    from retriever_server.background import RunningServer
    from retriever_server.config import ServerConfig

    with contextlib.ExitStack() as stack:
        srv = stack.enter_context(RunningServer(ServerConfig(index=str(index_dir), topk=3)))
        srv.app.wsgi_app = tool_spans.wrap(srv.app.wsgi_app)  # waitress calls the Flask app, which calls this
        sandbox_url = None
        if sandbox:
            from sandbox.process import SandboxProcess

            sandbox_url = f"{stack.enter_context(SandboxProcess(backend='local', max_concurrency=4)).url}/run_code"
        yield f"{srv.url}/retrieve", sandbox_url


def print_time_split(tb_dir: Path, spans: list[tuple[float, float]], out: Path, run: str) -> None:
    """The per-step split (generation, tool wait, experience, training, weight sync), spans kept."""
    from openrlhf_sgrpo.cli import step_times

    (out / f"tool_spans_{run}.jsonl").write_text("".join(json.dumps(list(s)) + "\n" for s in spans))
    phases = step_times.read_phases(tb_dir)
    rows = step_times.step_rows(phases, spans)
    first = phases.get(1, {})
    if "wall" in first and first.get("step_total") is not None:  # gpu_vllm_run.sh's timeline reads this
        print(f"[gpu_smoke] run {run} step 1 started at epoch {first['wall'] - first['step_total']:.1f}")
    print(f"[gpu_smoke] run {run} time split (s; tool_wait = time with a retriever call in flight):")
    print(step_times.split_table(rows), flush=True)


def run_cli(args: list[str], env: dict[str, str], dry_run: bool, log: Path | None = None) -> int:
    """The training run; with ``log``, its output (stdout and stderr, the Ray workers' forwarded
    lines included) is also written there, for :func:`sync_check_verdict` to read."""
    cmd = [sys.executable, "-m", "openrlhf_sgrpo.cli.train_ppo_ray", *args, *(["--dry_run"] if dry_run else [])]
    print("[gpu_smoke]", " ".join(cmd), flush=True)
    if dry_run or log is None:
        return subprocess.run(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL if dry_run else None).returncode
    with open(log, "w") as sink, subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE,
                                                  stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
        for line in proc.stdout:
            sys.stdout.write(line)
            sink.write(line)
        return proc.wait()


def sync_check_verdict(log_text: str, run: str) -> int:
    """The weight-sync checks a run logged (``--sgrpo.verify_weight_sync -1``), printed; 1 if one
    failed or none ran (the check never reached the policy actor), else 0."""
    from openrlhf_sgrpo.openrlhf_ext.sync_verify import LOG_PREFIX

    # from the prefix on (Ray puts "(PolicyModelActor pid=...)" before a worker's lines), each once
    # (a failure is in the worker's and the driver's traceback), in the order logged
    lines = list(dict.fromkeys(line[line.index(LOG_PREFIX):].strip() for line in log_text.splitlines()
                               if LOG_PREFIX in line))
    verified = [line for line in lines if " verified: " in line]
    failed = [line for line in lines if " FAILED verification" in line]
    print(f"[gpu_smoke] run {run} weight syncs checked by value: {len(verified)} verified, {len(failed)} failed")
    for line in failed + verified:
        print(f"[gpu_smoke]   {line}")
    if failed or not verified:
        why = "a sync failed its check" if failed else "no sync was checked"
        print(f"[gpu_smoke] run {run}: {why} (--sgrpo.verify_weight_sync -1)", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/gpu_smoke")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--dry-run", action="store_true", help="prepare and parse only (CPU)")
    p.add_argument("--engine", default="vllm", choices=("vllm", "hf"),
                   help="rollout engine: vLLM, or the project's HF engine where vLLM is not installed")
    p.add_argument("--policy", default=None, help="HF folder to train (default: SmolLM2-135M-Instruct)")
    p.add_argument("--template", default="search_r1_chat", help="the agent's prompt template")
    p.add_argument("--no-sandbox", action="store_true", help="start no code sandbox (search-only templates)")
    p.add_argument("--lr", type=float, default=1e-6, help="actor learning rate")
    p.add_argument("--sapo-ratio-threshold", type=float, default=None,
                   help="run B's SAPO ratio threshold (default: SAPO's); near 1 makes the penalty fire in a short run")
    p.add_argument("--runs", default="AB", choices=("AB", "A", "B"),
                   help="which runs: both (default), or one where the device time must also hold the study")
    p.add_argument("extra", nargs=argparse.REMAINDER,
                   help="after --: more train_ppo_ray flags for both runs (e.g. -- --vllm.enforce_eager)")
    a = p.parse_args(argv)
    extra = a.extra[1:] if a.extra[:1] == ["--"] else a.extra
    if a.steps < 1:
        p.error(f"--steps must be >= 1, got {a.steps}")
    out = Path(a.out).resolve()

    from agent_env.config import CONFIG_ENV
    from openrlhf_sgrpo.cli import tb_summary
    from openrlhf_sgrpo.cli.step_times import ToolIntervals
    from openrlhf_sgrpo.local.services import cached_index_for

    paths = prepare(out, a.steps, a.policy)
    agent_file = str(REPO / "agent_env" / "openrlhf_agent.py")
    spans = ToolIntervals()
    with smoke_services(cached_index_for(paths["corpus"]), not (a.dry_run or a.no_sandbox), spans) as urls:
        config = agent_config(out, *urls, a.template)
        env = {**os.environ, CONFIG_ENV: str(config)}
        for run, required in [(r, q) for r, q in (("A", REQUIRED_A), ("B", REQUIRED_B)) if r in a.runs]:
            spans.take()  # the retriever's warm-up and the previous run are not this run's
            flags = cli_args(paths, out, run, a.steps, agent_file, a.engine, a.lr, a.sapo_ratio_threshold) + extra
            log = out / f"run_{run}.log"
            code = run_cli(flags, env, a.dry_run, log)
            checked = a.engine == "vllm" and not a.dry_run
            sync_code = sync_check_verdict(log.read_text(errors="replace"), run) if checked else 0
            if code != 0:
                print(f"[gpu_smoke] run {run} failed with exit code {code}", file=sys.stderr)
                return code
            if a.dry_run:
                continue
            if sync_code != 0:
                return sync_code
            print(f"[gpu_smoke] run {run} ({'stratified_grpo' if run == 'A' else '+ SAPO + CalibAdv'}):")
            check = ["--steps", str(a.steps)] + [x for key in required for x in ("--require", key)]
            code = tb_summary.main([str(out / f"tb_{run}"), *check])
            print_time_split(out / f"tb_{run}", spans.take(), out, run)
            if code != 0:
                return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
