"""``--sgrpo.dump_rollouts N``: the first N prompt groups of every step as rollout records.

Written by the experience maker, which runs in one process (OpenRLHF's single controller), after
the advantages and CalibAdv are final and before the agent's per-turn slots leave
``Experience.info``; ``python -m openrlhf_sgrpo.inspect RUN_DIR`` renders them. Steps are numbered
after the last step file already in ``RUN_DIR``, so a rerun appends instead of overwriting. A run
resumed with ``--ckpt.load_enable`` continues OpenRLHF's own numbering instead: from the step of
the checkpoint it loads (DeepSpeed's ``latest`` tag, ``global_step<N>``), after dropping the
files of later steps, which the resumed run redoes (a driver killed between two checkpoints).
"""

from __future__ import annotations

import os
import re
from typing import Any

from openrlhf_sgrpo.openrlhf_ext.calibadv_hook import calibadv_config_from_args
from openrlhf_sgrpo.openrlhf_ext.config import SGRPOOptions
from openrlhf_sgrpo.rollout_records.sources import records_from_experiences
from openrlhf_sgrpo.rollout_records.store import RolloutWriter, list_step_files

PHASE = "train"
_TAG_STEP = re.compile(r"global_step(\d+)$")


def resumed_global_step(args: Any) -> int | None:
    """The step OpenRLHF resumes from (``--ckpt.load_enable`` and a checkpoint under
    ``--ckpt.path``), read from DeepSpeed's ``<ckpt.path>/_actor/latest`` tag; None otherwise."""
    ckpt = getattr(args, "ckpt", None)
    if ckpt is None or not getattr(ckpt, "load_enable", False):
        return None
    latest = os.path.join(ckpt.path, "_actor", "latest")
    try:
        with open(latest, encoding="utf-8") as f:
            match = _TAG_STEP.search(f.read().strip())
    except OSError:
        return None
    return int(match.group(1)) if match else None


class RolloutDump:
    """Writes ``RUN_DIR/rollouts/train/step_<k>.jsonl`` per call; a no-op when the flag is 0."""

    def __init__(self, args: Any, tokenizer: Any) -> None:
        options = getattr(args, "sgrpo", None)
        self.max_groups = int(getattr(options, "dump_rollouts", 0) or 0)
        self.args, self.tokenizer = args, tokenizer
        self.run_dir = getattr(options, "run_dir", None) or args.ckpt.output_dir
        self.step = 0
        if self.max_groups:
            files = [f for f in list_step_files(self.run_dir) if f.phase == PHASE]
            resumed = resumed_global_step(args)
            if resumed is None:
                self.step = max((f.step for f in files), default=0)
            else:
                for f in files:
                    if f.step > resumed:
                        f.path.unlink()
                self.step = resumed

    def __call__(self, experiences: list, opts: SGRPOOptions, advantage_key: str | None) -> None:
        if not self.max_groups or not experiences:
            return
        self.step += 1
        groups = records_from_experiences(
            experiences, self.tokenizer, self.args.rollout.n_samples_per_prompt, step=self.step, adv_cfg=opts,
            calibadv=calibadv_config_from_args(self.args), max_groups=self.max_groups, advantage_key=advantage_key)
        RolloutWriter(self.run_dir).write_step(PHASE, self.step, groups)
