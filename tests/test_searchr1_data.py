"""Search-R1's parquet files -> our prompt rows (``prepare_qa.py searchr1``), the README's "your own
data" route for a Search-R1 user. The file is written in the layout Search-R1's
``scripts/data_process/qa_search_train_merge.py`` produces (FlashRAG columns kept by
``datasets.map``, plus data_source, a chat ``prompt``, ``reward_model.ground_truth.target`` and
``extra_info``), with pyarrow; the output is read back by the loader the runner and the evaluation
use."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from openrlhf_sgrpo.eval.searchr1_data import SearchR1DataError, convert_parquet
from openrlhf_sgrpo.local.data import load_qa_jsonl

REPO = Path(__file__).resolve().parents[1]
# Search-R1's base prefix (make_prefix, template_type 'base'), as that repository writes it.
SEARCH_R1_PREFIX = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you "
    "get new information. After reasoning, if you find you lack some knowledge, you can call a search engine "
    "by <search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>. Question: {question}\n")
ROWS = [("nq", "test_0", "who got the first nobel prize in physics?", ["Wilhelm Conrad Röntgen"]),
        ("hotpotqa", "dev_7", "Which magazine was started first, Arthur's Magazine or First for Women?",
         ["Arthur's Magazine"]),
        ("nq", "test_1", "when was the last time anyone was on the moon?", ["14 December 1972 UTC", "December 1972"])]


def write_searchr1_parquet(path: Path, rows=ROWS, drop: str | None = None) -> None:
    records = []
    for i, (source, qid, question, golds) in enumerate(rows):
        rec = {"id": qid, "question": question, "golden_answers": golds, "data_source": source,
               "prompt": [{"role": "user", "content": SEARCH_R1_PREFIX.format(question=question)}],
               "ability": "fact-reasoning",
               "reward_model": {"style": "rule", "ground_truth": {"target": golds}},
               "extra_info": {"split": "test", "index": i}}
        if drop == "answers":
            rec.pop("golden_answers")
            rec["reward_model"] = {"style": "rule", "ground_truth": {"other": ["x"]}}
        records.append(rec)
    pq.write_table(pa.Table.from_pylist(records), path)


def test_rows_keep_question_answers_source_and_searchr1s_own_prompt(tmp_path):
    path = tmp_path / "test.parquet"
    write_searchr1_parquet(path)
    rows = convert_parquet(path)
    assert [r["id"] for r in rows] == ["test_0", "dev_7", "test_1"]
    assert [r["datasource"] for r in rows] == ["nq", "hotpotqa", "nq"]
    assert rows[2]["answers"] == ["14 December 1972 UTC", "December 1972"]
    for row, (_, _, question, _) in zip(rows, ROWS):
        assert row["question"] == question
        assert row["prompt"] == SEARCH_R1_PREFIX.format(question=question)  # byte for byte Search-R1's


def test_cli_output_is_what_the_runner_and_evaluation_load(tmp_path):
    first, second = tmp_path / "a.parquet", tmp_path / "b.parquet"
    write_searchr1_parquet(first, ROWS[:2])
    write_searchr1_parquet(second, ROWS[2:])
    out = tmp_path / "data" / "train.jsonl"
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "data" / "prepare_qa.py"), "searchr1",
                           "--parquet", str(first), "--parquet", str(second), "--out", str(out)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert f"{out}: 3 rows" in proc.stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert set(rows[0]) == {"prompt", "answers", "datasource", "id", "question"}
    by_source = load_qa_jsonl(out)
    assert sorted(by_source) == ["hotpotqa", "nq"]
    assert [q.golds for q in by_source["hotpotqa"]] == [["Arthur's Magazine"]]


def test_question_comes_from_the_prompt_when_the_column_is_gone(tmp_path):
    path = tmp_path / "bare.parquet"
    q = ROWS[0][2]
    pq.write_table(pa.Table.from_pylist([{
        "data_source": "nq", "prompt": [{"role": "user", "content": SEARCH_R1_PREFIX.format(question=q)}],
        "reward_model": {"style": "rule", "ground_truth": {"target": ["x"]}}, "extra_info": {"index": 5}}]), path)
    (row,) = convert_parquet(path)
    assert row["question"] == q and row["id"] == "nq_5"


def test_bad_files_are_named(tmp_path):
    bad = tmp_path / "no_answers.parquet"
    write_searchr1_parquet(bad, drop="answers")
    with pytest.raises(SearchR1DataError, match=r"no_answers.parquet row 0: no reward_model.ground_truth.target"):
        convert_parquet(bad)
    text = tmp_path / "train.jsonl"
    text.write_text('{"question": "q"}\n')
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "data" / "prepare_qa.py"), "searchr1",
                           "--parquet", str(text), "--out", str(tmp_path / "o.jsonl")],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2 and f"{text} is not a parquet file" in proc.stderr
    with pytest.raises(SearchR1DataError, match="does not exist"):
        convert_parquet(tmp_path / "missing.parquet")


def test_a_flashrag_file_of_your_own(tmp_path):
    """``prepare_qa.py flashrag``: any FlashRAG-format file (the README's "your own data"), named."""
    mine = tmp_path / "my_questions.jsonl"
    mine.write_text('{"id": "a1", "question": "who wrote hamlet", "golden_answers": ["Shakespeare"]}\n'
                    '{"id": "a2", "question": "what is the capital of france", "golden_answers": ["Paris"]}\n')
    out = tmp_path / "train.jsonl"
    script = str(REPO / "examples" / "data" / "prepare_qa.py")
    proc = subprocess.run([sys.executable, script, "flashrag", "--data", f"mine={mine}", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert [q.golds for q in load_qa_jsonl(out)["mine"]] == [["Shakespeare"], ["Paris"]]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "b1", "question": "no answers here"}\n')
    proc = subprocess.run([sys.executable, script, "flashrag", "--data", str(bad), "--out", str(tmp_path / "x.jsonl")],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2 and f"{bad}:1: missing ['golden_answers']" in proc.stderr
