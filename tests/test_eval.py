"""``python -m openrlhf_sgrpo.eval`` end to end: a real QA sample from ../shared/data plus the GAIA
fixture, one call, real retriever (MiniLM over a small real corpus) and real sandbox; then the
same call again resumes (every id is already answered, nothing is re-run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from openrlhf_sgrpo.assets import shared_data
from openrlhf_sgrpo.eval.__main__ import main
from openrlhf_sgrpo.inspect.report import write_report
from openrlhf_sgrpo.rollout_records.store import read_step_file, step_path

pytestmark = pytest.mark.slow
FIXTURE = Path(__file__).parent / "fixtures" / "gaia" / "metadata.jsonl"


def _small_corpus(questions: list[dict], out: Path, distractors: int = 12) -> Path:
    """The supporting passages of ``questions`` plus a few others from HotpotQA's own corpus."""
    wanted = {t for q in questions for t in q["supporting_titles"]}
    rows, others = [], []
    for line in shared_data("hotpotqa", "corpus_hipporag100.jsonl").read_text().splitlines():
        row = json.loads(line)
        title = row["contents"].split("\n", 1)[0].strip().strip('"')
        (rows if title in wanted else others).append(row)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows + others[:distractors]))
    return out


@pytest.mark.shared_data
def test_qa_and_gaia_tables_then_resume(tmp_path, capsys):
    qa = shared_data("hotpotqa", "train_hipporag100.jsonl")
    if not qa.exists():
        pytest.skip("../shared/data absent: the HotpotQA sample lives outside the repo")
    questions = [json.loads(line) for line in qa.read_text().splitlines()[:3]]
    corpus = _small_corpus(questions, tmp_path / "corpus.jsonl")
    out = tmp_path / "eval"
    argv = ["--model", "tiny-qwen2", "--corpus", str(corpus), "--data", f"hotpotqa={qa}", "--limit", "3",
            "--gaia", str(FIXTURE), "--max-len", "1024", "--max-tokens-per-turn", "12", "--max-turns", "2",
            "--out", str(out), "--quiet"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "| hotpotqa " in text and "search calls/q" in text
    assert "accuracy" in text and "| 1 " in text and "| 3 " in text and "| all " in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["qa"]["hotpotqa"]["n"] == 3
    assert {k: v["n"] for k, v in summary["gaia"].items()} == {"1": 2, "2": 2, "3": 1, "all": 5}
    preds = (out / "predictions.jsonl").read_text().splitlines()
    assert len(preds) == 8
    assert all({"id", "em", "f1", "search_calls", "prediction"} <= json.loads(p).keys() for p in preds)
    # every trajectory is also a rollout record (one group of n=1), in the dataset's order
    groups = read_step_file(step_path(out, "eval", 0)).groups
    by_dataset = {name: [g for g in groups if g["dataset"] == name] for name in ("hotpotqa", "gaia")}
    assert sorted(g["prompt_id"] for g in by_dataset["hotpotqa"]) == sorted(q["id"] for q in questions)
    assert len(by_dataset["gaia"]) == 5 and all(g["n"] == 1 for g in groups)
    assert sorted(g["group"] for g in by_dataset["gaia"]) == list(range(5))
    assert f"python -m openrlhf_sgrpo.inspect {out}" in text
    report, warnings = write_report(out)
    assert report.stat().st_size > 0 and warnings == []

    assert main(argv) == 0  # resume: every id is done, nothing is appended
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 8
    assert len(read_step_file(step_path(out, "eval", 0)).groups) == 8
