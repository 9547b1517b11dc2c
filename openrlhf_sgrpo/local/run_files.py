"""Make a run folder agree with the checkpoint a resumed run starts from.

A step writes its ``metrics.jsonl`` line and its rollout records *before* its checkpoint (the
record is the step's result; the checkpoint is written after it, every ``save_every`` steps). A
driver killed with SIGKILL between the two (or between two checkpoints) leaves lines and record
files of steps the checkpoint does not hold, and perhaps a line cut short. The resumed run redoes
those steps, so without this their lines would appear twice and the records would mix two
different rollouts under one step. :func:`forget_steps_after` drops them before the run goes on:
the folder then reads as if the run had stopped right after the checkpoint.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from openrlhf_sgrpo.rollout_records.store import list_step_files

TRAIN_PHASE = "train"


def _complete_lines(data: bytes) -> list[bytes]:
    """The lines a crash left whole: a last line without its newline was cut short."""
    lines = data.split(b"\n")
    return [line for line in lines[:-1] if line.strip()]


def trim_step_log(path: str | Path, last_step: int, phase: str = TRAIN_PHASE) -> int:
    """Rewrite ``metrics.jsonl`` without ``phase`` lines past ``last_step`` and without a torn last
    line (atomically: a second crash leaves the old file or the new one); returns lines dropped."""
    path = Path(path)
    if not path.exists():
        return 0
    data = path.read_bytes()
    complete = _complete_lines(data)
    kept = [line for line in complete
            if not ((row := json.loads(line)).get("phase") == phase and int(row.get("step", 0)) > last_step)]
    torn = bool(data) and not data.endswith(b"\n")
    dropped = len(complete) - len(kept) + int(torn)
    if dropped:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(b"".join(line + b"\n" for line in kept))
        os.replace(tmp, path)
    return dropped


def forget_steps_after(run_dir: str | Path, last_step: int, phase: str = TRAIN_PHASE) -> dict[str, int]:
    """Drop what steps after ``last_step`` left in ``run_dir`` (metrics lines, rollout record
    files of ``phase``); returns how many of each, for the resume message."""
    run_dir = Path(run_dir)
    lines = trim_step_log(run_dir / "metrics.jsonl", last_step, phase)
    files = 0
    for step_file in list_step_files(run_dir):
        if step_file.phase == phase and step_file.step > last_step:
            step_file.path.unlink()
            files += 1
    return {"metrics_lines": lines, "record_files": files}
