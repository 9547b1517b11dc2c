"""The demo's ``--smoke`` mode end to end (tiny Qwen2, real index/retriever/sandbox, 2 steps), its
resume, and its argument errors. The full demo is not run here (about 15 minutes)."""

from __future__ import annotations

import json

import pytest

from openrlhf_sgrpo.demo.__main__ import main, parse_args
from openrlhf_sgrpo.local.metrics_log import read_metrics


@pytest.mark.slow
def test_smoke_demo_writes_report_and_resumes(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["--smoke", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    for stage in range(1, 8):
        assert f"[{stage}/7]" in text
    assert "held-out metric" in text and "search calls / question" in text and "strata/prompt" in text
    assert (out / "report.png").stat().st_size > 10_000
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl", "train")] == [1, 2]
    assert len(read_metrics(out / "metrics.jsonl", "eval_before")) == 1
    preds = [json.loads(line) for line in (out / "eval_predictions.jsonl").read_text().splitlines()]
    assert sorted({p["dataset"] for p in preds}) == ["after", "before", "warmup"] and len(preds) == 12
    assert "after warm-up" in text and "after RL" in text
    assert len(read_metrics(out / "metrics.jsonl", "eval_warmup")) == 1

    assert main(["--smoke", "--out", str(out), "--resume", "--steps", "3"]) == 0
    text = capsys.readouterr().out
    assert "resumed at step 2" in text and "after warm-up" in text  # the recorded warm-up column is reused
    assert len(read_metrics(out / "metrics.jsonl", "eval_warmup")) == 1  # and not re-evaluated
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl", "train")] == [1, 2, 3]


@pytest.mark.parametrize("argv, message", [
    (["--n-samples", "1"], "--n-samples must be >= 2"),
    (["--steps", "0"], "--steps must be >= 1"),
    (["--resume"], "--resume needs --out"),
    (["--data", "x.jsonl"], "--data needs the corpus"),
    (["--heldout", "10", "--max-questions", "5"], "must exceed --heldout"),
])
def test_bad_flags_are_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert message in capsys.readouterr().err


def test_existing_run_folder_needs_resume(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    assert main(["--smoke", "--out", str(tmp_path)]) == 2
    assert "pass --resume" in capsys.readouterr().err


@pytest.mark.slow
def test_smoke_demo_on_a_multi_hop_set_with_its_own_corpus(tmp_path, capsys):
    """`--data` + `--corpus`: the demo on ../shared's HotpotQA sample and the corpus it comes with."""
    from openrlhf_sgrpo.assets import shared_data

    qa, corpus = shared_data("hotpotqa", "train_hipporag100.jsonl"), shared_data("hotpotqa", "corpus_hipporag100.jsonl")
    if not (qa.exists() and corpus.exists()):
        pytest.skip("../shared/data absent: the HotpotQA sample and its corpus live outside the repo")
    out = tmp_path / "run"
    assert main(["--smoke", "--data", str(qa), "--corpus", str(corpus), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "[7/7]" in text and "held-out metric" in text
    preds = [json.loads(line) for line in (out / "eval_predictions.jsonl").read_text().splitlines()]
    held = {p["id"] for p in preds if p["dataset"] == "after"}
    first = [json.loads(line)["id"] for line in qa.read_text().splitlines()[:4]]
    assert held == set(first)  # the first --heldout questions of the file are held out
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl", "train")] == [1, 2]
