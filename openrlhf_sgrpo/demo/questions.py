"""The demo's questions and corpus: the generated search task (default) or a user's FlashRAG file.

The default needs nothing outside the installed packages (the world is generated from a seed),
so a fresh clone without ``../shared`` runs it. ``--data FILE --corpus JSONL`` trains on any
FlashRAG set instead (its first ``--heldout`` rows held out); such questions carry no hop count,
so their report has one row per metric instead of one per hop, and the warm-up falls back to the
first-action format pairs (there is no expert chain to demonstrate).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from openrlhf_sgrpo.demo.synth_task import SynthTask, build_task, write_corpus
from openrlhf_sgrpo.local.data import Question, load_flashrag_jsonl


@dataclass(frozen=True)
class DemoData:
    train: list[Question]
    heldout: list[Question]
    corpus: str | Path | None  # what evaluation searches
    index: str | None
    train_corpus: str | Path | None  # what training searches (None: the same as evaluation)
    task: SynthTask | None  # None for --data

    def hop_of_question(self) -> dict[str, int]:
        """Question text -> hop count for the training questions (empty for --data)."""
        return {} if self.task is None else {q.question: q.n_hops for q in self.task.train}


def load_demo_data(args) -> DemoData:
    """Build the task (or read ``--data``) and write its corpus; prints what it holds."""
    from openrlhf_sgrpo.assets import cache_dir

    if args.data:
        qs = load_flashrag_jsonl(args.data)
        if len(qs) <= args.heldout:
            raise ValueError(f"--data has {len(qs)} questions, not more than --heldout {args.heldout}")
        print(f"{args.data}: {len(qs)} questions; train {len(qs) - args.heldout}, held-out {args.heldout}")
        return DemoData(qs[args.heldout:], qs[: args.heldout], args.corpus, args.index, None, None)
    task = build_task(args.train_pairs, args.heldout, seed=args.task_seed, regime=args.task)
    corpus = write_corpus(task, cache_dir() / "demo")
    train_corpus = write_corpus(task, cache_dir() / "demo", train_only=True)
    one = sum(q.n_hops == 1 for q in task.heldout)
    print(f"generated task (seed {task.seed}): {len(task.passages)} passages about {len(task.train_pairs)} train + "
          f"{len(task.heldout_pairs)} held-out person-town pairs; train {len(task.train)} questions "
          f"({sum(q.n_hops == 2 for q in task.train)} two-hop), held-out {len(task.heldout)} "
          f"({one} one-hop, {len(task.heldout) - one} two-hop)")
    q = next(q for q in task.heldout if q.n_hops == 2)
    print(f"e.g. {q.question} -> search {q.hops[0].query!r}, then {q.hops[1].query!r} -> {q.answer}")
    print(f"training searches the {len(task.train_passages())} passages of the train pairs; evaluation all "
          f"{len(task.passages)}")
    rl = list(task.train)
    if args.fresh_rl_questions and args.warmup_steps:
        # the warm-up fitted whole trajectories of the first --demos questions, answers included:
        # RL on them would reward recalling those answers, not searching
        rl = rl[args.demos:]
        if not rl:
            raise ValueError(f"--fresh-rl-questions: all {len(task.train)} training questions are demonstrations "
                             f"(--demos {args.demos}); raise --train-pairs or lower --demos")
        print(f"RL trains on the {len(rl)} training questions the warm-up did not demonstrate")
    if task.regime == "trap":
        from openrlhf_sgrpo.demo.trap_task import describe_trap, rl_questions

        rl = rl_questions(rl)
        print(describe_trap(task, len(rl)))
    return DemoData([q.as_question() for q in rl], [q.as_question() for q in task.heldout], corpus,
                    args.index, train_corpus, task)
