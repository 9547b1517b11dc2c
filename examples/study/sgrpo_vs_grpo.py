"""GRPO vs Stratified GRPO (alpha 0.6 / 0.8 / 1.0) on the demo's search task, several seeds.

On a GPU (the settings the study was written for; one seed takes one warm-up and four arms):

    python examples/study/sgrpo_vs_grpo.py --out runs/study --seeds 0 1 2 -- \
        --device cuda --steps 60 --prompts-per-step 8 --n-samples 8 --warmup-steps 16 \
        --micro-batch-size 8 --concurrency 64

Everything after ``--`` goes to ``python -m openrlhf_sgrpo.demo`` for every seed. Writes
``OUT/study_table.md`` (held-out EM/F1 by hop, searches, two-search share after RL: mean ± std over
seeds), ``OUT/study.png`` (training curves, mean over seeds) and ``OUT/study.json`` (per seed, plus
the device and library versions). ``--resume`` continues every seed's run where it stopped.
``--smoke`` runs it tiny on a CPU (tiny random Qwen2; a check of the plumbing, not a result).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from openrlhf_sgrpo.demo.study import DEFAULT_ARMS, run_seeds, write_study


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    demo_args = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="sgrpo_vs_grpo.py", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="study folder (one demo run per seed inside)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--arms", default=DEFAULT_ARMS, help=f"the demo's --arms (default {DEFAULT_ARMS})")
    p.add_argument("--resume", action="store_true", help="continue the seeds' runs in --out")
    p.add_argument("--smoke", action="store_true", help="tiny CPU run of the whole study (tests)")
    args = p.parse_args(own)
    if len(set(args.seeds)) != len(args.seeds):
        p.error(f"--seeds repeats a seed: {args.seeds}")
    if args.smoke:
        demo_args = ["--smoke", *demo_args]
    results = run_seeds(args.seeds, Path(args.out), args.arms, demo_args, resume=args.resume)
    table = write_study(results, Path(args.out), argv)
    print("\n" + table)
    print(f"\nwrote {Path(args.out) / 'study_table.md'}, {Path(args.out) / 'study.png'}, {Path(args.out) / 'study.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
