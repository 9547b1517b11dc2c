"""``python -m openrlhf_sgrpo.demo``: the project's main job on one machine, offline.

Stages (each shows progress):
  1. data     FanOutQA dev sub-questions whose evidence page is in the wiki extracts
              (or ``--data`` FlashRAG jsonl + ``--corpus``), split train / held-out;
  2. index    MiniLM over the evidence pages + distractors (cached in the asset cache);
  3. serve    retriever and sandbox on loopback; load the policy (SmolLM2-135M-Instruct);
  4. eval     held-out, greedy, before training;
  5. warm-up  a few supervised steps on the action format (train questions): SmolLM2-135M
              answers in prose and never writes the tags on its own (see local/warmup.py);
              held-out is evaluated again, so the table tells the warm-up's gain from RL's;
  6. train    Stratified GRPO steps (Ctrl-C leaves a checkpoint; ``--resume`` continues);
  7. eval     held-out again; print the tables, write ``report.png``, ``metrics.jsonl`` and the
              rollout inspector ``rollouts.html`` (every step's and evaluation's trajectories).
Each stage header shows the previous stage's peak RSS; a table of wall time and peak RSS per
stage closes the output. Defaults fit ~15 minutes on 2 CPU cores; flags make it bigger on a GPU.
``--smoke`` is a plumbing check (tiny random Qwen2), not a learning run: in every training group
the first turns of three samples are scripted (the gold answer, a wrong answer, a search; see
``local/scripted.py``), so reward spread, a tool call and a non-zero update hold by construction.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

log = logging.getLogger("openrlhf_sgrpo.demo")
STAGES = 7
TEMPLATE = "search_r1_chat"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m openrlhf_sgrpo.demo", description="Stratified GRPO demo")
    p.add_argument("--out", default=None, help="run folder (default runs/<timestamp>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--smoke", action="store_true", help="tiny Qwen2, 2 steps, 4 held-out questions (tests)")
    p.add_argument("--model", default=None, help="smollm2 (default) | tiny-qwen2 | local HF folder")
    p.add_argument("--device", default="cpu")
    p.add_argument("--data", default=None, help="FlashRAG jsonl instead of FanOutQA (needs --corpus or --index)")
    p.add_argument("--corpus", default=None, help="corpus jsonl for --data (indexed with MiniLM, cached)")
    p.add_argument("--index", default=None, help="an existing retriever index folder")
    p.add_argument("--distractors", type=int, default=1200, help="non-evidence extracts in the FanOutQA corpus")
    p.add_argument("--heldout", type=int, default=None, help="held-out questions (default 24; smoke 4)")
    p.add_argument("--max-questions", type=int, default=None,
                   help="use only the first N FanOutQA sub-questions (answer-in-extract first; smoke 24)")
    p.add_argument("--steps", type=int, default=None, help="training steps (default 4; smoke 2)")
    p.add_argument("--warmup-steps", type=int, default=10,
                   help="supervised steps on the action format before RL (0: none; see local/warmup.py)")
    p.add_argument("--warmup-lr", type=float, default=2e-4)
    p.add_argument("--warmup-batch", type=int, default=4)
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
    p.add_argument("--max-turns", type=int, default=2)
    p.add_argument("--max-len", type=int, default=768)
    p.add_argument("--max-tokens-per-turn", type=int, default=48)
    p.add_argument("--max-obs-tokens", type=int, default=160)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--reward", default="f1", choices=["em", "f1", "sub_em"],
                   help="training reward (+ Search-R1's format reward). F1's partial credit gives a "
                        "135M model's groups reward variance that EM rarely does; the paper uses em")
    p.add_argument("--concurrency", type=int, default=24, help="held-out questions in flight at once")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--record-groups", type=int, default=8,
                   help="prompt groups per step kept as rollout records for the inspector (0: none)")
    args = p.parse_args(argv)
    smoke = args.smoke
    args.model = args.model or ("tiny-qwen2" if smoke else "smollm2")
    args.heldout = (4 if smoke else 24) if args.heldout is None else args.heldout
    args.steps = (2 if smoke else 4) if args.steps is None else args.steps
    if smoke:
        args.max_questions = args.max_questions or 24
        args.warmup_steps, args.warmup_lr = min(args.warmup_steps, 40), 1e-2
        args.distractors = min(args.distractors, 20)
        args.max_tokens_per_turn = min(args.max_tokens_per_turn, 16)
        args.max_len = min(args.max_len, 384)
    if args.max_questions is not None and args.max_questions <= args.heldout:
        p.error(f"--max-questions ({args.max_questions}) must exceed --heldout ({args.heldout})")
    for name in ("heldout", "steps", "prompts_per_step", "micro_batch_size", "max_turns", "max_len",
                 "max_tokens_per_turn", "concurrency", "max_epochs"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.n_samples < 2:
        p.error(f"--n-samples must be >= 2 (a group baseline needs 2), got {args.n_samples}")
    if args.data and not (args.corpus or args.index):
        p.error("--data needs the corpus its answers live in: --corpus JSONL or --index DIR")
    if args.resume and not args.out:
        p.error("--resume needs --out (the run folder to continue)")
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


def train_config(args: argparse.Namespace):
    """The trainer's settings from the demo's flags (raises ValueError naming a bad one)."""
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
        adv=AdvantageConfig(estimator=args.estimator, alpha=args.alpha, stratify_by=args.stratify_by,
                            calibadv=CalibAdvConfig() if args.calibadv else None),
        loss=LossConfig(kl_coef=args.kl_coef, sapo=SAPOConfig() if args.sapo else None))


def _stage(k: int, name: str, t0: float, peaks) -> None:
    previous = peaks.begin(name)
    rss = f", previous stage peak RSS {previous:,.0f} MiB" if previous is not None else ""
    print(f"\n== [{k}/{STAGES}] {name}  (t = {time.monotonic() - t0:5.1f} s{rss})", flush=True)


def _questions(args):
    """(train, held-out, corpus jsonl or None, index or None)."""
    from openrlhf_sgrpo import assets
    from openrlhf_sgrpo.demo.corpus import write_corpus
    from openrlhf_sgrpo.demo.fanout import answerable_subquestions, load_extracts, split
    from openrlhf_sgrpo.local.data import load_flashrag_jsonl

    if args.data:
        qs = load_flashrag_jsonl(args.data)
        if len(qs) <= args.heldout:
            raise ValueError(f"--data has {len(qs)} questions, not more than --heldout {args.heldout}")
        return qs[args.heldout:], qs[: args.heldout], args.corpus, args.index
    extracts = load_extracts(assets.wiki_extracts_json())
    subs = answerable_subquestions(assets.fanoutqa_dev_json(), extracts)[: args.max_questions]
    train, held = split(subs, args.heldout, seed=args.seed)
    inside = sum(s.answer_in_extract for s in subs)
    print(f"FanOutQA dev: {len(subs)} sub-questions with their evidence page in the extracts "
          f"({inside} with the answer string in it); train {len(train)}, held-out {len(held)}")
    corpus = write_corpus(extracts, {s.evidence_title for s in subs}, args.distractors, seed=args.seed)
    return [s.as_question() for s in train], [s.as_question() for s in held], corpus, args.index


def _index(args, corpus, index):
    from openrlhf_sgrpo.local.services import cached_index_for

    # the demo's corpus and a user's alike: indexed in the cache, never beside the data
    return Path(index) if index else cached_index_for(corpus)


def _warmup(args, model, tok, train, out: Path, logger) -> bool:
    """Cold start on the action format, once per run (a checkpoint's weights already have it).

    Returns whether it ran in this process."""
    from agent_env.templates import build_prompt
    from openrlhf_sgrpo.local.checkpoint import latest_checkpoint
    from openrlhf_sgrpo.local.models import TINY_QWEN2
    from openrlhf_sgrpo.local.warmup import action_format_pairs, format_warmup

    if args.warmup_steps == 0 or latest_checkpoint(out / "checkpoints") is not None:
        print("skipped" if args.warmup_steps == 0 else "skipped: resuming from a checkpoint that includes it")
        return False
    if args.model == TINY_QWEN2:
        pairs = action_format_pairs(train[:64])
    else:
        pairs = action_format_pairs(train[:64], prompt_fn=lambda q: build_prompt(TEMPLATE, q, tok),
                                    query_fn=lambda q: q, sep="")
    loss = format_warmup(model, tok, train, steps=args.warmup_steps, lr=args.warmup_lr, pairs=pairs,
                         batch_size=args.warmup_batch,
                         seed=args.seed, progress=True)
    logger.log(0, {"steps": args.warmup_steps, "final_loss": loss, "pairs": len(pairs)}, phase="warmup")
    return True


def _eval_after_warmup(args, ran: bool, rollout, held, predictions: Path, logger) -> dict | None:
    """Held-out right after the warm-up. On a resume past it, only its recorded evaluation is
    reused (the weights now include RL steps, so evaluating them would mislabel the column)."""
    from openrlhf_sgrpo.eval.core import TrajectoryRecords, evaluate, read_records, summarize

    if ran:
        warm = summarize(evaluate(rollout, "warmup", held, predictions, args.concurrency,
                                  records=TrajectoryRecords(args.out, "eval_warmup", 0)))
        logger.log(0, warm, phase="eval_warmup")
        return warm
    ids = {q.qid for q in held}
    recorded = [r for r in read_records(predictions) if r.get("dataset") == "warmup" and r["id"] in ids]
    return summarize(recorded) if args.warmup_steps and len(recorded) == len(ids) else None


def run(args: argparse.Namespace) -> dict:
    t0 = time.monotonic()
    from agent_env.config import AgentConfig
    from openrlhf_sgrpo.demo.memory import StagePeaks
    from openrlhf_sgrpo.demo.report import before_after_table, plot_report, steps_table
    from openrlhf_sgrpo.eval.core import TrajectoryRecords, evaluate, summarize
    from openrlhf_sgrpo.inspect.report import write_report
    from openrlhf_sgrpo.local.heap import map_large_allocations
    from openrlhf_sgrpo.local.hf_engine import HFGenerationEngine
    from openrlhf_sgrpo.local.models import TINY_QWEN2, load_policy
    from openrlhf_sgrpo.local.rollout import AgentRollout
    from openrlhf_sgrpo.local.scripted import spread_script
    from openrlhf_sgrpo.local.services import local_services
    from openrlhf_sgrpo.local.step_log import StepLogger, read_step_log
    from openrlhf_sgrpo.local.trainer import LocalTrainer

    map_large_allocations()  # see local/heap.py: ~0.7 GB less RSS in the update on CPU
    out = args.out
    if out.exists() and any(out.iterdir()) and not args.resume:
        raise ValueError(f"--out {out} already holds a run; pass --resume to continue it or pick another folder")
    out.mkdir(parents=True, exist_ok=True)
    (out / "args.json").write_text(json.dumps({k: str(v) for k, v in vars(args).items()}, indent=1))
    tcfg = train_config(args)
    peaks = StagePeaks()

    _stage(1, "data", t0, peaks)
    train, held, corpus, index = _questions(args)
    _stage(2, "retriever index", t0, peaks)
    index = _index(args, corpus, index)
    _stage(3, f"services + policy ({args.model})", t0, peaks)
    model, tok = load_policy(args.model, args.device, seed=args.seed)
    if args.gradient_checkpointing:  # before the warm-up, whose backward is as large as RL's
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    print(f"policy: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")
    logger = StepLogger(out, run_name=out.name, config={k: str(v) for k, v in vars(args).items()})
    with local_services(index) as urls:
        print(f"retriever {urls.retriever_url}\nsandbox   {urls.sandbox_url}")
        agent_cfg = AgentConfig(retriever_url=urls.retriever_url, sandbox_url=urls.sandbox_url,
                                template="none" if args.model == TINY_QWEN2 else TEMPLATE, max_turns=args.max_turns,
                                topk=3, max_obs_tokens=args.max_obs_tokens, reward=args.reward, format_reward=True)
        engine = HFGenerationEngine(model, tok, max_batch=max(args.concurrency, args.prompts_per_step * args.n_samples),
                                    seed=args.seed)
        rollout = AgentRollout(engine, tok, agent_cfg, args.max_len, args.max_tokens_per_turn,
                               temperature=args.temperature, first_turn_script=spread_script if args.smoke else None)
        try:
            _stage(4, f"evaluate held-out ({len(held)} questions) before training", t0, peaks)
            before = summarize(evaluate(rollout, "before", held, out / "eval_predictions.jsonl", args.concurrency,
                                        records=TrajectoryRecords(out, "eval_before", 0)))
            logger.log(0, before, phase="eval_before")
            _stage(5, f"format warm-up: {args.warmup_steps} supervised steps on train questions", t0, peaks)
            ran = _warmup(args, model, tok, train, out, logger)
            warm = _eval_after_warmup(args, ran, rollout, held, out / "eval_predictions.jsonl", logger)
            _stage(6, f"train {args.steps} steps of {args.estimator}", t0, peaks)
            print(f"{tcfg.optimizer_steps_per_rollout} optimizer step(s) per rollout of {tcfg.rollout_batch_size} "
                  f"samples (train batch {tcfg.mini_batch_size}, {tcfg.max_epochs} epoch(s)); gradient "
                  f"checkpointing {'on' if tcfg.gradient_checkpointing else 'off'}"
                  + ("; --smoke scripts the first turn of samples 0-2 of every group" if args.smoke else ""))
            trainer = LocalTrainer(model, tok, rollout, train, tcfg, out, logger=logger)
            if args.resume and trainer.resume():
                print(f"resumed at step {trainer.step}")
            trainer.train()
            _stage(7, "evaluate held-out after training", t0, peaks)
            # Keyed by the step: a run resumed to more steps evaluates its new weights instead of
            # reusing the earlier end's predictions under the same name.
            after = summarize(evaluate(rollout, f"after_step{args.steps}", held, out / "eval_predictions.jsonl",
                                       args.concurrency, records=TrajectoryRecords(out, "eval_after", args.steps)))
            logger.log(args.steps, after, phase="eval_after")
        finally:
            rollout.close()
            logger.close()
            peaks.close()
    records = read_step_log(out / "metrics.jsonl", "train")
    plot_report(records, out / "report.png")
    inspector, warnings = write_report(out)
    for w in warnings:
        print(f"warning: {w}")
    print("\n" + before_after_table(before, after, warm))
    print("\n" + steps_table(records))
    print("\n" + peaks.table())
    print(f"\nwrote {out / 'report.png'}, {out / 'metrics.jsonl'} (total {time.monotonic() - t0:.0f} s)")
    print(f"rollout inspector: {inspector} (python -m openrlhf_sgrpo.inspect {out} rebuilds it)")
    return {"before": before, "after_warmup": warm, "after": after, "steps": records, "stages": peaks.rows}


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    try:
        run(args)
    except KeyboardInterrupt:
        print(f"\ninterrupted; continue with: python -m openrlhf_sgrpo.demo --out {args.out} --resume",
              file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
