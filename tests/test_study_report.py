"""The study's report regenerated from committed seed folders (openrlhf_sgrpo/demo/study_report.py):
seed folders written by export_seed from small synthetic run folders (the demo's layout: args.json,
environment.json, metrics.jsonl with the warm-up's records, one folder per arm), then the
report's numbers against ones computed here by hand, its groups (device, regime, settings: never
pooled), and a missing, malformed or old folder named."""

from __future__ import annotations

import itertools
import json
import math
import struct
from pathlib import Path

import pytest

from openrlhf_sgrpo.demo import study_report
from openrlhf_sgrpo.demo.study_report import (SeedFolderError, group_seeds, paired_differences, read_seeds, settled,
                                              stats, strata_summary, summarize, t975, write_report)
from openrlhf_sgrpo.demo.study_seeds import SeedExportError, export_seed

ARMS = "grpo,sgrpo:0.8,random:0.8"
GRPO, SGRPO, RANDOM = "GRPO", "Stratified GRPO (alpha 0.8)", "Random strata (alpha 0.8)"
DIRS = {GRPO: "grpo", SGRPO: "sgrpo_a0.8", RANDOM: "random_a0.8"}
# every demo flag as the demo writes args.json (str(value)); the comparison's settings among them
BASE_ARGS = {"out": "x", "resume": "False", "smoke": "False", "compare": "True", "arms": ARMS, "model": "smollm2",
             "device": "cpu", "no_sandbox": "True", "engine": "vllm", "gpu_memory_share": "None", "task": "trap",
             "strata_check": "8", "train_pairs": "200", "task_seed": "0", "heldout": "48", "steps": "8",
             "warmup_steps": "12", "warmup_lr": "0.0001", "warmup_batch": "4", "demos": "64", "prompts_per_step": "4",
             "n_samples": "8", "micro_batch_size": "8", "train_batch_size": "32", "max_epochs": "1",
             "gradient_checkpointing": "False", "shared_prefix": "True", "lr": "2e-05", "estimator": "stratified_grpo",
             "alpha": "0.8", "stratify_by": "tool_calls", "kl_coef": "0.0", "sapo": "False", "calibadv": "False",
             "max_turns": "2", "max_len": "768", "max_tokens_per_turn": "48", "max_obs_tokens": "160",
             "temperature": "1.0", "reward": "f1", "concurrency": "48", "seed": "0", "record_groups": "8"}
HELDOUT = {"hop1/em": 0.9, "hop2/em": 0.25, "search_calls": 1.0, "hop2/two_search_share": 0.2}
_runs = itertools.count()


def make_run(root: Path, seed: int, *, device: str = "cpu", args: dict | None = None, heldout: dict | None = None,
             curves: dict | None = None, weights: dict | None = None, strata: dict | None = None,
             warm: dict | None = None, steps: int = 8, wall: float = 7.0) -> Path:
    """A demo run folder of the three arms, shaped as the demo writes it. ``args``: args.json
    overrides (None deletes a flag, as a run from before it); ``heldout``/``curves``/``weights``:
    per arm label, held-out after RL, per-step training values (key -> one value per step) and
    the start weights' digest; ``strata``: the strata_check record's strata (None: no check)."""
    run = root / "runs" / f"run{next(_runs)}"
    run.mkdir(parents=True)
    flags = {**BASE_ARGS, "seed": str(seed), **(args or {})}
    (run / "args.json").write_text(json.dumps({k: v for k, v in flags.items() if v is not None}))
    (run / "environment.json").write_text(json.dumps({"device": device, "torch": "2.11.0"}))
    records = [{"phase": "eval_warmup", "step": 0, "time": 1.0, **({"hop2/em": 0.0} if warm is None else warm)}]
    if strata is not None:
        records.append({"phase": "strata_check", "step": 0, "time": 2.0, "n": sum(s["n"] for s in strata.values()),
                        "strata": strata, "questions": 8, "samples_per_question": 8})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    for label, arm_dir in DIRS.items():
        (run / arm_dir).mkdir()
        t0 = 1000.0
        rows = [{"phase": "arm_start", "step": 0, "time": t0, "weights": (weights or {}).get(label, "ab12")}]
        for step in range(1, steps + 1):
            rec = {"phase": "train", "step": step, "time": t0 + wall * step, "reward": 0.1, "search_calls": 1.0,
                   "hop2/two_search_share": 0.3, "sgrpo/stratum1/share": 0.6, "sgrpo/stratum2/share": 0.4,
                   "sgrpo/stratum1/adv_mass": -0.1 * step, "sgrpo/stratum2/adv_mass": 0.1 * step,
                   "sgrpo/stratum1/reward": 0.5, "sgrpo/stratum2/reward": 0.3}
            rec.update({k: v[step - 1] for k, v in ((curves or {}).get(label) or {}).items()})
            rows.append(rec)
        rows.append({"phase": "eval_after", "step": steps, "time": t0 + wall * steps + 5,
                     **HELDOUT, **((heldout or {}).get(label) or {})})
        (run / arm_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def seed_folder(root: Path, seed: int, session: str = "s1", **run) -> Path:
    """A committed-form seed folder under ``root/seeds``, exported from a synthetic run."""
    return export_seed(make_run(root, seed, **run), seed, ARMS, root / "seeds", session, ["--seeds", str(seed)],
                       commit="abc")


def sections(table: str) -> dict[str, str]:
    """table.md's group sections by their heading."""
    parts = table.split("\n## ")[1:]
    return {p.splitlines()[0]: p for p in parts}


def row(text: str, first: str) -> list[str]:
    """The cells of the markdown table row whose first cell is ``first``."""
    line = next(ln for ln in text.splitlines() if ln.startswith(f"| {first} "))
    return [c.strip() for c in line.strip("|").split("|")]


def cell(s: dict, digits: int = 3) -> str:
    return f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f} [{s['lo']:.{digits}f}, {s['hi']:.{digits}f}]"


def hand_stats(values: list[float]) -> dict:
    """Mean, sample std and the 95 % t-interval, with SciPy's t quantile."""
    scipy_stats = pytest.importorskip("scipy.stats")
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = scipy_stats.t.ppf(0.975, n - 1) * std / math.sqrt(n)
    return {"n": n, "mean": mean, "std": std, "lo": mean - half, "hi": mean + half}


def png_width(path: Path) -> int:
    data = path.read_bytes()[:24]
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    return struct.unpack(">I", data[16:20])[0]


# held-out EM 2-hop of GRPO over three seeds, the last step's reward, EM 2-hop after the warm-up
EM2 = [0.125, 0.25, 0.5]
LAST_REWARD = [0.4, 0.7, 0.55]
WARM_EM2 = [0.0, 0.125, 0.125]


def three_seeds(root: Path, device: str = "NVIDIA H200", session: str = "s1") -> None:
    """Three seeds of one group: GRPO's EM 2-hop EM2, last reward LAST_REWARD; the other arms
    +0.1; seed k's steps take 7 + k s (Stratified GRPO's 7.1 + k)."""
    for k, (em2, r) in enumerate(zip(EM2, LAST_REWARD)):
        heldout = {label: {"hop2/em": em2 + shift, "search_calls": 1.0 + shift, "hop2/two_search_share": 0.2 + shift}
                   for label, shift in ((GRPO, 0.0), (SGRPO, 0.1), (RANDOM, 0.1))}
        curves = {label: {"reward": [0.1] * 7 + [r + shift]}
                  for label, shift in ((GRPO, 0.0), (SGRPO, 0.1), (RANDOM, 0.1))}
        seed_folder(root, k, session, device=device, heldout=heldout, curves=curves, warm={"hop2/em": WARM_EM2[k]},
                    wall=7.0 + k)


def test_t_quantiles_are_students():
    # t_{0.975} for 2 and 10 degrees of freedom (any table); large df approaches the normal's 1.96
    assert t975(2) == pytest.approx(4.302653, abs=1e-6)
    assert t975(10) == pytest.approx(2.228139, abs=1e-6)
    assert t975(120) == pytest.approx(1.979930, abs=1e-4)
    scipy_stats = pytest.importorskip("scipy.stats")
    for df in range(1, 61):
        assert t975(df) == pytest.approx(scipy_stats.t.ppf(0.975, df), rel=2e-5), df


def test_export_writes_regime_typed_settings_and_the_strata_check(tmp_path):
    strata = {"1": {"n": 40, "share": 0.625, "em": 0.5, "em_lo": 0.35, "em_hi": 0.65},
              "2": {"n": 24, "share": 0.375, "em": 0.25, "em_lo": 0.12, "em_hi": 0.45}}
    folder = seed_folder(tmp_path, 3, strata=strata, args={"lr": "1e-05", "strata_check": "8"})
    meta = json.loads((folder / "seed.json").read_text())
    assert meta["schema"] == 2 and meta["regime"] == "trap"
    s = meta["settings"]
    assert s["lr"] == 1e-05 and isinstance(s["lr"], float) and s["steps"] == 8 and isinstance(s["steps"], int)
    assert s["shared_prefix"] is True and s["gradient_checkpointing"] is False and s["model"] == "smollm2"
    assert "seed" not in s and "out" not in s and "arms" not in s  # what makes seeds of one comparison alike
    assert meta["strata_warmup"] == {"strata": strata, "questions": 8, "samples_per_question": 8}
    # a run from before --task: the search-necessary regime; before --strata-check: None, no check
    old = json.loads((seed_folder(tmp_path, 4, args={"task": None, "strata_check": None}) / "seed.json").read_text())
    assert old["regime"] == "search" and old["settings"]["strata_check"] is None and old["strata_warmup"] is None
    run = make_run(tmp_path, 5)
    (run / "args.json").unlink()
    with pytest.raises(SeedExportError, match=rf"{run}: args.json is missing"):
        export_seed(run, 5, ARMS, tmp_path / "other", "s", [], commit="abc")
    (run / "args.json").write_text(json.dumps({**BASE_ARGS, "steps": "eight"}))
    with pytest.raises(SeedExportError, match=rf"{run}: args.json's 'steps' is 'eight', not an int"):
        export_seed(run, 5, ARMS, tmp_path / "other", "s", [], commit="abc")
    assert not (tmp_path / "other").exists()  # nothing half-written


def test_split_arms_with_other_flags_are_named_in_the_seed_and_the_report(tmp_path):
    """Under --split-arms each arm's process has its own args.json: one with other flags is kept
    in the seed (settings_differ) and noted in its table."""
    run = make_run(tmp_path, 0)
    other = tmp_path / "runs" / "run_other"
    other.mkdir()
    (other / "args.json").write_text(json.dumps({**BASE_ARGS, "lr": "1e-05"}))
    (other / DIRS[RANDOM]).mkdir()
    (other / DIRS[RANDOM] / "metrics.jsonl").write_text((run / DIRS[RANDOM] / "metrics.jsonl").read_text())
    folder = export_seed(run, 0, ARMS, tmp_path / "seeds", "s1", [], commit="abc", arm_runs=[run, run, other])
    arms = json.loads((folder / "seed.json").read_text())["arms"]
    assert arms[RANDOM]["settings_differ"] == {"lr": 1e-05} and "settings_differ" not in arms[SGRPO]
    table, _ = write_report(tmp_path / "seeds", tmp_path / "report")
    assert f"note: s1_cpu_seed0: arm {RANDOM} ran with other settings: lr 1e-05" in table.read_text()


def test_mean_std_and_interval_over_seeds_match_a_hand_computation(tmp_path):
    three_seeds(tmp_path)
    seeds = read_seeds(tmp_path / "seeds")
    cols = summarize(seeds)[GRPO]
    want = hand_stats(EM2)
    got = cols["EM 2-hop"]
    assert got["n"] == 3
    assert (got["mean"], got["std"], got["lo"], got["hi"]) == pytest.approx(
        (want["mean"], want["std"], want["lo"], want["hi"]))
    assert cols["last-step reward"]["mean"] == pytest.approx(sum(LAST_REWARD) / 3)
    assert cols["last-step reward"]["std"] == pytest.approx(0.15)  # 0.4, 0.7, 0.55: deviations ±0.15, 0
    # the other arm is shifted by 0.1 in every seed: the same spread, its mean 0.1 higher
    other = summarize(seeds)[SGRPO]["EM 2-hop"]
    assert other["mean"] == pytest.approx(want["mean"] + 0.1) and other["std"] == pytest.approx(want["std"])
    assert stats([0.5])["n"] == 1 and math.isnan(stats([0.5])["std"])


def test_report_table_warm_up_row_repeated_seeds_and_step_times_per_session(tmp_path, capsys):
    three_seeds(tmp_path)
    seed_folder(tmp_path, 0, "s2", device="NVIDIA H200", heldout={GRPO: {"hop2/em": 0.0}}, warm={})
    out = tmp_path / "report"
    assert study_report.main(["--results", str(tmp_path / "seeds"), "--out", str(out)]) == 0
    table = (out / "table.md").read_text()
    (section,) = sections(table).values()  # one device, one regime, one set of settings: one table
    assert "4 seed folder(s) from 2 session(s): s1, s2" in section
    assert "note: seed 0 is in 2 folders (s1_nvidia-h200_seed0, s2_nvidia-h200_seed0)" in section
    assert "note: seed 1" not in section
    # GRPO's EM 2-hop over the four seeds [0.125, 0.25, 0.5, 0.0], formatted as the cell is
    assert row(section, GRPO)[3] == cell(hand_stats(EM2 + [0.0]))
    # the warm-up row: the three seeds that recorded it (s2's did not), its last-step reward "-"
    warm_row = row(section, "after warm-up (start)")
    assert warm_row[1] == "3" and warm_row[-1] == "-" and warm_row[3] == cell(hand_stats(WARM_EM2))
    # step times: session s1's GRPO seeds ran 7, 8, 9 s per step; s2's one seed 7 s, alone
    assert row(section, "s1")[2:5] == ["GRPO", "3", "8.000 ± 1.000 [5.516, 10.484]"]
    assert "wrote" in capsys.readouterr().out


def test_cpu_gpu_and_the_two_regimes_never_share_a_table(tmp_path):
    em2 = {0: 0.125, 1: 0.375, 2: 0.75, 3: 0.5}
    for k, device, task in ((0, "cpu", "trap"), (1, "cpu", "trap"), (2, "NVIDIA H200", "trap"), (3, "cpu", None)):
        seed_folder(tmp_path, k, device=device, args={"task": task}, heldout={GRPO: {"hop2/em": em2[k]}})
    out = tmp_path / "report"
    table_path, first = write_report(tmp_path / "seeds", out)
    table = table_path.read_text()
    by_head = sections(table)
    assert sorted(by_head) == ["search regime, cpu: 1 seed(s)", "trap regime, NVIDIA H200: 1 seed(s)",
                               "trap regime, cpu: 2 seed(s)"]
    # each table's GRPO cell holds its own seeds alone: the CPU trap seeds 0 and 1, the GPU seed 2,
    # the old run without --task (the search-necessary regime) seed 3
    assert row(by_head["trap regime, cpu: 2 seed(s)"], GRPO)[3] == cell(hand_stats([em2[0], em2[1]]))
    assert row(by_head["trap regime, NVIDIA H200: 1 seed(s)"], GRPO)[1:4] == ["1", "0.900", "0.750"]
    assert row(by_head["search regime, cpu: 1 seed(s)"], GRPO)[1:4] == ["1", "0.900", "0.500"]
    names = ["figure_search_cpu.png", "figure_trap_cpu.png", "figure_trap_nvidia-h200.png"]
    assert first == out / names[0]
    for name in names:  # every figure written, listed, 880 px wide (GitHub's width: shown unscaled)
        assert f"`{name}`" in table and f"]({name})" in table
        assert (out / name).stat().st_size > 10_000 and png_width(out / name) == 880


def test_differing_settings_split_a_group_and_the_text_names_them(tmp_path):
    for k, lr in ((0, "2e-05"), (1, "2e-05"), (2, "1e-05")):
        seed_folder(tmp_path, k, args={"lr": lr})
    groups = group_seeds(read_seeds(tmp_path / "seeds"))
    assert [(g.index, [s["seed"] for s in g.seeds]) for g in groups] == [(1, [0, 1]), (2, [2])]
    assert groups[0].differs == {"lr": [1e-05]} and groups[1].differs == {"lr": [2e-05]}
    out = tmp_path / "report"
    table = write_report(tmp_path / "seeds", out)[0].read_text()
    by_head = sections(table)
    first = by_head["trap regime, cpu, settings 1: 2 seed(s)"]
    second = by_head["trap regime, cpu, settings 2: 1 seed(s)"]
    assert "their settings differ in lr (here 2e-05; there 1e-05)." in first
    assert "their settings differ in lr (here 1e-05; there 2e-05)." in second
    assert "Settings: task trap, model smollm2, engine vllm, steps 8, prompts_per_step 4, n_samples 8," in first
    for name in ("figure_trap_cpu_1.png", "figure_trap_cpu_2.png"):
        assert (out / name).stat().st_size > 10_000 and f"]({name})" in table
    assert not (out / "figure_trap_cpu.png").exists()


def test_paired_differences_match_a_hand_computation(tmp_path):
    grpo = {"hop2/em": [0.125, 0.25, 0.5], "search_calls": [1.0, 1.125, 0.875], "hop1/em": [0.9, 0.8, 0.85]}
    sgrpo = {"hop2/em": [0.25, 0.25, 0.75], "search_calls": [1.5, 1.25, 1.625], "hop1/em": [0.9, 0.9, 0.8]}
    for k in range(3):
        seed_folder(tmp_path, k, heldout={GRPO: {key: v[k] for key, v in grpo.items()},
                                          SGRPO: {key: v[k] for key, v in sgrpo.items()},
                                          RANDOM: {"hop2/em": None if k == 2 else 0.25}})
    seeds = read_seeds(tmp_path / "seeds")
    diffs = paired_differences(seeds)
    assert sorted(diffs) == sorted([SGRPO, RANDOM])
    for key in ("hop2/em", "search_calls", "hop1/em"):
        want = hand_stats([a - b for a, b in zip(sgrpo[key], grpo[key])])
        got = diffs[SGRPO][key]
        assert got["n"] == 3 and (got["mean"], got["std"], got["lo"], got["hi"]) == pytest.approx(
            (want["mean"], want["std"], want["lo"], want["hi"])), key
    assert diffs[SGRPO]["hop2/two_search_share"]["mean"] == pytest.approx(0.0)  # both HELDOUT's 0.2
    # the random arm's seed 2 logged no two-hop EM (NaN, written null): two pairs, not three
    random_em2 = diffs[RANDOM]["hop2/em"]
    assert random_em2["n"] == 2 and random_em2["mean"] == pytest.approx(((0.25 - 0.125) + (0.25 - 0.25)) / 2)
    table = write_report(tmp_path / "seeds", tmp_path / "report")[0].read_text()
    cells = row(table, f"{SGRPO} - GRPO")
    assert cells[1] == "3" and cells[2] == cell(hand_stats([0.125, 0.0, 0.25]))
    assert cells[3] == cell(hand_stats([0.5, 0.125, 0.75]))
    assert row(table, f"{RANDOM} - GRPO")[2].endswith(" (n 2)")
    assert "flagged" not in table  # every arm from the same start


def test_a_seed_whose_arms_start_from_other_weights_is_flagged(tmp_path):
    seed_folder(tmp_path, 0)
    seed_folder(tmp_path, 7, weights={RANDOM: "ff00"})
    seed_folder(tmp_path, 8, weights={SGRPO: None})
    table = write_report(tmp_path / "seeds", tmp_path / "report")[0].read_text()
    assert (f"- flagged: seed 7 (s1_cpu_seed7): its arms' start weights differ (GRPO ab12, {SGRPO} ab12, "
            f"{RANDOM} ff00)") in table
    assert f"- flagged: seed 8 (s1_cpu_seed8): start weights not recorded for {SGRPO}" in table
    assert "seed 0 (" not in table


def test_settled_slopes_match_numpy_polyfit(tmp_path):
    np = pytest.importorskip("numpy")
    curves = {0: [0.5, 0.8, 1.0, 1.1, 1.2, 1.25, 1.2, 1.3], 1: [0.4, 0.9, 1.0, 0.95, 1.0, 1.05, 1.0, 1.0],
              2: [0.6, 0.7, 0.8, 1.0, 1.1, 1.2, 1.3, 1.4]}
    for k, values in curves.items():
        seed_folder(tmp_path, k, curves={GRPO: {"search_calls": values},
                                         SGRPO: {"search_calls": [1.0 + 0.1 * i for i in range(8)]}})
    seed_folder(tmp_path, 9, steps=3)  # a cut-off seed: too few steps for the window, left out
    seeds = read_seeds(tmp_path / "seeds")
    result = settled(seeds)
    steps = np.arange(4, 9)
    slopes = [np.polyfit(steps, np.array(v[-5:]), 1)[0] for v in curves.values()]
    want = hand_stats(slopes)
    got = result[GRPO]["slope"]
    assert got["n"] == 3 and (got["mean"], got["std"], got["lo"], got["hi"]) == pytest.approx(
        (want["mean"], want["std"], want["lo"], want["hi"]))
    assert result[GRPO]["last"] == pytest.approx([np.mean([v[i] for v in curves.values()]) for i in range(3, 8)])
    assert result[GRPO]["steps"] == [(4, 5, 6, 7, 8)] and result[GRPO]["short"] == ["s1_cpu_seed9"]
    assert result[SGRPO]["slope"]["mean"] == pytest.approx(0.1) and result[SGRPO]["slope"]["std"] == pytest.approx(0.0)
    table = write_report(tmp_path / "seeds", tmp_path / "report")[0].read_text()
    cells = row(table.split("Has the search count settled?")[1], GRPO)
    assert cells[1] == "3" and cells[-1] == cell(want, 4)
    assert cells[2:7] == [f"{np.mean([v[i] for v in curves.values()]):.3f}" for i in range(3, 8)]
    assert "(steps 4-8)" in table and "(left out: fewer than 5 steps: s1_cpu_seed9)" in table


def test_strata_after_the_warm_up_pool_like_hand_counts(tmp_path):
    checks = {0: {"1": {"n": 40, "share": 0.625, "em": 0.5, "em_lo": 0.35, "em_hi": 0.65},
                  "2": {"n": 24, "share": 0.375, "em": 0.25, "em_lo": 0.12, "em_hi": 0.45}},
              1: {"0": {"n": 4, "share": 0.0625, "em": 0.0, "em_lo": 0.0, "em_hi": 0.49},
                  "1": {"n": 36, "share": 0.5625, "em": 20 / 36, "em_lo": 0.4, "em_hi": 0.7},
                  "2": {"n": 24, "share": 0.375, "em": 7 / 24, "em_lo": 0.15, "em_hi": 0.49}},
              2: None}  # a seed without a strata check (--strata-check 0): not counted
    for k, strata in checks.items():
        seed_folder(tmp_path, k, strata=strata)
    summary = strata_summary(read_seeds(tmp_path / "seeds"))
    assert list(summary) == ["0", "1", "2"]
    assert (summary["0"]["n"], summary["0"]["wins"], summary["0"]["em_pooled"]) == (4, 0, 0.0)
    assert summary["0"]["share"]["mean"] == pytest.approx(0.0625 / 2) and summary["0"]["em"]["n"] == 1
    assert (summary["1"]["n"], summary["1"]["wins"]) == (76, 40) and summary["1"]["em_pooled"] == pytest.approx(40 / 76)
    assert (summary["2"]["n"], summary["2"]["wins"]) == (48, 13) and summary["2"]["em_pooled"] == pytest.approx(13 / 48)
    want = hand_stats([0.5, 20 / 36])
    got = summary["1"]["em"]
    assert got["n"] == 2 and got["mean"] == pytest.approx(want["mean"], abs=1e-4)  # 4 decimals in the seed
    assert got["std"] == pytest.approx(want["std"], abs=1e-4)
    share = summary["1"]["share"]
    assert (share["mean"], share["std"]) == pytest.approx((hand_stats([0.625, 0.5625])["mean"],
                                                           hand_stats([0.625, 0.5625])["std"]))
    table = write_report(tmp_path / "seeds", tmp_path / "report")[0].read_text()
    assert "2 of 3 seed(s) made the check" in table
    assert row(table, "1 search")[4:] == ["76", f"{40 / 76:.3f} (40/76)"]
    assert row(table, "2 searches")[4:] == ["48", f"{13 / 48:.3f} (13/48)"]
    own = table.split("Each seed's strata")[1]  # the seed folders also head rows of its paired differences
    assert row(own, "s1_cpu_seed1")[1:] == ["8 x 8", "0.00 (n 4)", "0.56 (n 36)", "0.29 (n 24)"]  # its own
    assert row(own, "s1_cpu_seed0")[1:] == ["8 x 8", "-", "0.50 (n 40)", "0.25 (n 24)"]


def test_missing_malformed_and_old_seed_folders_are_named(tmp_path, capsys):
    three_seeds(tmp_path)
    seeds_root = tmp_path / "seeds"
    assert study_report.main(["--results", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o")]) == 2
    assert "nowhere" in capsys.readouterr().err
    broken = seeds_root / "s1_nvidia-h200_seed1"
    meta = json.loads((broken / "seed.json").read_text())
    (broken / "seed.json").write_text(json.dumps({**meta, "schema": 1}))
    with pytest.raises(SeedFolderError, match=r"s1_nvidia-h200_seed1: seed.json has schema 1, expected 2 .*export it"):
        read_seeds(seeds_root)
    (broken / "seed.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "settings"}))
    with pytest.raises(SeedFolderError, match=r"s1_nvidia-h200_seed1: seed.json lacks 'settings'"):
        read_seeds(seeds_root)
    (broken / "seed.json").write_text(json.dumps(meta))
    (broken / "steps.jsonl").unlink()
    with pytest.raises(SeedFolderError, match=r"s1_nvidia-h200_seed1: steps.jsonl is missing"):
        read_seeds(seeds_root)
    (broken / "steps.jsonl").write_text('{"arm": "GRPO", "step": 1}\nnot json\n')
    assert study_report.main(["--results", str(seeds_root), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "s1_nvidia-h200_seed1" in err and "line 2" in err
    (broken / "steps.jsonl").write_text('{"arm": "PPO", "step": 1}\n')
    with pytest.raises(SeedFolderError, match="names arm 'PPO'"):
        read_seeds(seeds_root)
    (broken / "seed.json").write_text(json.dumps({"schema": 99}))
    with pytest.raises(SeedFolderError, match=r"s1_nvidia-h200_seed1: seed.json has schema 99"):
        read_seeds(seeds_root)


def test_a_twenty_step_seed_of_three_arms_exports_under_50_kb(tmp_path):
    """The committed form's size budget, on a run folder shaped like a GPU seed's: 3 arms x 20
    steps with every per-step key the trainer logs, the settings and the strata check; the demo's
    2 tool turns give strata 0-2 (the trainer logs 0-3; 3 never occurs, 2 not at every step)."""
    import random

    rng = random.Random(0)
    run = tmp_path / "seed_0"
    for arm_dir in ("grpo", "sgrpo_a0.8", "random_a0.8"):
        (run / arm_dir).mkdir(parents=True)
        rows = [{"phase": "arm_start", "step": 0, "time": 1.7e9, "weights": "ab12"}]
        for step in range(1, 21):
            rec = {"phase": "train", "step": step, "time": 1.7e9 + 9.3 * step, "updates": [{"loss": rng.random()}]}
            rec.update({k: rng.random() for k in ("reward", "reward_std", "em", "f1", "tool_calls", "search_calls",
                                                   "answered", "action_tokens", "total_length", "hop1/em",
                                                   "hop2/em", "hop1/search_calls", "hop2/search_calls",
                                                   "hop1/two_search_share", "hop2/two_search_share",
                                                   "sgrpo/strata_per_prompt", "sgrpo/constant_group_share",
                                                   "time/experience_s", "time/update_s", "time/weight_sync_s")})
            for k in (0, 1, 2, 3, "4plus"):  # mechanism.py's names; 4plus: four or more calls, at step 5 only
                share = 0.0 if k == 3 or (k == 2 and step % 2) or (k == "4plus" and step != 5) else rng.random()
                rec.update({f"sgrpo/stratum{k}/share": share, f"sgrpo/stratum{k}/reward": rng.random(),
                            f"sgrpo/stratum{k}/adv_mass": rng.random() - 0.5, f"sgrpo/stratum{k}/adv_mass_san": 0.0,
                            f"sgrpo/stratum{k}/adv_mass_gn": rng.random() - 0.5})
            rows.append(rec)
        rows.append({"phase": "eval_after", "step": 20, "time": 1.7e9 + 200, "hop1/em": 0.9, "hop2/em": 0.3})
        (run / arm_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    strata = {s: {"n": 16, "share": 0.25, "em": rng.random(), "em_lo": rng.random(), "em_hi": rng.random()}
              for s in ("0", "1", "2", "3plus")}
    (run / "metrics.jsonl").write_text(json.dumps({"phase": "strata_check", "step": 0, "time": 1.7e9, "n": 64,
                                                   "strata": strata, "questions": 8, "samples_per_question": 8}) + "\n")
    (run / "environment.json").write_text(json.dumps({"device": "NVIDIA H200", "torch": "2.11.0"}))
    (run / "args.json").write_text(json.dumps({**BASE_ARGS, "steps": "20"}))
    dest = export_seed(run, 0, ARMS, tmp_path / "seeds", "s", ["--seeds", "0"], commit="abc")
    assert dest.name == "s_nvidia-h200_seed0"
    size = sum(p.stat().st_size for p in dest.iterdir())
    assert size < 50_000, size
    (seed,) = read_seeds(tmp_path / "seeds")
    grpo = seed["steps"]["GRPO"]
    assert len(grpo) == 20 and grpo[0]["wall_s"] == pytest.approx(9.3, abs=1e-3)
    assert "sgrpo/stratum2/adv_mass" in grpo[1] and "sgrpo/stratum2/adv_mass" not in grpo[0]  # absent stratum
    assert all(f"sgrpo/stratum{k}/adv_mass_gn" in grpo[1] for k in range(3))
    assert not any(k.startswith("sgrpo/stratum3/") for row in grpo for k in row)
    assert [r["step"] for r in grpo if "sgrpo/stratum4plus/adv_mass" in r] == [5]  # the merged tail is kept
    assert seed["arms"]["Random strata (alpha 0.8)"]["heldout"]["hop2/em"] == 0.3
    assert seed["settings"]["steps"] == 20 and seed["strata_warmup"]["strata"]["3plus"]["n"] == 16


def test_trap_seeds_say_whether_they_started_in_the_trap(tmp_path):
    """The trap regime's premise, per seed: two searches' EM below one search's after the warm-up."""
    trap = {"1": {"n": 40, "share": 0.5, "em": 0.4, "em_lo": 0.3, "em_hi": 0.5},
            "2": {"n": 40, "share": 0.5, "em": 0.2, "em_lo": 0.1, "em_hi": 0.3}}
    flat = {"1": {"n": 40, "share": 0.5, "em": 0.1, "em_lo": 0.0, "em_hi": 0.2},
            "2": {"n": 40, "share": 0.5, "em": 0.2, "em_lo": 0.1, "em_hi": 0.3}}
    seed_folder(tmp_path, 0, args={"task": "trap"}, strata=trap)
    seed_folder(tmp_path, 1, args={"task": "trap"}, strata=flat)
    seed_folder(tmp_path, 2, args={"task": "search"}, strata=flat)  # the search-necessary regime: no such line
    table = write_report(tmp_path / "seeds", tmp_path / "report")[0].read_text()
    by_heading = sections(table)
    trap_section = next(v for k, v in by_heading.items() if k.startswith("trap regime"))
    assert "Started in the trap (two searches' EM below one search's after the warm-up, the regime's premise): " \
           "1 of 2 seed(s); not: s1_cpu_seed1." in trap_section
    search_section = next(v for k, v in by_heading.items() if k.startswith("search regime"))
    assert "Started in the trap" not in search_section
    assert study_report.in_the_trap({"strata": trap}) and not study_report.in_the_trap({"strata": {"1": trap["1"]}})


def test_each_seeds_paired_differences_name_its_processor(tmp_path):
    """A few seeds are read one by one: each seed's own arm - GRPO, and the processor kind it ran on
    (a seed repeats itself only on one kind of CPU)."""
    for k, (isa, em2) in enumerate((("avx2 avx512f avx512_bf16", 0.75), ("avx2", 0.25))):
        run = make_run(tmp_path, k, heldout={GRPO: {"hop2/em": 0.5}, SGRPO: {"hop2/em": em2}})
        (run / "environment.json").write_text(json.dumps({"device": "cpu", "cpu_isa": isa}))
        export_seed(run, k, ARMS, tmp_path / "seeds", "s1", ["--seeds", str(k)], commit="abc")
    seeds = read_seeds(tmp_path / "seeds")
    assert [study_report.processor_kind(s) for s in seeds] == ["AVX-512 BF16", "AVX2"]
    assert study_report.processor_kind({"device": "NVIDIA H200"}) == "NVIDIA H200"
    table = write_report(tmp_path / "seeds", tmp_path / "report")[0].read_text()
    lines = [ln for ln in table.splitlines() if ln.startswith("| s1_cpu_seed") and f"{SGRPO} - GRPO" in ln]
    assert [[c.strip() for c in ln.strip("|").split("|")][:4] for ln in lines] == [
        ["s1_cpu_seed0", "AVX-512 BF16", f"{SGRPO} - GRPO", "+0.250"], ["s1_cpu_seed1", "AVX2", f"{SGRPO} - GRPO", "-0.250"]]
    assert sum(f"{RANDOM} - GRPO" in ln and ln.startswith("| s1_cpu_seed") for ln in table.splitlines()) == 2


def test_paths_table_means_shares_over_seeds_and_pools_em():
    """The trap world's paths section: per window the mean over seeds of each path's share, its EM
    pooled with share weights (every step holds the same number of two-hop trajectories), and the
    held-out paths pooled by count."""
    def rows(shares_em: list[dict]) -> list[dict]:
        return [{"step": k + 1, **{f"path/{p}/{f}": v for p, (sh, em) in d.items() for f, v in (("share", sh), ("em", em))}}
                for k, d in enumerate(shares_em)]
    a = rows([{"one_search": (0.5, 0.5), "wrong_bridge": (0.5, 0.0)}] * 4)
    b = rows([{"one_search": (1.0, 0.25)}] * 2 + [{"right_bridge": (1.0, 1.0)}] * 2)
    seeds = [{"steps": {GRPO: a}, "arms": {GRPO: {"heldout_paths": {"one_search": {"n": 3, "em": 1 / 3}}}}},
             {"steps": {GRPO: b}, "arms": {GRPO: {"heldout_paths": {"one_search": {"n": 1, "em": 1.0},
                                                                     "right_bridge": {"n": 2, "em": 0.5}}}}}]
    text = "\n".join(study_report.paths_section(seeds))
    first = row(text, GRPO)  # steps 1-4
    assert first[1:3] == ["steps 1-4", "2"]
    names = [name for _, name in study_report.PATHS]
    cells = dict(zip(names, first[3:]))
    # one search: shares 0.5 and 0.5 (mean of 1, 1, 0, 0) -> 0.50; EM (0.5*0.5*4 + 1*0.25*2) / (0.5*4 + 2) = 0.375
    assert cells["one search"] == "0.50 (0.38)" and cells["2: wrong bridge"] == "0.25 (0.00)"
    assert cells["2: right bridge"] == "0.25 (1.00)" and cells["no search"] == "-"
    held = next(ln for ln in text.splitlines() if "held-out after RL" in ln)
    held_cells = dict(zip(names, [c.strip() for c in held.strip("|").split("|")][3:]))
    assert held_cells["one search"] == "0.67 (0.50)" and held_cells["2: right bridge"] == "0.33 (0.50)"
    assert study_report.paths_section([{"steps": {GRPO: [{"step": 1, "reward": 0.1}]}, "arms": {GRPO: {}}}]) == []


def test_binomial_interval_is_clopper_pearsons():
    """The exact interval, against SciPy's beta quantiles (k = 0 and k = n are one-sided), and a bad
    count named."""
    beta = pytest.importorskip("scipy.stats").beta
    for n in (1, 4, 5, 10):
        for k in range(n + 1):
            lo, hi = study_report.binomial_interval(k, n)
            want_lo = 0.0 if k == 0 else beta.ppf(0.025, k, n - k + 1)
            want_hi = 1.0 if k == n else beta.ppf(0.975, k + 1, n - k)
            assert (lo, hi) == pytest.approx((want_lo, want_hi), abs=1e-9), (k, n)
    with pytest.raises(ValueError, match="k 5, n 4"):
        study_report.binomial_interval(5, 4)


def test_where_the_seeds_ended_counts_two_search_endings_and_em_signs(tmp_path):
    """Three seeds: Stratified GRPO ends at two searches in two (shares 1.0 and 0.5, the threshold
    counts), GRPO in none; its two-hop EM is higher than GRPO's in one seed, equal in one, lower in
    one. The section counts them, with the exact interval of each count."""
    sgrpo = [{"hop2/two_search_share": 1.0, "hop2/em": 0.75}, {"hop2/two_search_share": 0.5, "hop2/em": 0.25},
             {"hop2/two_search_share": 0.125, "hop2/em": 0.125}]
    grpo = {"hop2/two_search_share": 0.0, "hop2/em": 0.25}
    for k in range(3):
        seed_folder(tmp_path, k, heldout={GRPO: grpo, SGRPO: sgrpo[k], RANDOM: grpo})
    ends = study_report.outcomes(read_seeds(tmp_path / "seeds"))
    assert ends[SGRPO]["two"] == 2 and ends[SGRPO]["n"] == 3 and ends[SGRPO]["em2"] == (1, 1, 1)
    assert ends[GRPO]["two"] == 0 and "em2" not in ends[GRPO]
    assert ends[RANDOM]["em2"] == (0, 3, 0)
    table = write_report(tmp_path / "seeds", tmp_path / "report")[0].read_text()
    section = table[table.index("Where the seeds ended"):]
    section = section[: section.index("\n\n", section.index("| arm"))]
    lo, hi = study_report.binomial_interval(2, 3)
    assert f"| {SGRPO} " in section and "2 of 3" in section and f"[{lo:.2f}, {hi:.2f}]" in section
    assert "1 / 1 / 1" in section and "0 / 3 / 0" in section and "0 of 3" in section
