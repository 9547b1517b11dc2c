"""Fast checks of the evaluation CLI's inputs and outputs (no model, no servers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from openrlhf_sgrpo.eval.__main__ import _by_level, main, parse_args
from openrlhf_sgrpo.eval.core import summarize
from openrlhf_sgrpo.eval.gaia import load_gaia
from openrlhf_sgrpo.eval.table import qa_table
from openrlhf_sgrpo.local.data import DataError, load_flashrag_jsonl

FIXTURE = Path(__file__).parent / "fixtures" / "gaia" / "metadata.jsonl"


def test_flashrag_loader_reads_rows_and_names_bad_lines(tmp_path):
    good = tmp_path / "d.jsonl"
    good.write_text('{"id": "a", "question": "Q?", "golden_answers": ["x", "y"]}\n\n'
                    '{"id": "b", "question": "R?", "golden_answers": "z"}\n')
    qs = load_flashrag_jsonl(good)
    assert [(q.qid, q.golds) for q in qs] == [("a", ["x", "y"]), ("b", ["z"])]
    assert len(load_flashrag_jsonl(good, limit=1)) == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "question": "Q?"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:1: missing \['golden_answers'\]"):
        load_flashrag_jsonl(bad)
    with pytest.raises(DataError, match="not found"):
        load_flashrag_jsonl(tmp_path / "nope.jsonl")


def test_gaia_fixture_levels_and_attached_file():
    qs, levels = load_gaia(FIXTURE)
    assert len(qs) == 5 and sorted(set(levels.values())) == ["1", "2", "3"]
    with_file = [q for q in qs if "Attached file:" in q.question]
    assert len(with_file) == 1 and with_file[0].question.endswith("fruit_counts.csv")
    assert Path(with_file[0].question.rsplit(": ", 1)[1]).exists()


def test_by_level_accuracy():
    recs = [{"id": "a", "score": 1.0, "search_calls": 1, "code_calls": 0},
            {"id": "b", "score": 0.0, "search_calls": 0, "code_calls": 2},
            {"id": "c", "score": 1.0, "search_calls": 2, "code_calls": 0}]
    out = _by_level(recs, {"a": "1", "b": "1", "c": "2"})
    assert out["1"]["accuracy"] == 0.5 and out["2"]["accuracy"] == 1.0
    assert out["all"]["n"] == 3 and list(out)[-1] == "all"


def test_summary_and_table():
    s = summarize([{"em": 1.0, "f1": 1.0, "score": 1.0, "search_calls": 2},
                   {"em": 0.0, "f1": 0.5, "score": 0.0, "search_calls": 0}])
    assert s["n"] == 2 and s["em"] == 0.5 and s["f1"] == 0.75 and s["search_calls"] == 1.0
    table = qa_table({"nq": s})
    assert "| nq " in table and "0.750" in table
    assert summarize([])["n"] == 0


@pytest.mark.parametrize("argv, message", [
    (["--corpus", "c.jsonl"], "name at least one dataset"),
    (["--data", "x.jsonl"], "name a retriever"),
    (["--data", "x.jsonl", "--corpus", "c", "--limit", "0"], "--limit must be >= 1"),
    (["--data", "x.jsonl", "--corpus", "c", "--concurrency", "0"], "--concurrency must be >= 1"),
    (["--data", "x.jsonl", "--corpus", "c", "--engine", "vllm", "--gpu-memory-utilization", "1.5"],
     "--gpu-memory-utilization must be in (0, 1], got 1.5"),
    (["--data", "x.jsonl", "--corpus", "c", "--engine", "sglang"], "invalid choice: 'sglang'"),
])
def test_bad_arguments_are_named(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_missing_dataset_file_is_a_clear_error(tmp_path, capsys):
    assert main(["--data", str(tmp_path / "missing.jsonl"), "--retriever-url", "http://127.0.0.1:9/retrieve",
                 "--out", str(tmp_path / "o")]) == 2
    assert "dataset file not found" in capsys.readouterr().err


def test_vllm_engine_without_vllm_is_a_clear_error(tmp_path):
    """This machine has no vLLM: the CLI must say so (exit 2) before loading a model or a server.

    A fresh interpreter, so no test's import stubs for vllm can make it look installed.
    """
    import subprocess
    import sys

    data = tmp_path / "d.jsonl"
    data.write_text('{"id": "a", "question": "Q?", "golden_answers": ["x"]}\n')
    proc = subprocess.run([sys.executable, "-m", "openrlhf_sgrpo.eval", "--engine", "vllm", "--data", str(data),
                           "--retriever-url", "http://127.0.0.1:9/retrieve", "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "--engine vllm needs vLLM" in proc.stderr and "--engine hf" in proc.stderr
