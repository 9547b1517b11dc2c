"""Host side of `sandbox_init.py`, the program that runs inside the sandbox beside the code: its
command lines, and reading what it reports (the local init's report, the fetched files).

What it writes can only be the run's own status and files, so reading it needs no trust beyond a
size cap and a shape check.
"""

from __future__ import annotations

import binascii
import json
from dataclasses import dataclass
from pathlib import Path

from .api import MAX_FETCH_BYTES

SOURCE = Path(__file__).with_name("sandbox_init.py").read_text()
# base64 grows 4/3, plus JSON quoting of the names: what a full answer may take on the wire
ANSWER_CAP = MAX_FETCH_BYTES * 4 // 3 + (256 << 10)
STARTED = "started"


def collect_command(python: str, names: tuple[str, ...]) -> list[str]:
    """Run after the program: prints the JSON answer on stdout."""
    return [python, "-I", "-S", "-c", SOURCE, "fetch", str(MAX_FETCH_BYTES), *names]


def init_command(python: str, out_fd: int, timeout: float, names: tuple[str, ...], program: list[str]) -> list[str]:
    """pid 1 of a local run: starts `program` (which never holds `out_fd`), ends it at `timeout`
    seconds, reports on `out_fd`."""
    return [python, "-I", "-S", "-c", SOURCE, "init", str(out_fd), repr(timeout), str(MAX_FETCH_BYTES), *names,
            "--", *program]


@dataclass
class InitReport:
    """What the local init reported; `returncode` is None when it said nothing usable about the program."""

    started: bool = False  # the init ran (its first line came before the program existed)
    ended: bool = False  # it reported how the program ended: by itself (returncode) or at the deadline
    returncode: int | None = None  # -N for a death by signal N, as asyncio reports it
    timed_out: bool = False  # the init killed the run at its deadline
    spawn_error: str | None = None
    answer: str = ""  # the JSON line, for read_answer when files were fetched


def read_init_report(raw: bytes) -> InitReport:
    first, _, rest = raw.decode(errors="replace").partition("\n")
    report = InitReport(started=first == STARTED)
    if not report.started:
        return report
    try:
        doc = json.loads(rest)
    except (ValueError, RecursionError):
        return report
    if not isinstance(doc, dict):
        return report
    if isinstance(doc.get("spawn_error"), str):
        report.spawn_error = doc["spawn_error"]
    elif doc.get("timed_out") is True:
        report.ended, report.timed_out, report.answer = True, True, rest
    elif type(doc.get("returncode")) is int:
        report.ended, report.returncode, report.answer = True, doc["returncode"], rest
    return report


def read_answer(raw: bytes | str, names: tuple[str, ...]) -> tuple[dict[str, str], list[str]]:
    """(files as base64, notes for the response message) from the collector's output; only the
    names the request asked for are kept."""
    try:
        doc = json.loads(raw)
        files, omitted = doc["files"], doc["omitted"]
        if not (isinstance(files, dict) and isinstance(omitted, list)):
            raise TypeError("files/omitted have the wrong type")
        for name, content in files.items():
            if not isinstance(content, str):
                raise TypeError(f"{name!r} is not base64 text")
            binascii.a2b_base64(content)
    except (ValueError, KeyError, TypeError, RecursionError, binascii.Error) as err:
        return {}, [f"fetch_files: the run's file listing was unreadable ({type(err).__name__}); no file returned"]
    notes = [f"fetch_files: {name!r} omitted, over the {MAX_FETCH_BYTES}-byte limit on fetched files"
             for name in names if name in omitted]
    return {name: files[name] for name in names if name in files}, notes
