"""Fast checks of the evaluation CLI's inputs and outputs (no model, no servers)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from peer_rules import official_gaia_question_scorer

from agent_env.config import config_from_dict
from agent_env.episode import Episode
from agent_env.rewards import parse_golds
from openrlhf_sgrpo.engine import KERNEL_ISAS
from openrlhf_sgrpo.eval.__main__ import _by_level, main, parse_args
from openrlhf_sgrpo.eval.core import summarize
from openrlhf_sgrpo.eval.gaia import load_gaia
from openrlhf_sgrpo.eval.table import qa_table
from openrlhf_sgrpo.local.data import DataError, load_flashrag_jsonl
from openrlhf_sgrpo.local.rollout import label_of

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


# (Final answer, prediction, official question_scorer's verdict): golds with `$ % ,` and lists of
# numbers, where a scorer that also normalizes the gold would differ.
GAIA_SCORING = [("391", "391", 1.0), ("$1,000", "1000", 0.0), ("$1,000", "$1,000", 1.0), ("12.5%", "125", 1.0),
                ("12.5%", "12.5", 1.0), ("2, 3, 5", "2,3,5", 1.0), ("10%, 20%", "10, 20", 0.0),
                ("1.5", "$1.50", 1.0), ("Salzburg", "salzburg.", 1.0)]


def test_gaia_answers_score_as_the_official_scorer_through_loader_and_episode(tmp_path):
    """metadata.jsonl → load_gaia → the rollout's label → the episode's reward: the official verdict."""
    meta = tmp_path / "metadata.jsonl"
    meta.write_text("".join(json.dumps({"task_id": f"t{i}", "Question": "Q?", "Level": 1, "Final answer": gold,
                                        "file_name": ""}) + "\n" for i, (gold, _, _) in enumerate(GAIA_SCORING)))
    questions, _ = load_gaia(meta)
    official = official_gaia_question_scorer()
    cfg = config_from_dict({"reward": "gaia", "template": "deep_research"})
    for q, (gold, pred, verdict) in zip(questions, GAIA_SCORING):
        episode = Episode(cfg, tools=None, golds=parse_golds(label_of(q.golds)), truncate=lambda t: t)
        outcome = asyncio.run(episode.step(f"<think>done</think><answer>{pred}</answer>"))
        assert (outcome.done, outcome.score, outcome.reward) == (True, verdict, verdict), (gold, pred)
        if official is not None:  # installed test dependency (requirements-nodeps.txt)
            assert float(official(pred, gold)[0]) == verdict, (gold, pred)


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
    """Where vLLM cannot be imported, ``--engine vllm`` says so (exit 2) before loading a model or a
    server, and ``--engine auto`` would fall back to HF. A fresh interpreter in which ``import vllm``
    fails, as on a machine without it."""
    import subprocess
    import sys

    data = tmp_path / "d.jsonl"
    data.write_text('{"id": "a", "question": "Q?", "golden_answers": ["x"]}\n')
    argv = ["--engine", "vllm", "--data", str(data), "--retriever-url", "http://127.0.0.1:9/retrieve",
            "--out", str(tmp_path / "o")]
    code = ("import sys; sys.modules['vllm'] = None\n"
            "from openrlhf_sgrpo.engine import resolve_engine\n"
            "name, note = resolve_engine('auto'); assert name == 'hf' and 'not installed' in note, (name, note)\n"
            "from openrlhf_sgrpo.eval.__main__ import main\n"
            f"sys.exit(main({argv!r}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "--engine vllm: vLLM is not installed" in proc.stderr and "--engine hf" in proc.stderr


_XEON_AMX = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu sse2 avx avx2 avx512f avx512bw avx512_bf16 amx_bf16 amx_tile amx_int8

processor\t: 1
model name\t: another name, never read
flags\t\t: fpu
"""


@pytest.mark.parametrize("cpuinfo, name, isa, vllm_runs", [
    (_XEON_AMX, "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz",
     "avx2 avx512f avx512_bf16 amx_bf16 amx_tile", True),
    ("model name : AMD EPYC 7B13\nflags : fpu avx avx2 fma\n", "AMD EPYC 7B13", "avx2", True),
    ("model name : QEMU Virtual CPU\nflags : fpu sse2\n", "QEMU Virtual CPU",
     "none of " + " ".join(KERNEL_ISAS), False),
])
def test_processor_names_the_isas_that_pick_the_kernels(tmp_path, monkeypatch, cpuinfo, name, isa, vllm_runs):
    """Run records and test logs name the processor and the ISAs by which torch and vLLM's CPU build
    choose kernels (the first processor's lines); one without AVX2/AVX-512 is why vLLM cannot run."""
    import platform

    import openrlhf_sgrpo.engine as engine

    (tmp_path / "cpuinfo").write_text(cpuinfo)
    monkeypatch.setattr(engine, "_CPUINFO", tmp_path / "cpuinfo")
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    found = engine.processor()
    assert found["processor"] == name and found["cpu_isa"] == isa, found
    reason = engine.vllm_unavailable_reason() or ""
    assert ("neither AVX2 nor AVX-512" in reason) != vllm_runs, reason
