"""What of ``scripts/gpu_smoke.py`` a CPU can check: its data, both runs' flags through OpenRLHF's
own parser (``--dry-run``), and the per-step table read back from logs that OpenRLHF's own
``TensorboardLogger`` wrote, failing on a missing step or monitor. The GPU run itself is recorded
in docs/records/gpu_sessions.md whenever a session has a GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from openrlhf_sgrpo.cli import tb_summary

REPO = Path(__file__).resolve().parent.parent


def write_openrlhf_log(tb_dir: Path, steps: list[int], keys: list[str]) -> None:
    """A status dict per step, as PPOTrainer.fit hands it to OpenRLHF's TensorboardLogger."""
    from openrlhf.utils.logging_utils import TensorboardLogger

    logger = TensorboardLogger(SimpleNamespace(logger=SimpleNamespace(
        tensorboard_dir=str(tb_dir), wandb=SimpleNamespace(run_name="smoke"))))
    for step in steps:
        status = {key: step / 10 for key in keys}
        status["generated_samples"] = ["a sample", 0.5]
        logger.log_train(step, status)
    logger.close()


def test_summary_reads_openrlhfs_log_and_fails_on_a_missing_step_or_monitor(tmp_path, capsys):
    keys = ["reward", "tool_calls", "sgrpo/strata_per_prompt", "sgrpo/var_reduction", "sapo/term"]
    write_openrlhf_log(tmp_path / "ok", [1, 2, 3], keys)
    args = [str(tmp_path / "ok"), "--steps", "3", "--require", "sapo/term", "--require", "reward"]
    assert tb_summary.main(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| step | reward | tool_calls |") and len(out) == 2 + 3
    assert out[-1].split("|")[1:3] == [" 3 ", " 0.3000 "]

    write_openrlhf_log(tmp_path / "short", [1, 2], keys)
    assert tb_summary.main([str(tmp_path / "short"), "--steps", "3"]) == 1
    assert "expected steps 1..3, the log has [1, 2]" in capsys.readouterr().err
    assert tb_summary.main([str(tmp_path / "ok"), "--require", "calibadv/mean_turn_score"]) == 1
    assert "train/calibadv/mean_turn_score never logged" in capsys.readouterr().err
    assert tb_summary.main([str(tmp_path / "absent")]) == 2


@pytest.mark.slow
def test_dry_run_prepares_data_and_both_runs_parse_with_openrlhfs_parser(tmp_path):
    out = tmp_path / "smoke"
    proc = subprocess.run([sys.executable, "scripts/gpu_smoke.py", "--dry-run", "--out", str(out), "--steps", "2"],
                          cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    commands = [line for line in proc.stdout.splitlines() if line.startswith("[gpu_smoke]")]
    assert len(commands) == 2 and all("--dry_run" in c for c in commands)
    assert "--algo.sapo.enable" in commands[1] and "--algo.calibadv.enable" in commands[1]
    assert "--train.batch_size 32" in commands[0] and "--train.batch_size 16" in commands[1]  # 2 updates/rollout
    rows = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 4 and all(r["question"] and r["answers"] for r in rows)
    assert "retriever_url: http://127.0.0.1:" in (out / "agent_config.yaml").read_text()
