"""Questions for training and evaluation, read from FlashRAG-format jsonl files.

FlashRAG (and Search-R1) store one question per line: ``{"id", "question", "golden_answers"}``.
A bad line is reported with its file and line number instead of a KeyError deep in a rollout.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Question:
    qid: str
    question: str
    golds: list[str]


class DataError(ValueError):
    """A dataset file is missing or malformed; the message names the file and line."""


def iter_jsonl_rows(path: str | Path, required: tuple[str, ...], what: str, hint: str) -> Iterator[tuple[int, dict]]:
    """(line number, row) for every non-blank line; a missing file (``what`` names it), a
    non-JSON line or a row without the ``required`` keys (``hint`` says which) raises DataError
    naming the file and the line."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{what} file not found: {path}")
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{path}:{line_no}: not JSON ({err.msg})") from None
            missing = [k for k in required if k not in row]
            if missing:
                raise DataError(f"{path}:{line_no}: missing {missing} ({hint})")
            yield line_no, row


def _question(path: Path, line_no: int, row: dict, golds) -> Question:
    golds = [str(g) for g in golds] if isinstance(golds, list) else [str(golds)]
    return Question(str(row.get("id", f"{path.stem}-{line_no}")), str(row["question"]), golds)


def load_flashrag_jsonl(path: str | Path, limit: int | None = None) -> list[Question]:
    """Questions from a FlashRAG jsonl file (``limit``: the first N lines)."""
    path = Path(path)
    out: list[Question] = []
    for line_no, row in iter_jsonl_rows(path, ("question", "golden_answers"), "dataset",
                                        "FlashRAG rows need id, question, golden_answers"):
        if limit is not None and len(out) >= limit:
            break
        out.append(_question(path, line_no, row, row["golden_answers"]))
    return out


GOLD_KEYS = ("golden_answers", "answers")  # FlashRAG; examples/data/prepare_qa.py's prompt rows


def load_qa_jsonl(path: str | Path) -> dict[str, list[Question]]:
    """Questions of a FlashRAG file or of a prepare_qa.py prompt file, by ``datasource`` ("" when a
    row has none): one test file may hold several benchmarks."""
    path = Path(path)
    out: dict[str, list[Question]] = {}
    for line_no, row in iter_jsonl_rows(path, ("question",), "dataset", "rows need a question"):
        key = next((k for k in GOLD_KEYS if k in row), None)
        if key is None:
            raise DataError(f"{path}:{line_no}: missing the gold answers: {GOLD_KEYS[0]!r} (FlashRAG) or "
                            f"{GOLD_KEYS[1]!r} (prepare_qa.py)")
        out.setdefault(str(row.get("datasource") or ""), []).append(_question(path, line_no, row, row[key]))
    return out
