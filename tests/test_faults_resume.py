"""Resuming on the cluster path, what runs without CUDA (docs/deploy.md, "Resuming a cluster run
after the driver dies"):

- our CLI (OpenRLHF 0.11.2's own parser plus our flags) takes the resume flags that section names,
  keeps their values and refuses none of them next to our estimator's flags;
- the rollout records (``--sgrpo.dump_rollouts``) of a run resumed with ``--ckpt.load_enable``
  continue OpenRLHF's step numbering from the checkpoint's ``global_step`` (DeepSpeed's ``latest``
  tag) and drop the files of steps after it, which the resumed run redoes; without
  ``--ckpt.load_enable`` a rerun still numbers after the files it finds.
The single-machine runner's SIGKILL-and-resume test is in tests/test_faults_local.py.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from types import SimpleNamespace

from openrlhf_sgrpo.cli.train_ppo_ray import parse_config
from openrlhf_sgrpo.openrlhf_ext.rollout_dump import RolloutDump
from openrlhf_sgrpo.rollout_records.store import list_step_files, step_path

DEPLOY = Path(__file__).resolve().parents[1] / "docs" / "deploy.md"
BASE = ["--actor.model_name_or_path", "Qwen/Qwen2.5-3B", "--train.agent_func_path", "agent_env/openrlhf_agent.py",
        "--rollout.n_samples_per_prompt", "8", "--algo.advantage.estimator", "stratified_grpo"]


def _resume_lines() -> list[list[str]]:
    """The flag lines of the deploy section's "your own command" block (the one that marks its
    first run; the launch scripts' block before it is run by tests/test_docs_commands.py), comments
    cut."""
    text = DEPLOY.read_text()
    section = text[text.index("# Resuming a cluster run after the driver dies"):]  # its heading, any level
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    block = next(b for b in blocks if "# first run" in b)
    return [shlex.split(line.split("#")[0]) for line in block.splitlines() if line.strip()]


def test_the_documented_resume_flags_parse_with_openrlhfs_parser_and_keep_their_values(tmp_path):
    first, resume = _resume_lines()
    assert "--ckpt.load_enable" in resume and "--ckpt.load_enable" not in first
    assert [a for a in resume if a != "--ckpt.load_enable"] == first  # the same command plus one flag
    args = parse_config(BASE + resume)
    ckpt = args.ckpt
    assert ckpt.load_enable is True and ckpt.save_steps == 10 and ckpt.max_num == 3
    assert ckpt.path == "/shared/ckpt/sgrpo-3b"
    assert parse_config(BASE).ckpt.save_steps == -1  # OpenRLHF's default: no checkpoint at all


def _write_steps(run_dir: Path, steps: range) -> None:
    for step in steps:
        path = step_path(run_dir, "train", step)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text('{"step": %d}\n' % step)


def _dump_args(run_dir: Path, ckpt_path: Path, load_enable: bool) -> SimpleNamespace:
    return SimpleNamespace(sgrpo=SimpleNamespace(dump_rollouts=2, run_dir=str(run_dir)),
                           ckpt=SimpleNamespace(path=str(ckpt_path), load_enable=load_enable, output_dir=str(run_dir)))


def test_records_of_a_resumed_cluster_run_continue_the_checkpoints_numbering(tmp_path):
    run_dir, ckpt = tmp_path / "run", tmp_path / "ckpt"
    _write_steps(run_dir, range(1, 6))  # steps 4 and 5 ran after the last checkpoint (step 3)
    (ckpt / "_actor").mkdir(parents=True)
    (ckpt / "_actor" / "latest").write_text("global_step3")  # what DeepSpeed's save_checkpoint writes
    dump = RolloutDump(_dump_args(run_dir, ckpt, load_enable=True), tokenizer=None)
    assert dump.step == 3  # the next step it writes is 4, as OpenRLHF's global_step
    assert [f.step for f in list_step_files(run_dir)] == [1, 2, 3]


def test_a_rerun_without_load_enable_numbers_after_the_files_it_finds(tmp_path):
    run_dir, ckpt = tmp_path / "run", tmp_path / "ckpt"
    _write_steps(run_dir, range(1, 4))
    (ckpt / "_actor").mkdir(parents=True)
    (ckpt / "_actor" / "latest").write_text("global_step1")
    assert RolloutDump(_dump_args(run_dir, ckpt, load_enable=False), tokenizer=None).step == 3
    # load_enable with no checkpoint yet (the first run of a resumable command): the files decide
    assert RolloutDump(_dump_args(run_dir, tmp_path / "none", load_enable=True), tokenizer=None).step == 3
    assert [f.step for f in list_step_files(run_dir)] == [1, 2, 3]
