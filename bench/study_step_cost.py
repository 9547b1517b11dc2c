"""What a CPU study seed costs: study arm-steps per CPU hour with today's update settings and the
study's, measured in one run of the real demo entry point, and the seed's projected wall time.

    .venv/bin/python bench/study_step_cost.py [--steps 3] [--task trap] [--out /tmp/study_cost]

Runs ``python -m openrlhf_sgrpo.demo`` twice, one after the other, on the same task, seed and
step shape as a study arm (``--prompts-per-step 4 --n-samples 8``: 32 trajectories in groups of
8), one arm (GRPO) of ``--steps`` steps each:

- **today**: the demo's update as it was (gradient checkpointing on, micro-batches of 2, the
  warm-up one row at a time);
- **study**: the CPU study's (``demo/study.py``'s ``CPU_STUDY_UPDATE``): no
  gradient checkpointing, a prompt group's prompt run once (``--shared-prefix``), no pass over
  samples whose advantage is 0 (``--skip-zero-advantage``), micro-batches of 4, warm-up rows 4 at
  a time. Each is exact (tests/test_update_shortcuts.py); only float rounding differs.

Both runs sample the same first rollout (same weights after the same warm-up data, same seeds),
so their first steps see the same trajectories up to the warm-up's rounding. Prints per run the
stage times (setup, warm-up, evaluations; no strata check), the mean seconds per training step and
its parts (rollout, update), arm-steps per CPU hour, the ratio study / today, and the projected
seed (3 arms x 20 steps plus the fixed stages) for each. The load average is printed with each
run: the two runs share the machine with whatever else runs, so compare them within one
invocation only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPE = ["--prompts-per-step", "4", "--n-samples", "8", "--no-sandbox", "--reward", "em", "--arms", "grpo"]
TODAY = ["--gradient-checkpointing", "--micro-batch-size", "2", "--warmup-micro-batch", "1"]
# the study's held-out evaluation before the warm-up is skipped (demo/study.py): both runs skip it,
# so the comparison is the update's and the warm-up's alone. The strata check after the warm-up
# (192 sampled trajectories in the trap regime) is generation only, the same in both runs: it is
# left out (--strata-check 0), and the projected seed leaves it out too (7 min on a quiet 2-core
# AVX2 EPYC, docs/records/study_cpu.md); a first try with it took over 15 min a run beside a seed.
COMMON = ["--no-eval-before", "--strata-check", "0"]
ARMS, STEPS = 3, 20  # a seed: 3 arms x 20 steps


def run(name: str, flags: list[str], args: argparse.Namespace) -> dict:
    """One demo run; its stage and step times read back from its own files."""
    out = Path(args.out) / name
    cmd = [sys.executable, "-m", "openrlhf_sgrpo.demo", "--out", str(out), "--task", args.task,
           "--steps", str(args.steps), *SHAPE, *COMMON, *flags, *(["--smoke"] if args.smoke else [])]
    load0, t0 = os.getloadavg()[0], time.monotonic()
    log = out.with_suffix(".log")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
    wall = time.monotonic() - t0
    if rc != 0:
        raise SystemExit(f"{name}: the demo exited {rc}; see {log}")
    arm = [json.loads(line) for line in (out / "grpo" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in arm if r.get("phase") == "train"]
    start = next(r["time"] for r in arm if r.get("phase") == "arm_start")
    times = [r["time"] for r in train]
    walls = [b - a for a, b in zip([start, *times], times)]
    eval_after = next(r["time"] for r in arm if r.get("phase") == "eval_after") - times[-1]
    return {"name": name, "wall_s": wall, "load": (load0, os.getloadavg()[0]), "step_s": sum(walls) / len(walls),
            "rollout_s": sum(r.get("time/rollout_wall_s", 0.0) for r in train) / len(train),
            "update_s": sum(r["time/update_s"] for r in train) / len(train),
            "fixed_s": wall - sum(walls), "eval_after_s": eval_after, "steps": len(train)}


def projected_seed_s(r: dict) -> float:
    """Everything of the run but its steps (setup, warm-up, evaluations, one arm's
    closing evaluation), two more arms' closing evaluations, and 3 x 20 steps at the measured rate."""
    return r["fixed_s"] + (ARMS - 1) * r["eval_after_s"] + ARMS * STEPS * r["step_s"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3, help="training steps per run (default 3)")
    p.add_argument("--task", default="trap", choices=("search", "trap"))
    p.add_argument("--out", default="/tmp/study_step_cost")
    p.add_argument("--smoke", action="store_true", help="tiny model: a check of the bench's plumbing")
    args = p.parse_args(argv)
    from openrlhf_sgrpo.demo.study import CPU_STUDY_UPDATE

    rows = [run("today", TODAY, args), run("study", list(CPU_STUDY_UPDATE), args)]
    print(f"\n{'run':<7} {'load':>11} {'s/step':>7} {'rollout':>8} {'update':>7} {'fixed s':>8} "
          f"{'arm-steps/h':>12} {'seed (3x20) min':>16}")
    for r in rows:
        print(f"{r['name']:<7} {r['load'][0]:>5.1f}->{r['load'][1]:<5.1f} {r['step_s']:>7.1f} {r['rollout_s']:>8.1f} "
              f"{r['update_s']:>7.1f} {r['fixed_s']:>8.0f} {3600 / r['step_s']:>12.1f} {projected_seed_s(r) / 60:>16.1f}")
    today, study = rows
    print(f"\nstudy / today: arm-steps per CPU hour x{today['step_s'] / study['step_s']:.2f}, update "
          f"x{today['update_s'] / study['update_s']:.2f}, projected seed x{projected_seed_s(today) / projected_seed_s(study):.2f}")
    (Path(args.out) / "study_step_cost.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
