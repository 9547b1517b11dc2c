#!/usr/bin/env bash
# Reproduces the paper's instruct result: Stratified GRPO (alpha = 0.8) on Qwen2.5-3B-Instruct;
# the Search-R1 instruction is sent as the user turn (--data.apply_chat_template).
# Otherwise the same setting as train_sgrpo_base.sh (paper_settings.sh).
ESTIMATOR=stratified_grpo
ALPHA=0.8
MODEL_DEFAULT=Qwen/Qwen2.5-3B-Instruct
CHAT=1
SAPO=0
UPDATES_PER_STEP=1
RUN_NAME="${RUN_NAME:-sgrpo-qwen2.5-3b-instruct}"
source "$(dirname "${BASH_SOURCE[0]}")/paper_settings.sh"
launch_paper_run
