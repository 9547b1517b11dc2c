"""Where rollout records live in a run folder, how they are written, and how they are read back.

Layout: ``RUN_DIR/rollouts/<phase>/step_<step:06d>.jsonl``, one group record per line
(``phase`` is ``train``, ``eval``, ``eval_before``...). Two ways to write:

- :meth:`RolloutWriter.write_step` writes a whole step at once through a temporary file and an
  atomic rename: a crash leaves the previous file or the new one, never half of it, and a
  resumed run that redoes a step replaces that step's records instead of doubling them.
- :meth:`RolloutWriter.append` adds groups as they finish (evaluation, one question at a time).
  A crash can leave a torn last line: readers skip a final line without its newline, and the
  next ``append`` to that file cuts it off first.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from openrlhf_sgrpo.rollout_records.build import SCHEMA_VERSION

ROLLOUTS_DIR = "rollouts"
_PHASE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_STEP_FILE = re.compile(r"step_(\d+)\.jsonl")


class RecordError(ValueError):
    """A rollout record file that cannot be read; the message names the file and line."""


def check_phase(phase: str) -> str:
    if not isinstance(phase, str) or not _PHASE.fullmatch(phase):
        raise ValueError(f"phase must be a folder-safe name like 'train' or 'eval_before', got {phase!r}")
    return phase


def step_path(run_dir: str | Path, phase: str, step: int) -> Path:
    if int(step) < 0:
        raise ValueError(f"step must be >= 0, got {step!r}")
    return Path(run_dir) / ROLLOUTS_DIR / check_phase(phase) / f"step_{int(step):06d}.jsonl"


def _lines(groups: Iterable[dict]) -> str:
    # allow_nan=False: a NaN would make the line unreadable for JSON.parse in the report
    return "".join(json.dumps(g, ensure_ascii=False, allow_nan=False, separators=(",", ":")) + "\n"
                   for g in groups)


def _cut_torn_tail(path: Path) -> None:
    """Drop a last line that a crash left without its newline."""
    with open(path, "rb+") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        if size == 0:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        pos = size
        while pos > 0:
            chunk = min(65536, pos)
            f.seek(pos - chunk)
            block = f.read(chunk)
            cut = block.rfind(b"\n")
            if cut >= 0:
                f.truncate(pos - chunk + cut + 1)
                return
            pos -= chunk
        f.truncate(0)


class RolloutWriter:
    """Writes group records under ``run_dir/rollouts``; one writer per process."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self._checked: set[Path] = set()

    def write_step(self, phase: str, step: int, groups: Iterable[dict]) -> Path:
        """All groups of one step, atomically (replaces an earlier file of the same step)."""
        path = step_path(self.run_dir, phase, step)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(_lines(groups))
        os.replace(tmp, path)
        self._checked.add(path)
        return path

    def append(self, phase: str, step: int, groups: Iterable[dict]) -> Path:
        """Add groups to a step's file (created when missing) with one write, then flush."""
        path = step_path(self.run_dir, phase, step)
        if path not in self._checked:
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists():
                _cut_torn_tail(path)
            self._checked.add(path)
        with open(path, "a", encoding="utf-8") as f:
            f.write(_lines(groups))
        return path


@dataclass
class StepFile:
    phase: str
    step: int
    path: Path


@dataclass
class ReadResult:
    groups: list[dict]  # the rows (group records for step files)
    warnings: list[str] = field(default_factory=list)


def list_step_files(run_dir: str | Path) -> list[StepFile]:
    """Every ``rollouts/<phase>/step_*.jsonl`` of a run, by phase then step."""
    root = Path(run_dir) / ROLLOUTS_DIR
    out = []
    if not root.is_dir():
        return out
    for phase_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for path in phase_dir.iterdir():
            m = _STEP_FILE.fullmatch(path.name)
            if m:
                out.append(StepFile(phase_dir.name, int(m.group(1)), path))
    return sorted(out, key=lambda s: (s.phase, s.step))


def read_jsonl(path: str | Path, what: str = "record", check=None) -> ReadResult:
    """JSON objects of every complete line of ``path``. A last line without its newline (a write
    cut short) is skipped with a warning; any other bad line raises :class:`RecordError` naming
    ``path:line``. ``check(where, row)`` may reject a row the same way."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise RecordError(f"{path}: cannot read ({err.strerror or err})") from err
    result = ReadResult([])
    lines = data.split(b"\n")
    for number, raw in enumerate(lines[:-1], start=1):
        if not raw.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise RecordError(f"{where}: not a JSON {what} ({err})") from None
        if not isinstance(row, dict):
            raise RecordError(f"{where}: expected a JSON object, got {type(row).__name__}")
        if check is not None:
            check(where, row)
        result.groups.append(row)
    if lines[-1].strip():
        result.warnings.append(f"{path}:{len(lines)}: skipped an incomplete last line "
                               f"({len(lines[-1])} bytes without a newline: a write cut short)")
    return result


def read_step_file(path: str | Path) -> ReadResult:
    """Group records of one step file (see :func:`read_jsonl` for torn and bad lines)."""
    return read_jsonl(path, "record", _check_group)


def _check_group(where: str, record: dict) -> None:
    version = record.get("schema_version")
    if not isinstance(version, int):
        raise RecordError(f"{where}: no integer schema_version (not a rollout record?)")
    if version > SCHEMA_VERSION:
        raise RecordError(f"{where}: schema_version {version} is newer than this reader's {SCHEMA_VERSION}; "
                          f"update openrlhf-sgrpo")
    samples = record.get("samples")
    if not isinstance(samples, list) or not all(isinstance(s, dict) for s in samples):
        raise RecordError(f"{where}: 'samples' must be a list of objects")
    for key in ("phase", "step", "question"):
        if key not in record:
            raise RecordError(f"{where}: missing field {key!r}")
