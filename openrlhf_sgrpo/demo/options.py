"""The demo's flags: ``python -m openrlhf_sgrpo.demo``'s parser, its smoke-sized defaults, and the
trainer settings they make (:func:`train_config`). Apart from the run so that the study script, the
benches and the tests parse the same flags, and so that ``--help`` and a bad value are answered
before torch is imported (the imports below are inside the functions that need them)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

TEMPLATE = "search_r1_chat"  # the agent's prompt for a chat model (the tiny Qwen2 of --smoke gets "none")


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
                   help="start no code sandbox even where the prompts' template offers <code> (the demo's "
                        "templates offer search only, and then none is started anyway: demo/stack.py); a <code> "
                        "action then gets an error observation and no request is sent")
    p.add_argument("--engine", choices=("auto", "vllm", "hf"), default="auto",
                   help="generation engine: vLLM (its CPU build here), the HF fallback, or auto (default): "
                        "vLLM where it runs, else HF with the reason")
    p.add_argument("--gpu-memory-share", type=float, default=None,
                   help="the share of the GPU's memory this run's vLLM engine may claim (vLLM's "
                        "gpu_memory_utilization; default vLLM's 0.85). Several runs on one GPU (the study's "
                        "parallel seeds) each need a share: vLLM refuses to start unless that much is free")
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
    p.add_argument("--task", choices=("search", "trap"), default="search",
                   help="the generated task's regime: search (default: a two-hop question needs two searches) or "
                        "trap (one search answers half of the two-hop questions through a shortcut, two searches "
                        "all of them, and the warm-up's second query is often the wrong town: demo/trap_task.py)")
    p.add_argument("--strata-check", type=int, default=None,
                   help="after the warm-up, sample this many trajectories per held-out two-hop question and report "
                        "each search count's share and EM (demo/strata_check.py; default 8 with --task trap, else 0)")
    p.add_argument("--train-pairs", type=int, default=None,
                   help="person-town pairs of the generated world's training side (default 200; smoke 8)")
    p.add_argument("--task-seed", type=int, default=0, help="seed of the generated world (names, split)")
    p.add_argument("--heldout", type=int, default=None, help="held-out questions, half two-hop (default 48; smoke 4)")
    p.add_argument("--steps", type=int, default=None, help="training steps (default 8; smoke 2)")
    p.add_argument("--warmup-steps", type=int, default=None,
                   help="supervised steps before RL (default 12; smoke 6; 0: none; see demo/warm.py)")
    p.add_argument("--eval-before", action=argparse.BooleanOptionalAction, default=True,
                   help="evaluate held-out (and closed-book) before the warm-up; the study skips it: before the "
                        "warm-up SmolLM2 never writes the action tags, so it scores 0 and costs a long evaluation")
    p.add_argument("--warmup-lr", type=float, default=1e-4)
    p.add_argument("--warmup-batch", type=int, default=4)
    p.add_argument("--warmup-micro-batch", type=int, default=1,
                   help="warm-up rows per forward/backward (same gradient; 1: ~0.5 GB less peak than all 4 "
                        "at once)")
    p.add_argument("--demos", type=int, default=64, help="expert demonstrations run for the warm-up")
    p.add_argument("--fresh-rl-questions", action="store_true",
                   help="RL draws only training questions the warm-up did not demonstrate (the study's: the "
                        "warm-up fits the first --demos questions' whole trajectories, answers included, so RL "
                        "on those rewards recall; the demo's default draws from all of them)")
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
    p.add_argument("--shared-prefix", action="store_true",
                   help="run each prompt once per micro-batch of its own samples (the same log-probs and gradient "
                        "to float rounding, ~40%% fewer tokens through the update on the generated task; needs "
                        "--no-gradient-checkpointing and a --micro-batch-size dividing --n-samples: "
                        "local/shared_prefix.py)")
    p.add_argument("--skip-zero-advantage", action="store_true",
                   help="no forward/backward for samples whose advantage is 0 on every token (a group whose rewards "
                        "are all equal): exactly the same update with one optimizer step per rollout, no KL and no "
                        "SAPO (else nothing is skipped); the step logs how many it skipped")
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
    if args.strata_check is None:
        args.strata_check = 8 if args.task == "trap" else 0
    if args.strata_check < 0:
        p.error(f"--strata-check must be >= 0, got {args.strata_check}")
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
    if args.gpu_memory_share is not None and not 0.0 < args.gpu_memory_share <= 1.0:
        p.error(f"--gpu-memory-share must be a fraction in (0, 1], got {args.gpu_memory_share!r}")
    if args.warmup_steps < 0:
        p.error(f"--warmup-steps must be >= 0, got {args.warmup_steps}")
    if args.n_samples < 2:
        p.error(f"--n-samples must be >= 2 (a group baseline needs 2), got {args.n_samples}")
    if args.data and args.task != "search":
        p.error(f"--task {args.task} is a regime of the generated task; --data trains on its own questions")
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


def train_config(args: argparse.Namespace, estimator: str | None = None, alpha: float | None = None,
                 stratify_by: str | None = None):
    """The trainer's settings from the demo's flags (raises ValueError naming a bad one); an arm of
    ``--compare`` passes its own estimator and alpha, and the random-strata arm its own
    ``stratify_by`` (None: the run's ``--stratify-by``)."""
    from openrlhf_sgrpo.calibadv import CalibAdvConfig
    from openrlhf_sgrpo.local.experience_maker import AdvantageConfig
    from openrlhf_sgrpo.local.loss import LossConfig
    from openrlhf_sgrpo.local.trainer import TrainConfig
    from openrlhf_sgrpo.sapo import SAPOConfig

    return TrainConfig(
        steps=args.steps, prompts_per_step=args.prompts_per_step, n_samples=args.n_samples,
        micro_batch_size=args.micro_batch_size, train_batch_size=args.train_batch_size, max_epochs=args.max_epochs,
        gradient_checkpointing=args.gradient_checkpointing, shared_prefix=args.shared_prefix,
        skip_zero_advantage=args.skip_zero_advantage, lr=args.lr, seed=args.seed,
        record_groups=args.record_groups,
        adv=AdvantageConfig(estimator=estimator or args.estimator, alpha=args.alpha if alpha is None else alpha,
                            stratify_by=stratify_by or args.stratify_by, calibadv=CalibAdvConfig() if args.calibadv else None),
        loss=LossConfig(kl_coef=args.kl_coef, sapo=SAPOConfig() if args.sapo else None))
