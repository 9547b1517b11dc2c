"""GAIA's ``metadata.jsonl`` (``task_id, Question, Level, Final answer, file_name``) → questions.

GAIA tasks may attach a file; its path (next to ``metadata.jsonl``) is named in the question so
the agent can open it from a ``<code>`` block. Questions are never stored in this project: point
``--gaia`` at your own copy of the dataset.
"""

from __future__ import annotations

from pathlib import Path

from openrlhf_sgrpo.local.data import Question, iter_jsonl_rows

GAIA_KEYS = ("task_id", "Question", "Level", "Final answer")


def load_gaia(metadata: str | Path) -> tuple[list[Question], dict[str, str]]:
    """(questions, level by task id) from a GAIA ``metadata.jsonl``."""
    path = Path(metadata)
    questions, levels = [], {}
    for _, row in iter_jsonl_rows(path, GAIA_KEYS, "GAIA metadata", f"GAIA fields: {', '.join(GAIA_KEYS)}"):
        text = str(row["Question"])
        if row.get("file_name"):
            text += f"\nAttached file: {(path.parent / row['file_name']).resolve()}"
        qid = str(row["task_id"])
        questions.append(Question(qid, text, [str(row["Final answer"])]))
        levels[qid] = str(row["Level"])
    return questions, levels
