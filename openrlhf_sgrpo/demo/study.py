"""The GRPO vs Stratified GRPO study: its default arms and this session's record.

For each seed, one demo run (``python -m openrlhf_sgrpo.demo --arms ...``: one warm-up, then every
arm trained from the same warm-up weights, questions and number of steps) in ``OUT/seed_<s>``, the
runs side by side as processes (``demo/study_runner.py``). Each finished seed is exported as a
small seed folder (``demo/study_seeds.py``), and the session's table and figure are the study
report's (``demo/study_report.py``) over those folders: one way to summarize seeds, whether they
come from this session or from every committed one. ``study.json`` records what only this session
knows (its argv, machine, the processes that failed). Meant for a GPU
(``examples/study/sgrpo_vs_grpo.py`` has the settings); ``--smoke`` runs it tiny on a CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

# GRPO, Stratified GRPO, and its control: the same estimator over random strata of the same sizes
DEFAULT_ARMS = "grpo,sgrpo:0.8,random:0.8"

# The CPU study (``sgrpo_vs_grpo.py --cpu REGIME``): a seed of 3 arms x 20 steps of 32 trajectories
# (4 prompts x 8 samples, the paper's group size), EM reward (the paper's), search only, no held-out
# evaluation before the warm-up (SmolLM2 scores 0 there: it never writes the tags before it), and a
# warm-up of 32 steps of 4 over 128 demonstrations (each about once): after the demo's 12 over 64 the trap's first seed read
# too poorly to start in the trap (held-out two-hop, sampled: one search EM 0.17, two 0.22; 2026-12-01).
# RL draws only questions the warm-up did not demonstrate: a seed's training EM went 0.06 -> 0.53
# between its first two steps on demonstrated questions while held-out stayed at 0.05 (recall).
CPU_STUDY_STEP = ("--steps", "20", "--prompts-per-step", "4", "--n-samples", "8", "--reward", "em", "--no-sandbox",
                  "--no-eval-before", "--warmup-steps", "32", "--demos", "128", "--fresh-rl-questions")
# ... and its update: every item computes the update it replaces (tests/test_update_shortcuts.py),
# measured by bench/study_step_cost.py. No gradient checkpointing (SmolLM2's activations for 4 rows
# of ~500 tokens fit), a prompt group's prompt run once, no pass over zero-advantage samples, and
# the warm-up 4 rows at a time.
CPU_STUDY_UPDATE = ("--no-gradient-checkpointing", "--shared-prefix", "--skip-zero-advantage",
                    "--micro-batch-size", "4", "--warmup-micro-batch", "4")


def cpu_study_flags(regime: str) -> list[str]:
    """The demo flags of a CPU study seed on ``regime`` (the demo's ``--task``)."""
    return [*CPU_STUDY_STEP, *CPU_STUDY_UPDATE, "--task", regime]


def write_session(out: Path, argv: list[str], session: str, environment: dict | None, seeds: list[int],
                  failed: dict[str, int], seed_folders: list[Path]) -> Path:
    """``OUT/study.json``: the session's argv, machine, finished seeds and their folders, and the
    processes that failed (name -> exit status; -1: never started)."""
    path = Path(out) / "study.json"
    path.write_text(json.dumps({"argv": argv, "session": session, "environment": environment,
                                "seeds": sorted(seeds), "seed_folders": [str(f) for f in seed_folders],
                                "failed": failed}, indent=1) + "\n")
    return path
