"""The demo's ``--smoke`` mode end to end (tiny Qwen2, the generated task, real index/retriever/
sandbox, expert demonstrations, 2 steps), ``--compare``, resume, and the argument errors. The full
demo is not run here (about 15 minutes).

``--smoke`` scripts the first turn of samples 0-2 of every training group (the gold answer, a
wrong answer, a search), so reward spread and a moving policy hold by construction, whatever the
CPU samples; ``SGRPO_TEST_SEED_SHIFT`` shifts the demo's ``--seed`` (see openrlhf_sgrpo.testing).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inspector_dom import assert_dom_matches, records, set_control

from openrlhf_sgrpo.demo.__main__ import main
from openrlhf_sgrpo.demo.options import parse_args
from openrlhf_sgrpo.demo.synth_task import hop_of_qid
from openrlhf_sgrpo.engine import processor
from openrlhf_sgrpo.inspect.browser import Browser, find_chromium
from openrlhf_sgrpo.local.step_log import read_step_log
from openrlhf_sgrpo.testing import shifted_seed

SEED = ["--seed", str(shifted_seed(0))]
CHROMIUM = find_chromium()


@pytest.mark.slow
def test_smoke_demo_with_calibadv_and_sapo_writes_report_and_resumes(tmp_path, capsys):
    """CalibAdv runs on whole groups (it crashed per micro-batch); with --sapo the demo takes two
    optimizer steps per rollout, and the second sees the ratio to the sampling policy leave 1."""
    out = tmp_path / "run"
    assert main(["--smoke", "--calibadv", "--sapo", "--out", str(out), *SEED]) == 0
    text = capsys.readouterr().out
    for stage in range(1, 8):
        assert f"[{stage}/7]" in text
    assert "held-out metric (4 questions: 2 one-hop, 2 two-hop)" in text
    for row in ("EM two-hop", "searches / question two-hop", "two-search share, two-hop", "answered"):
        assert row in text
    assert "EM 2-hop" in text and "strata/prompt" in text and "expert trajectories" in text
    assert "0 naming a held-out entity" in text  # training searches the train pairs' passages only
    assert "peak RSS MiB" in text and "previous stage peak RSS" in text
    from openrlhf_sgrpo.engine import vllm_unavailable_reason

    engine = "hf" if vllm_unavailable_reason() else "vllm"  # the default, auto, takes vLLM where it runs
    assert f"{engine} engine" in text
    if engine == "vllm":  # every step's update reached the engine before the next rollout
        assert all(r["time/weight_sync_s"] > 0 for r in read_step_log(out / "metrics.jsonl", "train"))
    assert (out / "report.png").stat().st_size > 10_000
    env = json.loads((out / "environment.json").read_text())  # the machine its times come from
    assert {k: env[k] for k in ("processor", "cpu_isa")} == processor() and f"machine: {env['processor']}" in text
    checks = json.loads((out / "task_checks.json").read_text())
    assert checks["recall"]["hop1"] == 1.0 and checks["recall"]["hop2"] == 1.0  # 32 passages, exact names
    assert checks["closed_book_before"]["n"] == 4
    train = read_step_log(out / "metrics.jsonl", "train")
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        assert r["reward_std"] > 0 and r["scripted_samples"] == 6
        assert any(k.startswith("calibadv/") for k in r)
        assert {"sapo/mean_ratio", "sapo/penalized_share", "sapo/term"} <= r.keys()
        first, second = r["updates"]
        assert r["optimizer_steps"] == 2 and first["grad_norm"] > 0
        assert first["log_ratio_max"] < 1e-4, first  # old log-probs are the sampling policy's
        assert second["log_ratio_max"] > 1e-4 and second["sapo/mean_ratio"] != 1.0, second
    assert len(read_step_log(out / "metrics.jsonl", "eval_before")) == 1
    assert read_step_log(out / "metrics.jsonl", "warmup")[0]["trajectories"] > 0
    preds = [json.loads(line) for line in (out / "eval_predictions.jsonl").read_text().splitlines()]
    assert sorted({p["dataset"] for p in preds}) == ["after_step2", "before", "warmup"] and len(preds) == 12
    assert sorted(hop_of_qid(p["id"]) for p in preds if p["dataset"] == "before") == [1, 1, 2, 2]
    assert "after warm-up" in text and "after RL" in text
    assert len(read_step_log(out / "metrics.jsonl", "eval_warmup")) == 1
    check_inspector_output(out, text, train_steps=[1, 2])
    check_hop_metrics(out, train)

    assert main(["--smoke", "--calibadv", "--sapo", "--out", str(out), "--resume", "--steps", "3", *SEED]) == 0
    text = capsys.readouterr().out
    assert "resumed at step 2" in text and "after warm-up" in text  # the recorded warm-up column is reused
    assert "expert trajectories" not in text  # no warm-up, so no demonstrations either
    assert len(read_step_log(out / "metrics.jsonl", "eval_warmup")) == 1  # and not re-evaluated
    assert [r["step"] for r in read_step_log(out / "metrics.jsonl", "train")] == [1, 2, 3]
    preds = [json.loads(line) for line in (out / "eval_predictions.jsonl").read_text().splitlines()]
    assert sum(p["dataset"] == "after_step3" for p in preds) == 4  # the resumed end is evaluated, not reused
    check_inspector_output(out, text, train_steps=[1, 2, 3])


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_descendants_survive_a_process_ending_while_they_are_read(monkeypatch):
    """The memory sampler's walk of the process tree finds a live child, and a process that ends
    between being listed and being read (its /proc/<pid>/task gone) counts as childless instead of
    ending the sampler thread (seen in CI: the demo's memory columns stopped mid-run)."""
    import os
    import subprocess
    import sys

    from openrlhf_sgrpo.demo import memory

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert child.pid in memory.descendants(os.getpid())
        real_listdir = os.listdir

        def ended(path):
            if path == f"/proc/{child.pid}/task":
                raise FileNotFoundError(2, "No such file or directory", path)
            return real_listdir(path)

        monkeypatch.setattr(memory.os, "listdir", ended)
        assert child.pid in memory.descendants(os.getpid())
    finally:
        child.kill()
        child.wait()
    assert memory.descendants(child.pid) == []  # reaped: no /proc entry at all


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="needs Linux /proc smaps_rollup")
def test_stage_memory_counts_child_processes_in_rss_and_pss():
    """A child holding 256 MiB of its own pages shows in both sums and not in the demo process's
    own column; a stage's PSS peak never exceeds its RSS peak (each PSS sample is taken with an
    RSS sample)."""
    import subprocess
    import sys

    from openrlhf_sgrpo.demo.memory import StagePeaks, tree_memory_mb

    rss0, pss0 = tree_memory_mb()
    peaks = StagePeaks()
    peaks.begin("child")
    hold = ("import sys\nb = bytearray(256 << 20)\nb[::4096] = b'x' * len(b[::4096])\n"
            "print('ready', flush=True)\nsys.stdin.read()")
    child = subprocess.Popen([sys.executable, "-c", hold],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        rss1, pss1 = tree_memory_mb()
        peaks.begin("after")  # closing "child" samples once more, the child still alive
    finally:
        child.communicate("")
    peaks.close()
    assert rss1 - rss0 > 240 and pss1 - pss0 > 240, (rss0, rss1, pss0, pss1)
    (name, _, rss_peak, pss_peak, own_peak), _ = peaks.rows
    assert name == "child" and rss_peak > rss0 + 240 and pss0 + 240 < pss_peak <= rss_peak
    # the child's pages are not the demo process's own: its column stays below the tree's
    assert 0 < own_peak < rss_peak - 240, (own_peak, rss_peak)
    assert "peak PSS MiB (shared pages once)" in peaks.table()
    assert "demo process alone" in peaks.table()


def check_hop_metrics(run_dir, train: list[dict]) -> None:
    """Each step's logged per-hop numbers are those of its recorded trajectories (every group is
    recorded: --record-groups 8 >= 2 prompts), the hop read from the question id."""
    recs = records(run_dir)
    html = (run_dir / "rollouts.html").read_text()
    assert 'data-key="hop1/em"' in html or 'data-key="hop2/em"' in html  # the inspector's by-hop curves
    for r in train:
        samples = [(hop_of_qid(g["prompt_id"]), s) for g in recs[f"train/{r['step']}"] for s in g["samples"]]
        for h in (1, 2):
            mine = [s for hop, s in samples if hop == h]
            if not mine:
                assert f"hop{h}/em" not in r
                continue
            assert r[f"hop{h}/em"] == pytest.approx(sum(s["em"] or 0.0 for s in mine) / len(mine))
            assert r[f"hop{h}/two_search_share"] == pytest.approx(
                sum(s["stratum"] >= 2 for s in mine) / len(mine))  # stratum = tool calls = searches here


@pytest.mark.slow
def test_smoke_compare_trains_both_arms_from_the_same_warm_up(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["--smoke", "--compare", "--engine", "hf", "--out", str(out), *SEED]) == 0  # HF: the fallback
    text = capsys.readouterr().out
    assert "[9/9]" in text
    assert "| GRPO " in text and "Stratified GRPO (alpha 0.8)" in text
    starts = {}
    for arm, estimator in (("grpo", "grpo"), ("sgrpo", "stratified_grpo")):
        log = out / arm / "metrics.jsonl"
        assert [r["step"] for r in read_step_log(log, "train")] == [1, 2]
        assert read_step_log(log, "eval_after")[0]["n"] == 4
        starts[arm] = read_step_log(log, "arm_start")[0]
        assert starts[arm]["estimator"] == estimator
        assert (out / arm / "rollouts.html").exists()
        groups = records(out / arm)["train/1"]
        assert groups[0]["estimator"] == estimator
    # both arms start from the weights the warm-up left (fingerprint of the state dict)
    assert starts["grpo"]["weights"] == starts["sgrpo"]["weights"] == read_step_log(
        out / "metrics.jsonl", "warmup")[0]["weights"]
    assert (out / "report.png").stat().st_size > 10_000


def check_inspector_output(out, text: str, train_steps: list[int]) -> None:
    """The demo's rollout records (every train step's groups with SAPO and CalibAdv numbers, each
    evaluation's trajectories) and its report, rendered in Chromium when there is one."""
    recs = records(out)
    assert f"rollout inspector: {out / 'rollouts.html'}" in text
    assert sorted(k for k in recs if k.startswith("train/")) == [f"train/{s}" for s in train_steps]
    for step in train_steps:
        groups = recs[f"train/{step}"]
        assert len(groups) == 2 and all(g["n"] == 4 for g in groups)  # --prompts-per-step 2, --n-samples 4
        logged = read_step_log(out / "metrics.jsonl", "train")[step - 1]
        samples = [s for g in groups for s in g["samples"]]
        assert sum(s["reward"] for s in samples) / len(samples) == pytest.approx(logged["reward"], abs=1e-6)
        assert all(s["advantage"] is not None and "sapo" in s for s in samples)
        assert any(t.get("calib_score") is not None for s in samples for t in s["turns"])
    for phase in ("eval_before", "eval_warmup", "eval_after"):
        assert any(k.startswith(phase + "/") for k in recs), phase
    assert len(recs["eval_before/0"]) == 4 and all(g["n"] == 1 for g in recs["eval_before/0"])
    if CHROMIUM is None:
        return  # the DOM checks need a browser; tests/test_inspect_report.py says how to install one
    with Browser(CHROMIUM) as page:
        page.open(out / "rollouts.html")
        keys = page.evaluate("[...document.querySelectorAll('#step-select option')].map(o => o.value)")
        for index in range(len(keys)):
            state = set_control(page, "step-select", str(index))
            assert state["rendered"] == "1" and state["stepKey"] in recs
            assert_dom_matches(state, recs[state["stepKey"]])
        assert page.errors == [] and page.evaluate("window.__reportErrors") == []


@pytest.mark.parametrize("argv, message", [
    (["--n-samples", "1"], "--n-samples must be >= 2"),
    (["--steps", "0"], "--steps must be >= 1"),
    (["--resume"], "--resume needs --out"),
    (["--data", "x.jsonl"], "--data needs the corpus"),
    (["--heldout", "1"], "--heldout must be >= 2"),
    (["--compare", "--estimator", "grpo"], "--compare trains grpo and stratified_grpo"),
    (["--warmup-steps", "-1"], "--warmup-steps must be >= 0"),
    (["--train-batch-size", "3"], "train_batch_size must divide the rollout batch"),
    (["--max-epochs", "0"], "--max-epochs must be >= 1"),
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
    assert main(["--smoke", "--data", str(qa), "--corpus", str(corpus), "--engine", "hf", "--out", str(out),
                 *SEED]) == 0
    text = capsys.readouterr().out
    assert "[7/7]" in text and "held-out metric" in text
    preds = [json.loads(line) for line in (out / "eval_predictions.jsonl").read_text().splitlines()]
    held = {p["id"] for p in preds if p["dataset"] == "after_step2"}
    first = [json.loads(line)["id"] for line in qa.read_text().splitlines()[:4]]
    assert held == set(first)  # the first --heldout questions of the file are held out
    assert [r["step"] for r in read_step_log(out / "metrics.jsonl", "train")] == [1, 2]


def test_sapo_takes_two_optimizer_steps_per_rollout_by_default():
    assert parse_args(["--sapo"]).train_batch_size == 4  # 2 prompts x 4 samples: two steps
    assert parse_args([]).train_batch_size == 8
    odd = parse_args(["--sapo", "--prompts-per-step", "1"])  # one group cannot be halved: two epochs
    assert odd.train_batch_size == 4 and odd.max_epochs == 2


def test_kv_cache_default_follows_the_device_and_an_explicit_size_wins():
    """0.5 GiB on a CPU (~11k tokens of SmolLM2 in fp32); on a GPU it held only ~15 of a study step's
    64 trajectories at once (H100, 2026-11-27), so 4 GiB there."""
    assert parse_args([]).kv_cache_gb == 0.5
    assert parse_args(["--device", "cuda"]).kv_cache_gb == 4.0
    assert parse_args(["--device", "cuda", "--kv-cache-gb", "1"]).kv_cache_gb == 1.0
