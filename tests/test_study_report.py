"""The study's report regenerated from committed seed folders (openrlhf_sgrpo/demo/study_report.py):
its numbers against ones computed here by hand, and a missing or malformed folder named."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from openrlhf_sgrpo.demo import study_report
from openrlhf_sgrpo.demo.study_report import SeedFolderError, read_seeds, stats, summarize, t975

# held-out EM 2-hop of GRPO over three seeds, and the last step's reward
EM2 = [0.125, 0.25, 0.5]
LAST_REWARD = [0.4, 0.7, 0.55]
WARM_EM2 = [0.0, 0.125, 0.125]  # held-out EM 2-hop after the warm-up, where every arm starts


def write_seed(root: Path, name: str, seed: int, em2: float, last_reward: float, session: str = "s1",
               mechanism: bool = True, warm_em2: float | None = None) -> Path:
    """A seed folder in the committed form, GRPO and Stratified GRPO, three steps each."""
    folder = root / name
    folder.mkdir(parents=True)
    arms = {}
    lines = []
    for label, shift in (("GRPO", 0.0), ("Stratified GRPO (alpha 0.8)", 0.1)):
        arms[label] = {"dir": "x", "estimator": "grpo", "alpha": 0.0, "stratify_by": None, "steps": 3,
                       "heldout": {"hop1/em": 0.9, "hop2/em": em2 + shift, "search_calls": 1.0 + shift,
                                   "hop2/two_search_share": 0.2 + shift}}
        for step in (1, 2, 3):
            row = {"arm": label, "step": step, "time": 1000.0 + 10 * step, "wall_s": 7.0 + seed + shift,
                   "reward": last_reward + shift if step == 3 else 0.1, "search_calls": 1.0 + step * shift,
                   "hop2/two_search_share": 0.3}
            if mechanism:
                row.update({"sgrpo/stratum1/adv_mass": -0.5 * step, "sgrpo/stratum2/adv_mass": 0.5 * step})
            lines.append(json.dumps(row))
    meta = {"schema": 1, "session": session, "device": "NVIDIA H200", "seed": seed, "commit": "abc", "argv": [],
            "environment": {}, "after_warmup": None if warm_em2 is None else {"hop2/em": warm_em2}, "arms": arms}
    (folder / "seed.json").write_text(json.dumps(meta))
    (folder / "steps.jsonl").write_text("\n".join(lines) + "\n")
    return folder


@pytest.fixture
def seeds_root(tmp_path: Path) -> Path:
    root = tmp_path / "seeds"
    for k, (em2, r) in enumerate(zip(EM2, LAST_REWARD)):
        write_seed(root, f"s1_nvidia-h200_seed{k}", k, em2, r, mechanism=k != 2, warm_em2=WARM_EM2[k])
    return root


def test_t_quantiles_are_students():
    # t_{0.975} for 2 and 10 degrees of freedom (any table); large df approaches the normal's 1.96
    assert t975(2) == pytest.approx(4.302653, abs=1e-6)
    assert t975(10) == pytest.approx(2.228139, abs=1e-6)
    assert t975(120) == pytest.approx(1.979930, abs=1e-4)
    scipy_stats = pytest.importorskip("scipy.stats")
    for df in range(1, 61):
        assert t975(df) == pytest.approx(scipy_stats.t.ppf(0.975, df), rel=2e-5), df


def test_mean_std_and_interval_over_seeds_match_a_hand_computation(seeds_root):
    seeds = read_seeds(seeds_root)
    cols = summarize(seeds)["GRPO"]
    n = len(EM2)
    mean = sum(EM2) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in EM2) / (n - 1))
    half = 4.302652729911275 * std / math.sqrt(n)  # t_{0.975, 2}
    got = cols["EM 2-hop"]
    assert got["n"] == 3
    assert (got["mean"], got["std"], got["lo"], got["hi"]) == pytest.approx((mean, std, mean - half, mean + half))
    r_mean = sum(LAST_REWARD) / n
    assert cols["last-step reward"]["mean"] == pytest.approx(r_mean)
    assert cols["last-step reward"]["std"] == pytest.approx(0.15)  # 0.4, 0.7, 0.55: deviations ±0.15, 0
    # the other arm is shifted by 0.1 in every seed: the same spread, its mean 0.1 higher
    other = summarize(seeds)["Stratified GRPO (alpha 0.8)"]["EM 2-hop"]
    assert other["mean"] == pytest.approx(mean + 0.1) and other["std"] == pytest.approx(std)
    assert stats([0.5])["n"] == 1 and math.isnan(stats([0.5])["std"])


def test_report_writes_table_and_figure_with_step_times_per_session(seeds_root, tmp_path, capsys):
    write_seed(seeds_root, "s2_cpu_seed0", 0, 0.0, 0.0, session="s2")
    out = tmp_path / "report"
    assert study_report.main(["--results", str(seeds_root), "--out", str(out)]) == 0
    table = (out / "table.md").read_text()
    assert "4 seed folder(s) from 2 session(s)" in table
    assert "note: seed 0 is in 2 folders (s1_nvidia-h200_seed0, s2_cpu_seed0)" in table
    assert "note: seed 1" not in table
    # GRPO's EM 2-hop over the four seeds [0.125, 0.25, 0.5, 0.0], formatted as the cell is
    vals = EM2 + [0.0]
    mean = sum(vals) / 4
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / 3)
    half = 3.1824463052837 * std / 2
    assert f"{mean:.3f} ± {std:.3f} [{mean - half:.3f}, {mean + half:.3f}]" in table
    # the warm-up row: the three seeds that recorded it (s2's did not), its last-step reward "-"
    w_mean = sum(WARM_EM2) / 3
    w_std = math.sqrt(sum((v - w_mean) ** 2 for v in WARM_EM2) / 2)
    w_half = 4.302652729911275 * w_std / math.sqrt(3)
    warm_row = next(line for line in table.splitlines() if line.startswith("| after warm-up (start) "))
    cells = [c.strip() for c in warm_row.strip("|").split("|")]
    assert cells[1] == "3" and cells[-1] == "-"
    assert f"{w_mean:.3f} ± {w_std:.3f} [{w_mean - w_half:.3f}, {w_mean + w_half:.3f}]" in cells
    # step times: session s1's GRPO seeds ran 7, 8, 9 s per step; s2's one seed 7 s, alone
    assert "| s1 " in table and "8.000 ± 1.000" in table
    assert (out / "figure.png").stat().st_size > 10_000
    assert "wrote" in capsys.readouterr().out


def test_missing_and_malformed_seed_folders_are_named(seeds_root, tmp_path, capsys):
    assert study_report.main(["--results", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o")]) == 2
    assert "nowhere" in capsys.readouterr().err
    broken = seeds_root / "s1_nvidia-h200_seed1"
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
    steps with every per-step key the trainer logs; the demo's 2 tool turns give strata 0-2 (the
    trainer logs 0-3; 3 never occurs, 2 not at every step)."""
    import random

    from openrlhf_sgrpo.demo.study_seeds import export_seed

    rng = random.Random(0)
    run = tmp_path / "seed_0"
    arms = "grpo,sgrpo:0.8,random:0.8"
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
    (run / "environment.json").write_text(json.dumps({"device": "NVIDIA H200", "torch": "2.11.0"}))
    dest = export_seed(run, 0, arms, tmp_path / "seeds", "s", ["--seeds", "0"], commit="abc")
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
