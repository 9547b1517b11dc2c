"""Search-R1's parquet files (``train.parquet``, ``test.parquet`` of its data scripts) -> our rows.

Why: a Search-R1 user already has these files (``scripts/data_process/qa_search_*_merge.py``
writes them: FlashRAG's ``id``, ``question`` and ``golden_answers`` plus ``data_source``,
``prompt`` = ``[{"role": "user", "content": ...}]``, ``reward_model.ground_truth.target`` and
``extra_info.index``). Our rows are what ``examples/data/prepare_qa.py qa`` writes and the launch
scripts read (``--data.input_key prompt --data.label_key answers``):
``{"prompt", "answers", "datasource", "id", "question"}``. The prompt is rendered again from the
raw question with our template, so it is the agent's own wording (for ``search_r1_base`` the same
text as Search-R1's base prefix).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

from agent_env.templates import build_prompt

QUESTION_MARK = "Question: "  # Search-R1's prefix ends with "Question: {question}\n"


class SearchR1DataError(ValueError):
    """A parquet file or row that is not in Search-R1's layout; the message names what is missing."""


def _question_of(row: Mapping, where: str) -> str:
    question = row.get("question")
    if isinstance(question, str) and question.strip():
        return question.strip()
    prompt = row.get("prompt")
    if prompt is not None and len(prompt) and isinstance(prompt[-1], Mapping):  # the prefix's tail
        content = str(prompt[-1].get("content", ""))
        if QUESTION_MARK in content:
            return content.rsplit(QUESTION_MARK, 1)[1].strip()
    raise SearchR1DataError(f"{where}: no 'question' column and no 'Question: ...' in the prompt")


def _answers_of(row: Mapping, where: str) -> list[str]:
    ground = (row.get("reward_model") or {}).get("ground_truth") or {}
    target = ground.get("target") if isinstance(ground, Mapping) else None
    if target is None:
        target = row.get("golden_answers")
    if target is None:
        raise SearchR1DataError(f"{where}: no reward_model.ground_truth.target and no 'golden_answers'")
    answers = [target] if isinstance(target, str) else [str(a) for a in list(target)]
    if not answers:
        raise SearchR1DataError(f"{where}: the gold answer list is empty")
    return answers


def convert_row(row: Mapping, where: str, template: str = "search_r1_base") -> dict:
    """One Search-R1 row as our prompt row (``where`` names it in errors: file and row number)."""
    question = _question_of(row, where)
    source = str(row.get("data_source") or "searchr1")
    index = (row.get("extra_info") or {}).get("index")
    qid = row.get("id") or f"{source}_{index if index is not None else where.rsplit(' ', 1)[-1]}"
    return {"prompt": build_prompt(template, question), "answers": _answers_of(row, where),
            "datasource": source, "id": str(qid), "question": question}


def read_parquet_rows(path: str | Path) -> Iterator[dict]:
    """Rows of a parquet file as plain dicts, one row group at a time (a 170k-row train file is small,
    but the test sets are read the same way)."""
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise SearchR1DataError(f"{path} does not exist")
    try:
        f = pq.ParquetFile(path)
    except Exception as err:  # pyarrow raises its own ArrowInvalid for a file that is not parquet
        raise SearchR1DataError(f"{path} is not a parquet file: {err}") from err
    for g in range(f.num_row_groups):
        yield from f.read_row_group(g).to_pylist()


def convert_parquet(path: str | Path, template: str = "search_r1_base") -> list[dict]:
    """Every row of a Search-R1 parquet file as our prompt rows, in the file's order."""
    return [convert_row(row, f"{path} row {i}", template) for i, row in enumerate(read_parquet_rows(path))]
