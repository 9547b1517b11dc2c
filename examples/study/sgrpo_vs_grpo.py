"""GRPO vs Stratified GRPO (alpha 0.8) vs random strata (alpha 0.8) on the demo's search task, seeds side by side.

On a CPU (docs/study.md: one seed of 3 arms x 20 steps of 32 trajectories, the arms in one process):

    nice -n 10 python examples/study/sgrpo_vs_grpo.py --out runs/study-cpu --seeds 0 --cpu trap \
        --seeds-out docs/study/seeds

``--cpu REGIME`` (``trap`` or ``search``) passes the CPU study's demo flags (``demo/study.py``:
``cpu_study_flags``); flags after ``--`` come after them (the last one of a flag wins).

On a GPU (docs/study.md: why 3 processes, their memory and time):

    python examples/study/sgrpo_vs_grpo.py --out runs/study --seeds 0 1 2 --split-arms --gpu-memory-share 0.08 -- \
        --device cuda --steps 20 --prompts-per-step 8 --n-samples 8 --warmup-steps 16 \
        --micro-batch-size 8 --concurrency 64 --no-sandbox

Everything after ``--`` goes to ``python -m openrlhf_sgrpo.demo`` for every process. Each seed is
its own demo process (one warm-up, then every arm from the same warm-up weights), or with
``--split-arms`` each (seed, arm) is (the seed's first arm does the warm-up; the others start from a
copy of its weights); ``--jobs`` processes at once (default: all), each vLLM engine with
``--gpu-memory-share`` of the GPU. One line per step per process goes to ``OUT/progress.log`` and
stdout, each process's output to ``OUT/logs/seed_<s>[.<arm>].log``.
A seed that fails is reported with its log; the others go on. Writes, per finished seed, a small
seed folder under ``OUT/seeds/`` (or ``--seeds-out``) to commit (``docs/study.md``), then the study
report over every folder there (``OUT/table.md``, ``OUT/figure.png``: the same
``python -m openrlhf_sgrpo.demo.study_report`` that aggregates every committed seed), and
``OUT/study.json`` (this session's argv, machine and failed processes). ``--resume`` continues every
seed's run where it stopped and skips the finished ones. ``--smoke`` runs it tiny on a CPU (tiny
random Qwen2; a check of the plumbing, not a result). Exit status: 0, 1 if a seed failed, 130
when interrupted (what finished is written either way).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from openrlhf_sgrpo.demo.study import DEFAULT_ARMS, write_session
from openrlhf_sgrpo.demo.study_report import write_report


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"--gpu-memory-share {text!r}: a fraction of the GPU's memory in (0, 1]")
    return value


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The study's own flags (before ``--``) and the demo's (after it), both checked before any
    process starts: a bad demo flag would otherwise fail every seed's process alike."""
    from openrlhf_sgrpo.demo.arms import parse_arms
    from openrlhf_sgrpo.demo.options import parse_args

    demo_args = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="sgrpo_vs_grpo.py", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="study folder (one demo run per seed inside)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--arms", default=DEFAULT_ARMS, help=f"the demo's --arms (default {DEFAULT_ARMS})")
    p.add_argument("--jobs", type=int, default=None, help="demo processes at once (default: all of them)")
    p.add_argument("--split-arms", action="store_true",
                   help="one process per (seed, arm), the arms from the seed's one warm-up (saved weights)")
    p.add_argument("--gpu-memory-share", type=_share, default=None,
                   help="each process's vLLM engine may claim this fraction of the GPU's memory (vLLM's "
                        "gpu_memory_utilization; its default 0.85 lets one engine start); unset on a CPU")
    p.add_argument("--stagger-s", type=float, default=2.0,
                   help="seconds between two processes' starts (engines starting at once can race for a port)")
    p.add_argument("--session", default=None,
                   help="name of this session in the seed folders (default: UTC date and time, YYYYMMDD-HHMM)")
    p.add_argument("--seeds-out", default=None, help="where the seed folders go (default OUT/seeds)")
    p.add_argument("--resume", action="store_true", help="continue the seeds' runs in --out")
    p.add_argument("--smoke", action="store_true", help="tiny CPU run of the whole study (tests)")
    p.add_argument("--cpu", choices=("trap", "search"), default=None, metavar="REGIME",
                   help="the CPU study on this task regime (trap or search): its demo flags (demo/study.py's "
                        "cpu_study_flags) before the ones after --")
    args = p.parse_args(own)
    if len(set(args.seeds)) != len(args.seeds):
        p.error(f"--seeds repeats a seed: {args.seeds}")
    if args.stagger_s < 0:
        p.error(f"--stagger-s must be >= 0, got {args.stagger_s}")
    if args.jobs is not None and args.jobs < 1:
        p.error(f"--jobs must be >= 1, got {args.jobs}")
    try:
        parse_arms(args.arms)
    except ValueError as err:
        p.error(str(err))
    if args.cpu:
        from openrlhf_sgrpo.demo.study import cpu_study_flags

        if args.gpu_memory_share is not None:
            p.error("--cpu runs on the CPU; --gpu-memory-share is for a GPU's parallel engines")
        demo_args = [*cpu_study_flags(args.cpu), *demo_args]
    if args.smoke:
        demo_args = ["--smoke", *demo_args]
    for own_flag in ("--seed", "--out", "--arms", "--resume", "--compare"):
        if own_flag in demo_args:
            p.error(f"{own_flag} after `--` is the study's to set per seed; pass the study's own flags before `--`")
    parse_args([*demo_args, "--arms", args.arms, "--out", "unused"])  # exits naming a bad demo flag
    args.session = args.session or time.strftime("%Y%m%d-%H%M", time.gmtime())
    return args, demo_args


def main(argv: list[str] | None = None) -> int:
    from openrlhf_sgrpo.demo.study_runner import run_parallel, seed_dir, seed_finished, seed_runs
    from openrlhf_sgrpo.demo.study_seeds import export_seed, git_commit

    argv = list(sys.argv[1:] if argv is None else argv)
    args, demo_args = parse(argv)
    out = Path(args.out)
    commit = git_commit()  # the code the seeds run: read before they start, not after hours of edits
    interrupted = False
    try:
        codes = run_parallel(args.seeds, out, args.arms, demo_args, resume=args.resume, jobs=args.jobs,
                             gpu_share=args.gpu_memory_share, split_arms=args.split_arms, stagger_s=args.stagger_s)
    except KeyboardInterrupt:
        interrupted, codes = True, {}
    done = [s for s in args.seeds if seed_finished(out, s, args.arms, args.split_arms)]
    failed = {name: rc for name, rc in codes.items() if rc != 0}
    if not done:
        print(f"\nno seed finished (failed: {failed or 'none'}; logs under {out / 'logs'})", file=sys.stderr)
        return 130 if interrupted else 1
    runs = {s: seed_runs(out, s, args.arms, args.split_arms) for s in done}
    env_path = seed_dir(out, done[0]) / "environment.json"
    seeds_out = Path(args.seeds_out) if args.seeds_out else out / "seeds"
    folders = [export_seed(seed_dir(out, s), s, args.arms, seeds_out, args.session, argv, commit, runs[s]) for s in done]
    record = write_session(out, argv, args.session, json.loads(env_path.read_text()) if env_path.exists() else None,
                           done, failed, folders)
    table, figure = write_report(seeds_out, out)
    print("\n" + table.read_text())
    print(f"\nwrote {table}, {figure} (over every seed folder in {seeds_out}) and {record}")
    print("seed folders to commit: " + ", ".join(str(f) for f in folders))
    for name, rc in failed.items():  # each with its log in progress.log's FAILED line
        print(f"{name} FAILED (exit {rc}); see {out / 'progress.log'}", file=sys.stderr)
    return 130 if interrupted else (1 if failed else 0)


if __name__ == "__main__":
    sys.exit(main())
