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
import json
import logging
import sys
import time
from pathlib import Path

from openrlhf_sgrpo.demo.options import TEMPLATE, parse_args, train_config
from openrlhf_sgrpo.demo.stack import evaluate_heldout, make_engine, make_rollout, recorded_summary, services

log = logging.getLogger("openrlhf_sgrpo.demo")


class Stages:
    """Numbered stage headers with the previous stage's peak RSS."""

    def __init__(self, total: int, t0: float, peaks):
        self.total, self.t0, self.peaks, self.k = total, t0, peaks, 0

    def __call__(self, name: str) -> None:
        self.k += 1
        previous = self.peaks.begin(name)
        rss = f", previous stage peak RSS {previous:,.0f} MiB" if previous is not None else ""
        print(f"\n== [{self.k}/{self.total}] {name}  (t = {time.monotonic() - self.t0:5.1f} s{rss})", flush=True)


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
STRATA_CHECK_SEED = 999_983  # added to the run's seed: draws of their own, apart from every step's


def strata_after_warmup(args, rollout, heldout) -> dict:
    """Each search count's share and EM on the held-out two-hop questions, sampled from the policy
    RL starts from (demo/strata_check.py): the trap regime's premise, measured."""
    from openrlhf_sgrpo.demo import strata_check
    from openrlhf_sgrpo.demo.synth_task import hop_of_qid

    two_hop = [q for q in heldout if hop_of_qid(q.qid) == 2]
    check = strata_check.measure(rollout, two_hop, args.strata_check, args.seed * 1_000_003 + STRATA_CHECK_SEED)
    print(strata_check.describe(check))
    return check


def _train_arm(args, arm, model, tok, rollouts, engine, data, stages, logger) -> tuple[dict, list[dict]]:
    """Train one arm (from the warm-up weights under --compare) and evaluate it on held-out;
    ``rollouts`` is (training's, evaluation's)."""
    from openrlhf_sgrpo.demo.hops import HopMetrics
    from openrlhf_sgrpo.demo.warm import load_warm_weights, weights_fingerprint
    from openrlhf_sgrpo.local.checkpoint import latest_checkpoint
    from openrlhf_sgrpo.local.step_log import StepLogger, read_step_log
    from openrlhf_sgrpo.local.trainer import LocalTrainer

    tcfg = train_config(args, arm.estimator, arm.alpha, arm.stratify_by)
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
        after = evaluate_heldout(args, rollout, f"after_step{args.steps}", data.heldout, arm.predictions, arm.dir,
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
    with services(args, index, train_index, template) as (agent_cfg, train_cfg):
        if data.task is not None:
            recall = measure_recall(agent_cfg.retriever_url, list(data.task.heldout), k=agent_cfg.topk)
            checks["recall"] = vars(recall)
            print(recall.describe())
            leaks = leaked_answers(data.task)
            if leaks:
                raise ValueError(f"held-out answers occur in training questions: {leaks[:5]}")
        warm_needed = _needs_warmup(args, arms)
        # before the rollout below: each AgentRollout instruments the process-wide tool clients
        demos = (demonstrations(args, data, tok, prompt_fn, lambda engine: make_rollout(args, engine, tok, train_cfg))
                 if warm_needed else None)
        engine = make_engine(args, model, tok)
        rollout = make_rollout(args, engine, tok, agent_cfg)  # evaluation: greedy, never scripted
        train_rollout = make_rollout(args, engine, tok, train_cfg, script=spread_script if args.smoke else None)
        try:
            stages(f"evaluate held-out ({len(data.heldout)} questions) before training")
            before = None
            if args.eval_before:
                before = evaluate_heldout(args, rollout, "before", data.heldout, out / "eval_predictions.jsonl", out,
                                          "eval_before", 0)
                logger.log(0, before, phase="eval_before")
            else:
                print("skipped (--no-eval-before)")
            if data.task is not None and args.eval_before:
                checks["closed_book_before"] = closed_book(model, tok, list(data.task.heldout), prompt_fn)
                print(f"closed-book (answer at once, no search) held-out EM {checks['closed_book_before']['em']:.3f}")
            stages(f"warm-up: {args.warmup_steps} supervised steps on train questions")
            warm = None
            if warm_needed:
                warm_up(args, model, tok, data, demos, None if template == "none" else prompt_fn, logger)
                engine.sync_weights(model)
                if args.compare:
                    save_warm_weights(model, out / WARM_WEIGHTS)
                warm = evaluate_heldout(args, rollout, "warmup", data.heldout, out / "eval_predictions.jsonl", out,
                                 "eval_warmup", 0)
                logger.log(0, warm, phase="eval_warmup")
                if data.task is not None:
                    checks["closed_book_warmup"] = closed_book(model, tok, list(data.task.heldout), prompt_fn)
                    print(f"closed-book after the warm-up: held-out EM {checks['closed_book_warmup']['em']:.3f}")
                if data.task is not None and args.strata_check:
                    checks["strata_warmup"] = strata_after_warmup(args, rollout, data.heldout)
                    logger.log(0, checks["strata_warmup"], phase="strata_check")
            else:
                print("skipped" if args.warmup_steps == 0 else "skipped: resuming from weights that include it")
                # a resumed run shows the recorded column (its weights now include RL steps)
                warm = recorded_summary(out / "eval_predictions.jsonl", "warmup", data.heldout) if args.warmup_steps else None
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
    from openrlhf_sgrpo.local.stop_signal import SigtermInterrupts

    args = parse_args(argv)
    try:
        with SigtermInterrupts():  # a scheduler's SIGTERM: the checkpoint kept, the engine shut, as Ctrl-C
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
