"""``python -m openrlhf_sgrpo.demo``: the project's main job on one machine, offline.

The task (``demo/synth_task.py``) is one no model can answer from memory: questions about
generated people and towns whose answers exist only in the retrieval corpus. Single-hop questions
need one search; two-hop questions need two, the second query being the first answer (the town a
person was born in). Stages (each shows progress):
  1. data     generate the world, its corpus (passages of ~25 tokens) and its questions; held-out
              questions are about people and towns no training question names
              (or ``--data`` FlashRAG jsonl + ``--corpus``);
  2. index    MiniLM over the corpus (cached in the asset cache);
  3. serve    retriever and sandbox on loopback; measure each hop's retrieval recall@3 for the
              query a policy can write; run the expert demonstrations (below); load the policy
              (SmolLM2-135M-Instruct);
  4. eval     held-out, greedy, before training, and closed-book (the policy made to answer at
              once: what memory alone scores);
  5. warm-up  supervised steps on whole expert trajectories of *training* questions, run through
              the real agent and retriever: think, search, read, search again where needed,
              answer (``demo/warm.py``); held-out is evaluated again;
  6. train    Stratified GRPO steps (Ctrl-C leaves a checkpoint; ``--resume`` continues);
  7. eval     held-out again; print the tables (EM, F1 and searches by hop count, the share of
              two-search trajectories on two-hop questions, answered), write ``report.png``,
              ``metrics.jsonl`` and the rollout inspector ``rollouts.html``.
``--compare`` trains GRPO and then Stratified GRPO from the same warm-up weights, seed, questions
and steps (stages 6-9, one folder per arm) and reports both side by side (``report.png``: both
arms' curves). Each stage header shows the previous stage's peak RSS; a table of wall time and
peak RSS and PSS per stage (the demo and its child processes, ``demo/memory.py``) closes the
output. ``--smoke`` is a plumbing check (tiny random Qwen2), not a learning run: in every
training group the first turns of three samples are scripted (the gold answer, a wrong answer, a
search; see ``local/scripted.py``), so reward spread, a tool call and a non-zero update hold by
construction.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import sys
import time
from pathlib import Path

log = logging.getLogger("openrlhf_sgrpo.demo")
TEMPLATE = "search_r1_chat"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m openrlhf_sgrpo.demo", description="Stratified GRPO demo")
    p.add_argument("--out", default=None, help="run folder (default runs/<timestamp>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--smoke", action="store_true", help="tiny Qwen2, 2 steps, 4 held-out questions (tests)")
    p.add_argument("--compare", action="store_true",
                   help="train GRPO and Stratified GRPO (--alpha) from the same warm-up, seed, data and steps")
    p.add_argument("--arms", default=None,
                   help="arms to train from the same warm-up, e.g. grpo,sgrpo:0.6,sgrpo:1.0 (the study script's)")
    p.add_argument("--model", default=None, help="smollm2 (default) | tiny-qwen2 | local HF folder")
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-sandbox", action="store_true",
                   help="start no code sandbox: the demo's prompts offer search only, and a machine without "
                        "bubblewrap (the lent GPU image) cannot start the local one; a <code> action then "
                        "gets an error observation and no request is sent")
    p.add_argument("--engine", choices=("auto", "vllm", "hf"), default="auto",
                   help="generation engine: vLLM (its CPU build here), the HF fallback, or auto (default): "
                        "vLLM where it runs, else HF with the reason")
    p.add_argument("--compact-heap", action="store_true",
                   help="serve allocations >= 1 MB with their own mmap: ~0.7 GB less peak RSS in the update, "
                        "~25%% slower (bench/update_allocator.py)")
    p.add_argument("--kv-cache-gb", type=float, default=None,
                   help="vLLM's KV-cache size, GiB (default 0.5 on a CPU: ~11k tokens of SmolLM2 in fp32, enough "
                        "for ~15 held-out trajectories at once; 1.0 runs all 48 at once, ~10%% faster, 0.5 GB more. "
                        "Default 4 on a GPU, where 0.5 held ~15 of a step's 64 trajectories at once)")
    p.add_argument("--data", default=None, help="FlashRAG jsonl instead of the generated task (needs --corpus or --index)")
    p.add_argument("--corpus", default=None, help="corpus jsonl for --data (indexed with MiniLM, cached)")
    p.add_argument("--index", default=None, help="an existing retriever index folder")
    p.add_argument("--train-pairs", type=int, default=None,
                   help="person-town pairs of the generated world's training side (default 200; smoke 8)")
    p.add_argument("--task-seed", type=int, default=0, help="seed of the generated world (names, split)")
    p.add_argument("--heldout", type=int, default=None, help="held-out questions, half two-hop (default 48; smoke 4)")
    p.add_argument("--steps", type=int, default=None, help="training steps (default 8; smoke 2)")
    p.add_argument("--warmup-steps", type=int, default=None,
                   help="supervised steps before RL (default 12; smoke 6; 0: none; see demo/warm.py)")
    p.add_argument("--warmup-lr", type=float, default=1e-4)
    p.add_argument("--warmup-batch", type=int, default=4)
    p.add_argument("--warmup-micro-batch", type=int, default=1,
                   help="warm-up rows per forward/backward (same gradient; 1: ~0.5 GB less peak than all 4 "
                        "at once)")
    p.add_argument("--demos", type=int, default=64, help="expert demonstrations run for the warm-up")
    p.add_argument("--prompts-per-step", type=int, default=2)
    p.add_argument("--n-samples", type=int, default=4)
    p.add_argument("--micro-batch-size", type=int, default=2)
    p.add_argument("--train-batch-size", type=int, default=None,
                   help="samples per optimizer step (OpenRLHF --train.batch_size); default: the whole rollout, "
                        "half of it with --sapo (two steps per rollout, so the ratio to the old policy can "
                        "leave 1)")
    p.add_argument("--max-epochs", type=int, default=1, help="passes over each rollout (--train.max_epochs)")
    p.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=True,
                   help="recompute layer activations in backward: a fraction of the update's memory for "
                        "about one more forward pass (--actor.gradient_checkpointing)")
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--estimator", default="stratified_grpo",
                   choices=("grpo", "stratified_grpo", "stratified_reinforce", "stratified_rloo"))
    p.add_argument("--alpha", type=float, default=0.8, help="SAN/GN blend (paper: 0.8 for instruct models)")
    p.add_argument("--stratify-by", default="tool_calls")
    p.add_argument("--kl-coef", type=float, default=0.0, help="KL to a frozen reference (0: none)")
    p.add_argument("--sapo", action="store_true", help="add the SAPO term (openrlhf_sgrpo.sapo)")
    p.add_argument("--calibadv", action="store_true", help="calibrate token advantages (openrlhf_sgrpo.calibadv)")
    p.add_argument("--max-turns", type=int, default=2, help="tool turns before the final answer turn")
    p.add_argument("--max-len", type=int, default=768)
    p.add_argument("--max-tokens-per-turn", type=int, default=48)
    p.add_argument("--max-obs-tokens", type=int, default=160)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--reward", default="f1", choices=["em", "f1", "sub_em"],
                   help="training reward (+ Search-R1's format reward); the paper uses em")
    p.add_argument("--concurrency", type=int, default=48, help="held-out questions in flight at once")
    p.add_argument("--seed", type=int, default=0,
                   help="the policy's and engine's seed, and with the step number each rollout's draws")
    p.add_argument("--record-groups", type=int, default=8,
                   help="prompt groups per step kept as rollout records for the inspector (0: none)")
    args = p.parse_args(argv)
    smoke = args.smoke
    args.model = args.model or ("tiny-qwen2" if smoke else "smollm2")
    args.heldout = (4 if smoke else 48) if args.heldout is None else args.heldout
    args.steps = (2 if smoke else 8) if args.steps is None else args.steps
    args.train_pairs = (8 if smoke else 200) if args.train_pairs is None else args.train_pairs
    args.warmup_steps = (6 if smoke else 12) if args.warmup_steps is None else args.warmup_steps
    if args.kv_cache_gb is None:
        args.kv_cache_gb = 0.5 if args.device == "cpu" else 4.0
    if smoke:
        args.warmup_lr = 1e-2
        args.demos = min(args.demos, 16)
        args.max_tokens_per_turn = min(args.max_tokens_per_turn, 32)
        args.max_len = min(args.max_len, 384)
    for name in ("heldout", "steps", "prompts_per_step", "micro_batch_size", "max_turns", "max_len",
                 "max_tokens_per_turn", "concurrency", "max_epochs", "train_pairs", "demos", "warmup_batch",
                 "warmup_micro_batch"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.heldout < 2 and not args.data:
        p.error(f"--heldout must be >= 2 (one one-hop and one two-hop question), got {args.heldout}")
    if args.warmup_steps < 0:
        p.error(f"--warmup-steps must be >= 0, got {args.warmup_steps}")
    if args.n_samples < 2:
        p.error(f"--n-samples must be >= 2 (a group baseline needs 2), got {args.n_samples}")
    if args.data and not (args.corpus or args.index):
        p.error("--data needs the corpus its answers live in: --corpus JSONL or --index DIR")
    if args.resume and not args.out:
        p.error("--resume needs --out (the run folder to continue)")
    if args.compare and args.estimator != "stratified_grpo":
        p.error(f"--compare trains grpo and stratified_grpo; --estimator {args.estimator} does not apply")
    if args.arms:
        from openrlhf_sgrpo.demo.arms import parse_arms

        if args.compare:
            p.error("--arms and --compare both choose the arms; pass one")
        try:
            parse_arms(args.arms)
        except ValueError as err:
            p.error(str(err))
        args.compare = True  # several arms: each starts from the saved warm-up weights
    if args.train_batch_size is None:
        args.train_batch_size = _default_train_batch(args)
    try:
        train_config(args)  # every training setting is checked before any stage runs
    except ValueError as err:
        p.error(str(err))
    args.out = Path(args.out or f"runs/{time.strftime('%Y%m%d-%H%M%S')}")
    return args


def _default_train_batch(args: argparse.Namespace) -> int:
    """The rollout, or with --sapo half of it in whole prompt groups when that fits the micro-batch
    (else --max-epochs is raised to 2): SAPO needs a second optimizer step to see a ratio != 1."""
    rollout = args.prompts_per_step * args.n_samples
    if not args.sapo:
        return rollout
    half = (args.prompts_per_step // 2) * args.n_samples
    if args.prompts_per_step % 2 == 0 and half % args.micro_batch_size == 0:
        return half
    args.max_epochs = max(args.max_epochs, 2)
    return rollout


def train_config(args: argparse.Namespace, estimator: str | None = None, alpha: float | None = None):
    """The trainer's settings from the demo's flags (raises ValueError naming a bad one); an arm of
    ``--compare`` passes its own estimator and alpha."""
    from openrlhf_sgrpo.calibadv import CalibAdvConfig
    from openrlhf_sgrpo.local.experience_maker import AdvantageConfig
    from openrlhf_sgrpo.local.loss import LossConfig
    from openrlhf_sgrpo.local.trainer import TrainConfig
    from openrlhf_sgrpo.sapo import SAPOConfig

    return TrainConfig(
        steps=args.steps, prompts_per_step=args.prompts_per_step, n_samples=args.n_samples,
        micro_batch_size=args.micro_batch_size, train_batch_size=args.train_batch_size, max_epochs=args.max_epochs,
        gradient_checkpointing=args.gradient_checkpointing, lr=args.lr, seed=args.seed,
        record_groups=args.record_groups,
        adv=AdvantageConfig(estimator=estimator or args.estimator, alpha=args.alpha if alpha is None else alpha,
                            stratify_by=args.stratify_by, calibadv=CalibAdvConfig() if args.calibadv else None),
        loss=LossConfig(kl_coef=args.kl_coef, sapo=SAPOConfig() if args.sapo else None))


class Stages:
    """Numbered stage headers with the previous stage's peak RSS."""

    def __init__(self, total: int, t0: float, peaks):
        self.total, self.t0, self.peaks, self.k = total, t0, peaks, 0

    def __call__(self, name: str) -> None:
        self.k += 1
        previous = self.peaks.begin(name)
        rss = f", previous stage peak RSS {previous:,.0f} MiB" if previous is not None else ""
        print(f"\n== [{self.k}/{self.total}] {name}  (t = {time.monotonic() - self.t0:5.1f} s{rss})", flush=True)


def _make_engine(args, model, tok):
    """The generation engine the rollouts sample from: vLLM (from a saved copy of the policy, then
    synced to ``model``'s weights) or the HF fallback, which samples from ``model`` itself."""
    from openrlhf_sgrpo.engine import build_engine
    from openrlhf_sgrpo.local.models import policy_folder

    max_batch = max(args.concurrency, args.prompts_per_step * args.n_samples)
    if args.engine == "hf":
        return build_engine("hf", model, tok, seed=args.seed, max_batch=max_batch)
    return build_engine("vllm", model, tok, model_path=policy_folder(args.model), seed=args.seed,
                        max_batch=max_batch, max_model_len=args.max_len,
                        kv_cache_memory_bytes=int(args.kv_cache_gb * (1 << 30)), enforce_eager=True)


@contextlib.contextmanager
def _services(args, index: Path, train_index: Path | None, template: str):
    """Retriever(s) and sandbox on loopback; yields the agent configs of evaluation and training.

    Training searches its own index where the task has one (the training pairs' passages), so no
    held-out passage reaches the policy while it learns; evaluation searches everything."""
    from agent_env.config import AgentConfig
    from openrlhf_sgrpo.local.services import local_services

    with contextlib.ExitStack() as stack:
        urls = stack.enter_context(local_services(index, sandbox=not args.no_sandbox))
        print(f"retriever {urls.retriever_url}\nsandbox   {urls.sandbox_url or 'not started (--no-sandbox)'}")
        cfg = AgentConfig(retriever_url=urls.retriever_url, sandbox_url=urls.sandbox_url, template=template,
                          max_turns=args.max_turns, topk=3, max_obs_tokens=args.max_obs_tokens, reward=args.reward,
                          format_reward=True)
        train_cfg = cfg
        if train_index is not None:
            train_url = stack.enter_context(local_services(train_index, sandbox=False)).retriever_url
            print(f"retriever for training (train pairs' passages only) {train_url}")
            train_cfg = dataclasses.replace(cfg, retriever_url=train_url)
        yield cfg, train_cfg


def _make_rollout(args, engine, tok, agent_cfg, script=None):
    from openrlhf_sgrpo.local.rollout import AgentRollout

    return AgentRollout(engine, tok, agent_cfg, args.max_len, args.max_tokens_per_turn,
                        temperature=args.temperature, first_turn_script=script)


def _evaluate(args, rollout, name: str, held, predictions: Path, run_dir: Path, phase: str, step: int) -> dict:
    """Greedy held-out evaluation (resumable) summarized by hop."""
    from openrlhf_sgrpo.demo.hops import eval_by_hop
    from openrlhf_sgrpo.eval.core import TrajectoryRecords, evaluate

    return eval_by_hop(evaluate(rollout, name, held, predictions, args.concurrency,
                                records=TrajectoryRecords(run_dir, phase, step)))


def _recorded(predictions: Path, name: str, held) -> dict | None:
    """A finished evaluation's summary from its predictions (None when incomplete)."""
    from openrlhf_sgrpo.demo.hops import eval_by_hop
    from openrlhf_sgrpo.eval.core import read_records

    ids = {q.qid for q in held}
    rows = [r for r in read_records(predictions) if r.get("dataset") == name and r["id"] in ids]
    return eval_by_hop(rows) if len(rows) == len(ids) else None


def _needs_warmup(args, arms) -> bool:
    """The warm-up runs once per run: not when a resumed run's weights (an arm's checkpoint, or the
    saved warm-up weights of --compare) already include it."""
    from openrlhf_sgrpo.local.checkpoint import latest_checkpoint

    if args.warmup_steps == 0:
        return False
    if args.compare:
        return not (args.out / WARM_WEIGHTS).exists()
    return latest_checkpoint(arms[0].dir / "checkpoints") is None


WARM_WEIGHTS = "warmup_policy.pt"


def _train_arm(args, arm, model, tok, rollouts, engine, data, stages, logger) -> tuple[dict, list[dict]]:
    """Train one arm (from the warm-up weights under --compare) and evaluate it on held-out;
    ``rollouts`` is (training's, evaluation's)."""
    from openrlhf_sgrpo.demo.hops import HopMetrics
    from openrlhf_sgrpo.demo.warm import load_warm_weights, weights_fingerprint
    from openrlhf_sgrpo.local.checkpoint import latest_checkpoint
    from openrlhf_sgrpo.local.step_log import StepLogger, read_step_log
    from openrlhf_sgrpo.local.trainer import LocalTrainer

    tcfg = train_config(args, arm.estimator, arm.alpha)
    stages(f"train {args.steps} steps of {arm.label}")
    print(f"{tcfg.optimizer_steps_per_rollout} optimizer step(s) per rollout of {tcfg.rollout_batch_size} "
          f"samples (train batch {tcfg.mini_batch_size}, {tcfg.max_epochs} epoch(s)); gradient "
          f"checkpointing {'on' if tcfg.gradient_checkpointing else 'off'}"
          + ("; --smoke scripts the first turn of samples 0-2 of every group" if args.smoke else ""))
    own = arm.dir != args.out
    if own:
        arm.dir.mkdir(parents=True, exist_ok=True)
        logger = StepLogger(arm.dir, run_name=f"{args.out.name}-{arm.dir.name}", config={"arm": arm.label})
        if latest_checkpoint(arm.dir / "checkpoints") is None and (args.out / WARM_WEIGHTS).exists():
            load_warm_weights(model, args.out / WARM_WEIGHTS)  # every arm starts from the same policy
    try:
        train_rollout, rollout = rollouts
        trainer = LocalTrainer(model, tok, HopMetrics(train_rollout, data.hop_of_question()), data.train, tcfg,
                               arm.dir, logger=logger)
        if args.resume and trainer.resume():
            print(f"resumed at step {trainer.step}")
        else:
            start = weights_fingerprint(model)
            logger.log(0, {"estimator": arm.estimator, "alpha": arm.alpha, "weights": start}, phase="arm_start")
            print(f"{arm.label} starts from policy weights {start}")
        engine.sync_weights(model)  # weights loaded from a file: the engine generates with them
        trainer.train()
        stages(f"evaluate held-out after {arm.label}")
        # Keyed by the step: a run resumed to more steps evaluates its new weights instead of
        # reusing the earlier end's predictions under the same name.
        after = _evaluate(args, rollout, f"after_step{args.steps}", data.heldout, arm.predictions, arm.dir,
                          "eval_after", args.steps)
        logger.log(args.steps, after, phase="eval_after")
    finally:
        if own:
            logger.close()
    return after, read_step_log(arm.dir / "metrics.jsonl", "train")


def run(args: argparse.Namespace) -> dict:
    t0 = time.monotonic()
    import torch

    from agent_env.templates import build_prompt
    from openrlhf_sgrpo.demo.arms import arms_for
    from openrlhf_sgrpo.demo.environment import environment
    from openrlhf_sgrpo.demo.memory import StagePeaks
    from openrlhf_sgrpo.demo.questions import load_demo_data
    from openrlhf_sgrpo.demo.report import heldout_table, plot_curves, steps_table
    from openrlhf_sgrpo.demo.task_checks import closed_book, leaked_answers, measure_recall
    from openrlhf_sgrpo.demo.warm import demonstrations, save_warm_weights, warm_up
    from openrlhf_sgrpo.engine import resolve_engine
    from openrlhf_sgrpo.inspect.report import write_report
    from openrlhf_sgrpo.local.heap import map_large_allocations
    from openrlhf_sgrpo.local.models import TINY_QWEN2, load_policy
    from openrlhf_sgrpo.local.scripted import spread_script
    from openrlhf_sgrpo.local.services import cached_index_for
    from openrlhf_sgrpo.local.step_log import StepLogger

    if args.compact_heap:
        map_large_allocations()  # local/heap.py: ~0.7 GB less RSS in the update, ~25 % slower on CPU
    args.engine, note = resolve_engine(args.engine)  # a named engine that cannot run fails here, first
    if note:
        print(note)
    out = args.out
    if out.exists() and any(out.iterdir()) and not args.resume:
        raise ValueError(f"--out {out} already holds a run; pass --resume to continue it or pick another folder")
    out.mkdir(parents=True, exist_ok=True)
    (out / "args.json").write_text(json.dumps({k: str(v) for k, v in vars(args).items()}, indent=1))
    env = environment()  # the demo's times and the engine's bf16 rounding depend on the processor
    (out / "environment.json").write_text(json.dumps(env, indent=1))
    print(f"machine: {env['processor']} ({env['cpu_isa']}), {env['cpu_count']} CPUs, {env['device']}")
    arms = arms_for(args)
    peaks = StagePeaks()
    stages = Stages(5 + 2 * len(arms), t0, peaks)
    template = "none" if args.model == TINY_QWEN2 else TEMPLATE

    stages("data")
    data = load_demo_data(args)
    stages("retriever index")
    index = Path(data.index) if data.index else cached_index_for(data.corpus)
    train_index = cached_index_for(data.train_corpus) if data.train_corpus else None
    stages(f"services, expert demonstrations, policy ({args.model}), {args.engine} engine")
    model, tok = load_policy(args.model, args.device, seed=args.seed, dtype=torch.float32)  # trained: fp32
    if args.gradient_checkpointing:  # before the warm-up, whose backward is as large as RL's
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    print(f"policy: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")
    prompt_fn = lambda q: build_prompt(template, q, tok)  # noqa: E731 - the agent's own rendering
    logger = StepLogger(out, run_name=out.name, config={k: str(v) for k, v in vars(args).items()})
    checks: dict = {}
    arm_results: dict[str, tuple[dict, list[dict]]] = {}
    with _services(args, index, train_index, template) as (agent_cfg, train_cfg):
        if data.task is not None:
            recall = measure_recall(agent_cfg.retriever_url, list(data.task.heldout), k=agent_cfg.topk)
            checks["recall"] = vars(recall)
            print(recall.describe())
            leaks = leaked_answers(data.task)
            if leaks:
                raise ValueError(f"held-out answers occur in training questions: {leaks[:5]}")
        warm_needed = _needs_warmup(args, arms)
        # before the rollout below: each AgentRollout instruments the process-wide tool clients
        demos = (demonstrations(args, data, tok, prompt_fn, lambda engine: _make_rollout(args, engine, tok, train_cfg))
                 if warm_needed else None)
        engine = _make_engine(args, model, tok)
        rollout = _make_rollout(args, engine, tok, agent_cfg)  # evaluation: greedy, never scripted
        train_rollout = _make_rollout(args, engine, tok, train_cfg, script=spread_script if args.smoke else None)
        try:
            stages(f"evaluate held-out ({len(data.heldout)} questions) before training")
            before = _evaluate(args, rollout, "before", data.heldout, out / "eval_predictions.jsonl", out,
                               "eval_before", 0)
            logger.log(0, before, phase="eval_before")
            if data.task is not None:
                checks["closed_book_before"] = closed_book(model, tok, list(data.task.heldout), prompt_fn)
                print(f"closed-book (answer at once, no search) held-out EM {checks['closed_book_before']['em']:.3f}")
            stages(f"warm-up: {args.warmup_steps} supervised steps on train questions")
            warm = None
            if warm_needed:
                warm_up(args, model, tok, data, demos, None if template == "none" else prompt_fn, logger)
                engine.sync_weights(model)
                if args.compare:
                    save_warm_weights(model, out / WARM_WEIGHTS)
                warm = _evaluate(args, rollout, "warmup", data.heldout, out / "eval_predictions.jsonl", out,
                                 "eval_warmup", 0)
                logger.log(0, warm, phase="eval_warmup")
                if data.task is not None:
                    checks["closed_book_warmup"] = closed_book(model, tok, list(data.task.heldout), prompt_fn)
                    print(f"closed-book after the warm-up: held-out EM {checks['closed_book_warmup']['em']:.3f}")
            else:
                print("skipped" if args.warmup_steps == 0 else "skipped: resuming from weights that include it")
                # a resumed run shows the recorded column (its weights now include RL steps)
                warm = _recorded(out / "eval_predictions.jsonl", "warmup", data.heldout) if args.warmup_steps else None
            for arm in arms:
                arm_results[arm.label] = _train_arm(args, arm, model, tok, (train_rollout, rollout), engine, data,
                                                    stages, logger)
        finally:
            train_rollout.close()
            rollout.close()
            engine.close()
            logger.close()
            peaks.close()
    (out / "task_checks.json").write_text(json.dumps(checks, indent=1))
    curves = {label: records for label, (_, records) in arm_results.items()}
    title = "GRPO vs Stratified GRPO (local demo)" if args.compare else f"{arms[0].label} (local demo)"
    plot_curves(curves, out / "report.png", title)
    reports = []
    for target in [out] + [arm.dir for arm in arms if arm.dir != out]:
        inspector, warnings = write_report(target)
        reports.append(inspector)
        for w in warnings:
            print(f"warning: {w}")
    columns = {"before": before, "after warm-up": warm}
    columns.update({("after RL" if not args.compare else label): after for label, (after, _) in arm_results.items()})
    print("\n" + heldout_table(columns))
    for label, (_, records) in arm_results.items():
        print(f"\n{label}:\n" + steps_table(records) if args.compare else "\n" + steps_table(records))
    print("\n" + peaks.table())
    print(f"\nwrote {out / 'report.png'}, {out / 'metrics.jsonl'}, {out / 'task_checks.json'} "
          f"(total {time.monotonic() - t0:.0f} s)")
    for path in reports:
        print(f"rollout inspector: {path} (python -m openrlhf_sgrpo.inspect {path.parent} rebuilds it)")
    return {"before": before, "after_warmup": warm, "arms": {k: v[0] for k, v in arm_results.items()},
            "steps": {k: v[1] for k, v in arm_results.items()}, "checks": checks, "stages": peaks.rows}


def main(argv: list[str] | None = None) -> int:
    import os

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # the demo's own tables and bars, not vLLM's start-up log
    from openrlhf_sgrpo.engine.vllm import VLLMUnavailable

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    try:
        run(args)
    except KeyboardInterrupt:
        print(f"\ninterrupted; continue with: python -m openrlhf_sgrpo.demo --out {args.out} --resume"
              + (f" --arms {args.arms}" if args.arms else " --compare" if args.compare else ""), file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, VLLMUnavailable) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
