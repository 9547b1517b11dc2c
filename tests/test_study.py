"""The GPU study script (examples/study/sgrpo_vs_grpo.py) run tiny on a CPU: two seeds, GRPO and
Stratified GRPO from each seed's one warm-up, aggregated into one table, one plot and a JSON with
the environment. A check of the plumbing (tiny random Qwen2, --smoke), not a result."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from openrlhf_sgrpo.demo.study import study_table, summarize
from openrlhf_sgrpo.engine import processor
from openrlhf_sgrpo.testing import shifted_seed

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "study" / "sgrpo_vs_grpo.py"


def load_script():
    spec = importlib.util.spec_from_file_location("sgrpo_vs_grpo", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_result(em2: float, reward: float) -> dict:
    after = {"hop1/em": 1.0, "hop2/em": em2, "hop2/f1": em2, "hop2/search_calls": 2.0,
             "hop2/two_search_share": 1.0, "answered": 1.0}
    return {"arms": {"GRPO": after}, "steps": {"GRPO": [{"step": 1, "reward": reward}]}, "after_warmup": None}


def test_summary_is_mean_and_population_std_over_seeds():
    s = summarize({0: fake_result(0.25, 0.5), 1: fake_result(0.75, 0.7)})["GRPO"]
    assert s["seeds"] == 2
    assert s["hop2/em"] == pytest.approx((0.5, 0.25)) and s["final_reward"] == pytest.approx((0.6, 0.1))
    assert "0.500 ± 0.250" in study_table({"GRPO": s})


@pytest.mark.slow
def test_study_runs_seeds_times_arms_and_writes_one_table_and_one_plot(tmp_path, capsys, monkeypatch):
    """Run with --no-sandbox as the lent GPU machine runs it: that image has no bubblewrap, so the
    local sandbox cannot start there (2026-11-27, H100); here starting one fails the test."""
    from sandbox.process import SandboxProcess

    def no_bubblewrap(self):
        raise AssertionError("the study started a sandbox despite --no-sandbox")

    monkeypatch.setattr(SandboxProcess, "__enter__", no_bubblewrap)
    out = tmp_path / "study"
    seeds = [str(shifted_seed(0)), str(shifted_seed(1))]
    assert load_script().main(["--out", str(out), "--smoke", "--seeds", *seeds, "--arms", "grpo,sgrpo:1.0",
                               "--", "--steps", "1", "--no-sandbox"]) == 0
    text = capsys.readouterr().out
    assert "sandbox   not started (--no-sandbox)" in text
    table = (out / "study_table.md").read_text()
    assert table.strip() in text
    for row in ("GRPO", "Stratified GRPO (alpha 1)", "after warm-up (start)"):
        assert f"| {row} " in table
    assert (out / "study.png").stat().st_size > 10_000
    study = json.loads((out / "study.json").read_text())
    assert study["environment"]["device"] == "cpu" and study["environment"]["torch"]
    assert {k: study["environment"][k] for k in ("processor", "cpu_isa")} == processor()
    assert sorted(study["per_seed"]) == sorted(seeds)
    for seed in seeds:  # each seed: its own demo run, both arms from the same warm-up
        folder = out / f"seed_{seed}"
        assert (folder / "grpo" / "metrics.jsonl").exists() and (folder / "sgrpo_a1" / "metrics.jsonl").exists()
        assert set(study["per_seed"][seed]["arms"]) == {"GRPO", "Stratified GRPO (alpha 1)"}
    for label, s in study["summary"].items():
        assert s["seeds"] == 2 and not math.isnan(s["hop2/em"][0]), label


def test_bad_arms_are_named(capsys):
    from openrlhf_sgrpo.demo.options import parse_args

    for bad in ("sgrpo", "sgrpo:2", "ppo", "grpo,grpo"):
        with pytest.raises(SystemExit):
            parse_args(["--arms", bad])
        assert "--arms" in capsys.readouterr().err
