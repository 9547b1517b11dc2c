#!/usr/bin/env bash
# Stratified GRPO (alpha = 0.6) + SAPO on Qwen2.5-3B (base), the paper setting with two optimizer
# steps per rollout (mini-batch of 128 prompts of the 256 sampled, Search-R1's 2:1 ratio), so the
# importance ratio can leave 1 and SAPO's conditional KL term can act. SAPO's own defaults
# (--algo.sapo.coef 1.0, ratio_threshold 0.5, k3) apply; override them with EXTRA_ARGS.
# 200 rollouts = 400 optimizer steps (the LR warm-up covers the first 10 % of them).
#   DATA_DIR=~/data/sgrpo RETRIEVER_URL=http://retriever:8000/retrieve ./train_sapo_sgrpo_base.sh
#   DRY_RUN=1 ./train_sapo_sgrpo_base.sh     # print the parsed config, no Ray, no GPU
ESTIMATOR=stratified_grpo
ALPHA=0.6
SAPO=1
UPDATES_PER_STEP=2
MODEL_DEFAULT=Qwen/Qwen2.5-3B
CHAT=0
RUN_NAME="${RUN_NAME:-sapo-sgrpo-qwen2.5-3b-base}"
source "$(dirname "${BASH_SOURCE[0]}")/paper_settings.sh"
launch_paper_run
