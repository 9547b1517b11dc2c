"""Which path each trajectory took on the trap world's two-hop questions, from the rollout records.

Why: the search count alone cannot tell the trap's stories apart. A two-search trajectory of the
trap world (:mod:`.trap_task`) is one of three things: the right bridge (the second query is the
person's birth town: it answers), the wrong bridge (the town the person works in: EM 0), or a
second search of something else (typically the aunt's name after reading the shortcut: it pays
as the shortcut does, about half of the time). A policy can keep searching twice by moving from
the wrong bridge to a redundant second search and only then to the right bridge, a ladder inside
one tool-call stratum that a model of strata with one success rate each (``bench/strata_sim.py``)
does not have. This module counts the paths per arm and step, so a reader sees which happened.

Classification compares the *queries* the policy wrote with the world's facts (the question's
gold chain and its wrong bridge, rebuilt from the run's ``args.json``), never the text of an
observation or an answer: the second query names the birth town and not the work town -> right
bridge, the work town and not the birth town -> wrong bridge, anything else -> other.

``python -m openrlhf_sgrpo.demo.trap_paths RUN_DIR`` prints, per arm, the paths of the training
trajectories in windows of steps, and of the held-out two-hop questions after RL.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable
from pathlib import Path

from openrlhf_sgrpo.demo.synth_task import TaskQuestion, build_task

# (slug used in step records, name in tables)
PATHS: tuple[tuple[str, str], ...] = (("no_search", "no search"), ("one_search", "one search"),
                                      ("right_bridge", "2: right bridge"), ("wrong_bridge", "2: wrong bridge"),
                                      ("other_second", "2: other second query"), ("three_plus", "3+ searches"))
PATH_PREFIX = "path/"


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", str(text)).strip().casefold()


def classify(question: TaskQuestion, sample: dict) -> str:
    """The path slug of one recorded trajectory (a rollout record's sample) on a trap two-hop
    ``question``; ValueError for a question without the trap's hops."""
    if question.n_hops != 2 or question.decoy is None:
        raise ValueError(f"{question.qid}: not a two-hop question of the trap world")
    queries = [t.get("query") or "" for t in sample.get("turns") or [] if t.get("kind") == "search"]
    calls = int(sample.get("search_calls", len(queries)))
    if calls == 0:
        return "no_search"
    if calls == 1:
        return "one_search"
    if calls > 2:
        return "three_plus"
    second = _norm(queries[1]) if len(queries) > 1 else ""
    birth, work = _norm(question.hops[1].query), _norm(question.decoy.query)
    has_birth, has_work = birth in second, work in second
    if has_birth and not has_work:
        return "right_bridge"
    if has_work and not has_birth:
        return "wrong_bridge"
    return "other_second"


def count_paths(questions: dict[str, TaskQuestion], groups: Iterable[dict]) -> dict[str, list[float]]:
    """slug -> [trajectories, EM sum] over the two-hop trap questions of ``groups`` (rollout
    records); groups of other questions (one-hop) are left out."""
    out = {slug: [0, 0.0] for slug, _ in PATHS}
    for g in groups:
        q = questions.get(g.get("prompt_id"))
        if q is None or q.n_hops != 2 or q.decoy is None:
            continue
        for s in g.get("samples") or []:
            cell = out[classify(q, s)]
            cell[0] += 1
            cell[1] += float(s.get("em") or 0.0)
    return out


def step_fields(counts: dict[str, list[float]]) -> dict[str, float]:
    """The step record's keys: ``path/<slug>/share`` (of the step's two-hop trajectories) and
    ``path/<slug>/em`` (mean EM of the path), for the paths some trajectory took (an absent path
    had share 0: a seed folder stays small)."""
    total = sum(n for n, _ in counts.values())
    out: dict[str, float] = {}
    for slug, (n, wins) in counts.items():
        if n:
            out[f"{PATH_PREFIX}{slug}/share"] = n / total
            out[f"{PATH_PREFIX}{slug}/em"] = wins / n
    return out


def read_groups(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def task_questions(settings: dict) -> dict[str, TaskQuestion]:
    """qid -> question of the run's world, rebuilt from its typed settings (the demo's flags)."""
    task = build_task(int(settings["train_pairs"]), int(settings["heldout"]), int(settings["task_seed"]),
                      str(settings["task"]))
    return {q.qid: q for q in (*task.train, *task.heldout)}


def arm_step_paths(arm_dir: Path, questions: dict[str, TaskQuestion]) -> dict[int, dict[str, list[float]]]:
    """step -> path counts of one arm's recorded training rollouts (``rollouts/train/step_*.jsonl``)."""
    out = {}
    for f in sorted((Path(arm_dir) / "rollouts" / "train").glob("step_*.jsonl")):
        out[int(f.stem.split("_")[1])] = count_paths(questions, read_groups(f))
    return out


def arm_heldout_paths(arm_dir: Path, questions: dict[str, TaskQuestion]) -> dict[str, list[float]] | None:
    """Path counts of the held-out evaluation after RL (the last ``rollouts/eval_after`` file)."""
    files = sorted((Path(arm_dir) / "rollouts" / "eval_after").glob("step_*.jsonl"))
    return count_paths(questions, read_groups(files[-1])) if files else None


def windows(last: int, window: int) -> list[tuple[str, range]]:
    """("a-b", steps a..b) for steps 1..``last`` in blocks of ``window`` (the last block may be short)."""
    return [(f"{a}-{min(a + window - 1, last)}", range(a, a + window)) for a in range(1, last + 1, window)]


def path_cell(share: float, em: float) -> str:
    """A path's table cell: its share and (its EM); a path no trajectory took is "-" (the callers')."""
    return f"{share:.2f} ({em:.2f})"


def paths_table(rows: list[tuple[str, dict[str, list[float]]]]) -> str:
    """A markdown table: one row per (label, counts); per path its share of the row's two-hop
    trajectories and, in brackets, its EM."""
    from openrlhf_sgrpo.eval.table import format_table

    cells = []
    for label, counts in rows:
        total = sum(n for n, _ in counts.values())
        cells.append([label, int(total), *(path_cell(n / total, w / n) if n else "-"
                                           for n, w in (counts[s] for s, _ in PATHS))])
    return format_table(["steps", "two-hop trajectories", *(name for _, name in PATHS)], cells)


def _sum(counts: Iterable[dict[str, list[float]]]) -> dict[str, list[float]]:
    out = {slug: [0, 0.0] for slug, _ in PATHS}
    for c in counts:
        for slug, (n, w) in c.items():
            out[slug][0] += n
            out[slug][1] += w
    return out


def run_report(run: Path, window: int = 4) -> str:
    """Per arm of a demo run of the trap world: its training paths in windows of ``window``
    steps, then the held-out two-hop questions after RL (greedy)."""
    from openrlhf_sgrpo.demo.arms import arms_for
    from openrlhf_sgrpo.demo.study_seeds import read_args, run_settings

    run = Path(run)
    args = read_args(run)
    settings = run_settings(run, args)
    if settings.get("task") != "trap":
        raise ValueError(f"{run}: task {settings.get('task')!r}, not the trap world (--task trap)")
    questions = task_questions(settings)
    parts = [f"Paths on the trap world's two-hop questions, {run}: per path its share of the trajectories "
             "and (its EM); 2 = two searches, by the second query (right bridge: the birth town, wrong: "
             "the work town, other: anything else, e.g. the aunt)."]
    arms = args.get("arms") if args.get("arms") not in (None, "", "None") else None
    for arm in arms_for(argparse.Namespace(out=run, arms=arms, compare=args.get("compare") == "True",
                                           estimator=args.get("estimator"), alpha=float(args.get("alpha") or 0.6))):
        steps = arm_step_paths(arm.dir, questions)
        if not steps:
            continue
        last = max(steps)
        rows = [(name, _sum(steps[s] for s in steps if s in block)) for name, block in windows(last, window)]
        held = arm_heldout_paths(arm.dir, questions)
        if held is not None:
            rows.append(("held-out after RL", held))
        parts += ["", f"### {arm.label}", "", paths_table(rows)]
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m openrlhf_sgrpo.demo.trap_paths", description=__doc__.split("\n")[0])
    p.add_argument("run", help="a demo run folder of the trap world (--task trap), with its rollout records")
    p.add_argument("--window", type=int, default=4, help="steps per table row (default 4)")
    args = p.parse_args(argv)
    if args.window < 1:
        p.error(f"--window must be >= 1, got {args.window}")
    if not (Path(args.run) / "args.json").is_file():
        p.error(f"{args.run}: not a demo run folder (no args.json)")
    try:
        print(run_report(Path(args.run), args.window), end="")
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
