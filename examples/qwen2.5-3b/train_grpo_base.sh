#!/usr/bin/env bash
# The paper's baseline: plain GRPO (OpenRLHF's group_norm estimator, no stratification) on
# Qwen2.5-3B (base), with every other setting identical to train_sgrpo_base.sh.
ESTIMATOR=group_norm
ALPHA=0
MODEL_DEFAULT=Qwen/Qwen2.5-3B
CHAT=0
SAPO=0
UPDATES_PER_STEP=1
RUN_NAME="${RUN_NAME:-grpo-qwen2.5-3b-base}"
source "$(dirname "${BASH_SOURCE[0]}")/paper_settings.sh"
launch_paper_run
