"""The GPU study script (examples/study/sgrpo_vs_grpo.py) run tiny on a CPU: seeds as processes
side by side, each one demo run (one warm-up, every arm from it), aggregated into one table, one
plot, a JSON with the environment, and per seed a committed-form seed folder that the study
report reads. A check of the plumbing (tiny random Qwen2, --smoke), not a result."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from openrlhf_sgrpo.demo.arms import RANDOM_STRATA, arms_for, parse_arms
from openrlhf_sgrpo.demo.study import DEFAULT_ARMS
from openrlhf_sgrpo.demo.study_runner import DONE, SeedJob, demo_argv, plan_jobs, read_progress, run_parallel
from openrlhf_sgrpo.engine import processor
from openrlhf_sgrpo.local.step_log import read_step_log
from openrlhf_sgrpo.testing import shifted_seed

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "study" / "sgrpo_vs_grpo.py"


def load_script():
    spec = importlib.util.spec_from_file_location("sgrpo_vs_grpo", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_random_strata_arm_carries_its_stratify_by_into_the_trainer():
    from openrlhf_sgrpo.demo.options import parse_args, train_config

    assert parse_arms(DEFAULT_ARMS) == [("grpo", 0.0, None), ("stratified_grpo", 0.8, None),
                                        ("stratified_grpo", 0.8, RANDOM_STRATA)]
    args = parse_args(["--smoke", "--arms", DEFAULT_ARMS, "--out", "unused"])
    arms = arms_for(args)
    assert [a.label for a in arms] == ["GRPO", "Stratified GRPO (alpha 0.8)", "Random strata (alpha 0.8)"]
    assert len({a.dir for a in arms}) == 3
    by_arm = [train_config(args, a.estimator, a.alpha, a.stratify_by).adv for a in arms]
    assert [(c.estimator, c.alpha, c.stratify_by) for c in by_arm] == [
        ("grpo", 0.0, "tool_calls"), ("stratified_grpo", 0.8, "tool_calls"), ("stratified_grpo", 0.8, RANDOM_STRATA)]


def test_bad_arms_are_named(capsys):
    from openrlhf_sgrpo.demo.options import parse_args

    for bad in ("sgrpo", "sgrpo:2", "ppo", "grpo,grpo", "random", "random:x", "random:0.8,random:0.8"):
        with pytest.raises(SystemExit):
            parse_args(["--arms", bad])
        assert "--arms" in capsys.readouterr().err


def test_study_flags_are_checked_before_any_process(tmp_path, capsys):
    script = load_script()
    for argv, named in ((["--gpu-memory-share", "1.5"], "--gpu-memory-share '1.5'"), (["--jobs", "0"], "--jobs"),
                        (["--arms", "random:2"], "random:2"), (["--", "--seed", "3"], "--seed after `--`"),
                        (["--", "--steps", "0"], "--steps")):
        with pytest.raises(SystemExit):
            script.main(["--out", str(tmp_path / "s"), *argv])
        assert named in capsys.readouterr().err, argv
    assert not (tmp_path / "s").exists()


def test_gpu_share_is_a_demo_flag_and_a_bad_one_named(capsys):
    from openrlhf_sgrpo.demo.options import parse_args

    assert parse_args(["--smoke"]).gpu_memory_share is None
    assert parse_args(["--smoke", "--gpu-memory-share", "0.12"]).gpu_memory_share == 0.12
    for bad in ("0", "1.2"):
        with pytest.raises(SystemExit):
            parse_args(["--smoke", "--gpu-memory-share", bad])
        assert "--gpu-memory-share must be a fraction in (0, 1]" in capsys.readouterr().err, bad


def test_progress_lines_come_from_the_step_logs(tmp_path):
    folder = tmp_path / "seed_0"
    (folder / "grpo").mkdir(parents=True)
    log = folder / "grpo" / "metrics.jsonl"
    rows = [{"phase": "arm_start", "step": 0, "time": 100.0},
            {"phase": "train", "step": 1, "time": 107.5, "reward": 0.5, "hop2/search_calls": 1.25,
             "hop2/two_search_share": 0.25, "hop2/em": 0.0}]
    log.write_text("\n".join(json.dumps(r) for r in rows) + "\n" + '{"phase": "train", "st')  # a line being written
    job = SeedJob(0, [], folder, tmp_path / "log")
    lines = read_progress(job, t0=100.0)
    assert len(lines) == 1 and "seed 0 grpo" in lines[0] and "step   1 (  7.5 s) reward 0.500" in lines[0]
    assert "two-search share 0.250" in lines[0]
    with open(log, "a") as f:
        f.write('ep": 2, "time": 110.0, "reward": 0.75}\n')
    assert read_progress(job, t0=100.0)[0].split("step")[1].startswith("   2 (  2.5 s) reward 0.750")
    assert read_progress(job, t0=100.0) == []
    with open(log, "a") as f:  # an evaluation without two-hop questions: NaN, written as null
        f.write(json.dumps({"phase": "eval_after", "step": 2, "time": 111.0, "hop1/em": 0.5, "hop2/em": None}) + "\n")
    assert read_progress(job, t0=100.0)[0].endswith("eval_after: held-out EM 1-hop 0.500 2-hop   -  ")
    resumed = SeedJob(0, [], folder, tmp_path / "log")  # a --resume session started after all of it
    assert read_progress(resumed, t0=200.0)[0].startswith("[study] (earlier) seed 0 grpo         step   1")


def test_resume_skips_finished_seeds_and_resumes_started_ones(tmp_path):
    (tmp_path / "seed_0").mkdir()
    (tmp_path / "seed_0" / DONE).write_text("{}")
    lines: list[str] = []
    assert run_parallel([0], tmp_path, "grpo", [], resume=True, emit=lines.append) == {"seed 0": 0}
    assert any("seed 0: done in an earlier run" in line for line in lines)
    assert "--resume" not in demo_argv(1, tmp_path, "grpo", [], resume=True)  # nothing there yet
    (tmp_path / "seed_1").mkdir()
    (tmp_path / "seed_1" / "args.json").write_text("{}")
    assert demo_argv(1, tmp_path, "grpo", [], resume=True)[-1] == "--resume"
    assert "--resume" not in demo_argv(1, tmp_path, "grpo", [], resume=False)


def test_split_arms_plans_one_process_per_arm_after_the_seed_warm_up(tmp_path):
    jobs = plan_jobs([3], tmp_path, "grpo,sgrpo:0.8,random:0.8", ["--smoke"], resume=False, split_arms=True)
    assert [j.name for j in jobs] == ["seed 3 grpo", "seed 3 sgrpo_a0.8", "seed 3 random_a0.8"]
    assert [j.folder.name for j in jobs] == ["seed_3", "seed_3.sgrpo_a0.8", "seed_3.random_a0.8"]
    first, *others = jobs
    assert first.waits_for is None and "--resume" not in first.argv
    for job in others:  # each starts from a copy of the first's warm-up weights, as a resumed run
        assert job.waits_for == tmp_path / "seed_3" / "warmup_policy.pt" and job.waits_on is first
        assert job.argv[-1] == "--resume" and job.argv[job.argv.index("--arms") + 1] in ("sgrpo:0.8", "random:0.8")


def _span(folder: Path) -> tuple[float, float]:
    """First and last step-log time of a seed's run (its own log and its arms'), from the files."""
    times = [r["time"] for p in folder.glob("**/metrics.jsonl") for r in read_step_log(p)]
    return min(times), max(times)


@pytest.mark.slow
def test_study_runs_processes_side_by_side_survives_a_failed_one_and_writes_seed_folders(tmp_path, capsys):
    """The GPU layout (--split-arms) through the real entry point: two seeds whose GRPO processes
    start at once and do the warm-up, each seed's random-strata process then starting from a copy
    of its weights, and a third seed whose demo fails at once (its folder holds a run and no
    --resume is given), so its other arm never starts. Run with --no-sandbox as the lent GPU
    machine runs it (that image has no bubblewrap)."""
    from openrlhf_sgrpo.demo.study_report import read_seeds, summarize as report_summary, write_report

    out = tmp_path / "study"
    seeds = [shifted_seed(0), shifted_seed(1)]
    bad = shifted_seed(7)
    (out / f"seed_{bad}").mkdir(parents=True)
    (out / f"seed_{bad}" / "args.json").write_text("{}")  # "already holds a run"
    rc = load_script().main(["--out", str(out), "--smoke", "--seeds", *map(str, seeds), str(bad), "--split-arms",
                             "--arms", "grpo,random:0.8", "--session", "test", "--gpu-memory-share", "0.4", "--",
                             "--steps", "1", "--warmup-steps", "1",  # a warm-up, shorter than smoke's 6
                             "--heldout", "2", "--no-sandbox", "--engine", "hf"])
    captured = capsys.readouterr()
    assert rc == 1  # one seed failed; the others' results are written
    failed_log = out / "logs" / f"seed_{bad}.grpo.log"
    assert f"seed {bad} grpo FAILED (exit 2)" in captured.out and f"log: {failed_log}" in captured.out
    assert f"seed {bad} random_a0.8 NOT STARTED" in captured.out
    assert "already holds a run" in failed_log.read_text()
    # concurrency, from the processes' own step logs: the two seeds' GRPO runs overlap in time
    (a0, a1), (b0, b1) = (_span(out / f"seed_{s}") for s in seeds)
    assert max(a0, b0) < min(a1, b1), ((a0, a1), (b0, b1))
    progress = (out / "progress.log").read_text()
    labels = ("GRPO", "Random strata (alpha 0.8)")
    for s in seeds:
        assert "sandbox   not started (--no-sandbox)" in (out / "logs" / f"seed_{s}.grpo.log").read_text()
        for run_dir in (out / f"seed_{s}", out / f"seed_{s}.random_a0.8"):  # each demo got its share (unused on a CPU)
            assert json.loads((run_dir / "args.json").read_text())["gpu_memory_share"] == "0.4", run_dir
        for arm_dir in ("grpo", "random_a0.8"):
            assert f"seed {s} {arm_dir:<12} step   1" in progress
    # the session's table is the study report over its seed folders (read back below)
    table = (out / "table.md").read_text()
    assert "2 seed folder(s) from 1 session(s)" in table and "## search regime, cpu: 2 seed(s)" in table
    assert (out / "figure_search_cpu.png").stat().st_size > 10_000  # the demo's default --task, on a CPU
    for row in (*labels, "after warm-up (start)"):
        assert f"| {row} " in table
    study = json.loads((out / "study.json").read_text())
    assert {k: study["environment"][k] for k in ("processor", "cpu_isa")} == processor()
    assert study["seeds"] == sorted(seeds) and len(study["seed_folders"]) == 2
    assert study["failed"] == {f"seed {bad} grpo": 2, f"seed {bad} random_a0.8": -1}
    # the seed folders: small, in the committed form, both arms of a seed from the same weights,
    # and what the report aggregates
    committed = read_seeds(out / "seeds")
    assert sorted(c["folder"] for c in committed) == [f"test_cpu_seed{s}" for s in seeds]
    for folder in (out / "seeds").iterdir():
        assert sum(p.stat().st_size for p in folder.iterdir()) < 50_000
    for c in committed:
        assert list(c["arms"]) == list(labels) and c["after_warmup"] is not None
        assert all(len(c["steps"][label]) == 1 and c["steps"][label][0]["wall_s"] > 0 for label in labels)
        assert c["arms"]["Random strata (alpha 0.8)"]["stratify_by"] == RANDOM_STRATA
        assert c["regime"] == "search" and c["settings"]["steps"] == 1 and c["settings"]["heldout"] == 2
        assert not any("settings_differ" in c["arms"][label] for label in labels)  # each arm's process: same flags
        starts = {c["arms"][label]["start_weights"] for label in labels}
        assert len(starts) == 1 and None not in starts
    summary = report_summary(committed)
    for label in labels:
        em2 = [c["arms"][label]["heldout"]["hop2/em"] for c in committed]
        assert summary[label]["EM 2-hop"]["n"] == 2 and summary[label]["EM 2-hop"]["mean"] == pytest.approx(sum(em2) / 2)
    table_path, figure = write_report(out / "seeds", tmp_path / "report")
    assert "2 seed folder(s) from 1 session(s)" in table_path.read_text() and figure.stat().st_size > 10_000


def test_the_cpu_preset_is_the_study_flags_and_later_flags_win():
    """--cpu REGIME puts the CPU study's demo flags first (demo/study.py): 32 trajectories in
    groups of 8, EM, the exact update shortcuts, the regime as --task; flags after -- override."""
    from openrlhf_sgrpo.demo.options import parse_args
    from openrlhf_sgrpo.demo.study import cpu_study_flags

    args, demo = load_script().parse(["--out", "x", "--cpu", "trap", "--", "--steps", "3"])
    assert demo[: len(cpu_study_flags("trap"))] == cpu_study_flags("trap") and demo[-2:] == ["--steps", "3"]
    parsed = parse_args([*demo, "--out", "unused"])
    assert (parsed.task, parsed.steps, parsed.prompts_per_step, parsed.n_samples, parsed.reward) == ("trap", 3, 4, 8, "em")
    assert parsed.shared_prefix and parsed.skip_zero_advantage and not parsed.gradient_checkpointing
    assert parsed.strata_check == 8  # the trap's default: the strata measured after the warm-up
    with pytest.raises(SystemExit):
        load_script().parse(["--out", "x", "--cpu", "trap", "--gpu-memory-share", "0.1"])


@pytest.mark.slow
def test_cpu_study_runs_the_arms_in_one_process_and_writes_a_trap_seed(tmp_path):
    """The CPU study's own path (``--cpu trap``, no --split-arms): one demo process per seed runs
    the warm-up, the strata check and every arm from the same weights, with the CPU update
    shortcuts; the seed folder says regime, settings and the strata measured after the warm-up,
    and the report puts it in a trap table of its own."""
    from openrlhf_sgrpo.demo.study_report import read_seeds

    out = tmp_path / "study"
    seed = shifted_seed(3)
    rc = load_script().main(["--out", str(out), "--smoke", "--seeds", str(seed), "--cpu", "trap",
                             "--arms", "grpo,sgrpo:0.8", "--session", "cpu", "--",
                             "--steps", "1", "--heldout", "4", "--strata-check", "2", "--engine", "hf",
                             # the preset's warm-up is 32 steps (a real seed's); 2 run the same path
                             "--demos", "8", "--warmup-steps", "2"])
    assert rc == 0
    (committed,) = read_seeds(out / "seeds")
    assert committed["folder"] == f"cpu_cpu_seed{seed}" and committed["regime"] == "trap"
    settings = committed["settings"]
    assert (settings["task"], settings["steps"], settings["n_samples"], settings["reward"]) == ("trap", 1, 8, "em")
    assert settings["shared_prefix"] is True and settings["gradient_checkpointing"] is False
    check = committed["strata_warmup"]
    assert check["questions"] == 2 and check["samples_per_question"] == 2
    assert sum(v["n"] for v in check["strata"].values()) == 4
    labels = ["GRPO", "Stratified GRPO (alpha 0.8)"]
    assert list(committed["arms"]) == labels
    assert len({committed["arms"][label]["start_weights"] for label in labels}) == 1  # one warm-up, both arms
    assert all(len(committed["steps"][label]) == 1 for label in labels)
    table = (out / "table.md").read_text()
    assert "## trap regime, cpu: 1 seed(s)" in table
    # the paths of the two-hop trajectories, from the rollout records, agree with the step's and the
    # held-out evaluation's own two-search share (another code path: demo/hops.py, from the episodes)
    two_search = ("right_bridge", "wrong_bridge", "other_second", "three_plus")
    for label in labels:
        (step,) = committed["steps"][label]
        shares = {k.split("/")[1]: v for k, v in step.items() if k.startswith("path/") and k.endswith("/share")}
        assert shares and sum(shares.values()) == pytest.approx(1.0, abs=1e-3), step
        assert sum(shares.get(k, 0.0) for k in two_search) == pytest.approx(step["hop2/two_search_share"], abs=1e-3)
        arm = committed["arms"][label]
        held = arm["heldout_paths"]
        n = sum(c["n"] for c in held.values())
        assert n == 2  # --heldout 4: two two-hop questions, one greedy trajectory each
        assert sum(held[k]["n"] for k in two_search if k in held) / n == pytest.approx(arm["heldout"]["hop2/two_search_share"])
        assert sum(c["n"] * c["em"] for c in held.values()) / n == pytest.approx(arm["heldout"]["hop2/em"])
    assert "Paths on two-hop questions" in table
    from openrlhf_sgrpo.demo.study_runner import seed_dir
    from openrlhf_sgrpo.demo.trap_paths import run_report

    report = run_report(seed_dir(out, seed))
    assert all(f"### {label}" in report for label in labels) and report.count("held-out after RL") == 2
