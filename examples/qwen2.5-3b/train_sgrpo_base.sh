#!/usr/bin/env bash
# Reproduces the paper's main result: Stratified GRPO (alpha = 0.6) on Qwen2.5-3B (base),
# Search-R1 setting, 8 GPUs, 200 steps. Settings and environment: paper_settings.sh.
#   DATA_DIR=~/data/sgrpo RETRIEVER_URL=http://retriever:8000/retrieve ./train_sgrpo_base.sh
#   DRY_RUN=1 ./train_sgrpo_base.sh     # print the parsed config, no Ray, no GPU
ESTIMATOR=stratified_grpo
ALPHA=0.6
MODEL_DEFAULT=Qwen/Qwen2.5-3B
CHAT=0
SAPO=0
UPDATES_PER_STEP=1
RUN_NAME="${RUN_NAME:-sgrpo-qwen2.5-3b-base}"
source "$(dirname "${BASH_SOURCE[0]}")/paper_settings.sh"
launch_paper_run
