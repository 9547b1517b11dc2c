"""GAIA's ``metadata.jsonl`` (``task_id, Question, Level, Final answer, file_name``) → questions.

GAIA tasks may attach a file; its path (next to ``metadata.jsonl``) is named in the question so
the agent can open it from a ``<code>`` block. Questions are never stored in this project: point
``--gaia`` at your own copy of the dataset.
"""

from __future__ import annotations

import json
from pathlib import Path

from openrlhf_sgrpo.local.data import DataError, Question

GAIA_KEYS = ("task_id", "Question", "Level", "Final answer")


def load_gaia(metadata: str | Path) -> tuple[list[Question], dict[str, str]]:
    """(questions, level by task id) from a GAIA ``metadata.jsonl``."""
    path = Path(metadata)
    if not path.is_file():
        raise DataError(f"GAIA metadata file not found: {path}")
    questions, levels = [], {}
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}:{line_no}: not JSON ({err.msg})") from None
        missing = [k for k in GAIA_KEYS if k not in row]
        if missing:
            raise DataError(f"{path}:{line_no}: missing GAIA fields {missing}")
        text = str(row["Question"])
        if row.get("file_name"):
            text += f"\nAttached file: {(path.parent / row['file_name']).resolve()}"
        qid = str(row["task_id"])
        questions.append(Question(qid, text, [str(row["Final answer"])]))
        levels[qid] = str(row["Level"])
    return questions, levels
