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


def write_session(out: Path, argv: list[str], session: str, environment: dict | None, seeds: list[int],
                  failed: dict[str, int], seed_folders: list[Path]) -> Path:
    """``OUT/study.json``: the session's argv, machine, finished seeds and their folders, and the
    processes that failed (name -> exit status; -1: never started)."""
    path = Path(out) / "study.json"
    path.write_text(json.dumps({"argv": argv, "session": session, "environment": environment,
                                "seeds": sorted(seeds), "seed_folders": [str(f) for f in seed_folders],
                                "failed": failed}, indent=1) + "\n")
    return path
