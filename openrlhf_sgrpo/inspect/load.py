"""Read a run folder for the report: rollout records per (phase, step) and ``metrics.jsonl``.

Every problem a user can cause (no such folder, no records, a corrupt line) raises
:class:`InspectError` with a message naming the path, so the CLI prints it and exits 2.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from openrlhf_sgrpo.rollout_records.store import (
    ROLLOUTS_DIR,
    RecordError,
    StepFile,
    list_step_files,
    read_jsonl,
    read_step_file,
)

METRICS_FILE = "metrics.jsonl"  # what local/step_log.StepLogger writes


class InspectError(ValueError):
    """Bad input to the inspector; the message names the path (and line) at fault."""


@dataclass
class StepRecords:
    phase: str
    step: int
    groups: list[dict]
    total_groups: int  # before --max-groups cut the list


@dataclass
class RunData:
    run_dir: Path
    steps: list[StepRecords]
    metrics: list[dict]
    warnings: list[str] = field(default_factory=list)


def thin_steps(files: list[StepFile], max_steps: int | None) -> tuple[list[StepFile], int]:
    """At most ``max_steps`` train steps, evenly spaced with the first and last kept; every
    other phase (evaluations) is kept. Returns the kept files and how many were left out."""
    train = [f for f in files if f.phase == "train"]
    if max_steps is None or len(train) <= max_steps:
        return files, 0
    if max_steps < 2:
        keep = {id(train[-1])}
    else:
        picks = {round(i * (len(train) - 1) / (max_steps - 1)) for i in range(max_steps)}
        keep = {id(train[i]) for i in picks}
    kept = [f for f in files if f.phase != "train" or id(f) in keep]
    return kept, len(files) - len(kept)


def read_metrics_file(path: Path) -> tuple[list[dict], list[str]]:
    """``metrics.jsonl`` rows and warnings (a torn last line); a bad line names ``path:line``."""
    if not path.exists():
        return [], []
    try:
        result = read_jsonl(path, "metrics record")
    except RecordError as err:
        raise InspectError(str(err)) from None
    return result.groups, result.warnings


def load_run(run_dir: str | Path, max_steps: int | None = None, max_groups: int | None = None,
             progress: bool = True) -> RunData:
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise InspectError(f"run folder {run_dir} does not exist")
    if not run_dir.is_dir():
        raise InspectError(f"{run_dir} is not a folder (give the run folder that holds {ROLLOUTS_DIR}/)")
    files = list_step_files(run_dir)
    if not files:
        raise InspectError(f"no rollout records in {run_dir / ROLLOUTS_DIR} (expected <phase>/step_NNNNNN.jsonl; "
                           f"see docs/inspector.md for how a run writes them)")
    files, dropped = thin_steps(files, max_steps)
    metrics, warnings = read_metrics_file(run_dir / METRICS_FILE)
    data = RunData(run_dir, [], metrics, warnings)
    if dropped:
        data.warnings.append(f"{dropped} train steps left out (--max-steps {max_steps}); evenly spaced steps kept")
    for f in tqdm(files, desc="read rollouts", unit="file", disable=not progress, dynamic_ncols=True):
        try:
            result = read_step_file(f.path)
        except RecordError as err:
            raise InspectError(str(err)) from None
        data.warnings.extend(result.warnings)
        groups = sorted(result.groups, key=lambda g: (g.get("group", 0), str(g.get("prompt_id", ""))))
        total = len(groups)
        if max_groups is not None and total > max_groups:
            groups = groups[:max_groups]
            data.warnings.append(f"{f.path}: showing {max_groups} of {total} groups (--max-groups)")
        data.steps.append(StepRecords(f.phase, f.step, groups, total))
    if not any(s.groups for s in data.steps):
        raise InspectError(f"the rollout files under {run_dir / ROLLOUTS_DIR} hold no records")
    return data
