"""Host side of `fetch_collector.py`, which runs inside the sandbox after the program: its source
(the resident runner starts it) and reading its answer, the fetched files.

What it writes can only be the run's own files, so reading it needs no trust beyond a size cap and
a shape check.
"""

from __future__ import annotations

import binascii
import json
from pathlib import Path

from .api import MAX_FETCH_BYTES

SOURCE = Path(__file__).with_name("fetch_collector.py").read_text()
# base64 grows 4/3, plus JSON quoting of the names: what a full answer may take on the wire
ANSWER_CAP = MAX_FETCH_BYTES * 4 // 3 + (256 << 10)


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
