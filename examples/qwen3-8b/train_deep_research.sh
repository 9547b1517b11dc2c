#!/usr/bin/env bash
# Deep-research agent: Stratified GRPO on Qwen3-8B with Google search (Serper, cached) and the
# code sandbox, VerlTool-like settings: up to 10 turns, long responses (16k tokens in all),
# strata = (search calls, code calls) signature. Not a paper table; a recipe for the tool stack.
# Google search goes through retriever_server's /search proxy, which alone holds the Serper key
# and one answer cache for all workers; start it first on the tools host:
#   SERPER_API_KEY=... python -m retriever_server.serve --host 0.0.0.0 --port 8000 --web-cache serper.sqlite
#
#   WEB_SEARCH_URL=http://tools-host:8000/search SANDBOX_URL=http://tools-host:8080/run_code ./train_deep_research.sh
#   DRY_RUN=1 ./train_deep_research.sh   # parsed config only (no Ray, no GPU, no key needed)
# The agent renders the deep-research prompt itself (it offers <code> only with that template),
# so OpenRLHF feeds it the raw question: --data.input_key question.
# Environment: MODEL (Qwen/Qwen3-8B), DATA_DIR ($HOME/data/sgrpo-deep, made by
#   python examples/data/prepare_qa.py qa --hub --template deep_research --out ~/data/sgrpo-deep
# : train.jsonl with each row's raw `question`), WEB_SEARCH_URL (http://127.0.0.1:8000/search),
# SANDBOX_URL (http://127.0.0.1:8080/run_code), NUM_NODES (1), GPUS_PER_NODE (8), RUN_NAME
# (deep-research-qwen3-8b), SAVE_PATH (./runs/$RUN_NAME; with NUM_NODES > 1: absolute, on storage
# every node mounts; docs/multinode.md), STEPS (200),
# plus PYTHON, RAY_ADDRESS, SHARED_FS, EXTRA_ARGS, WANDB_API_KEY, DRY_RUN, SKIP_HEALTH_CHECK from ../lib/launch.sh.
source "$(dirname "${BASH_SOURCE[0]}")/../lib/launch.sh"

readonly MAX_TURNS=10
readonly TOKENS_PER_TURN=4096
readonly TOKENS_PER_OBS=2048
readonly MAX_LEN=16384               # prompt + every turn + every observation
readonly PROMPTS_PER_STEP=128
readonly SAMPLES_PER_PROMPT=8
readonly TP=2                        # vLLM tensor parallel size for the 8B policy

MODEL="${MODEL:-Qwen/Qwen3-8B}"
DATA_DIR="${DATA_DIR:-$HOME/data/sgrpo-deep}"
SANDBOX_URL="${SANDBOX_URL:-http://127.0.0.1:8080/run_code}"
WEB_SEARCH_URL="${WEB_SEARCH_URL:-http://127.0.0.1:8000/search}"
NUM_NODES="${NUM_NODES:-1}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
STEPS="${STEPS:-200}"
RUN_NAME="${RUN_NAME:-deep-research-qwen3-8b}"
SAVE_PATH="${SAVE_PATH:-./runs/$RUN_NAME}"
export SGRPO_AGENT_CONFIG="$SAVE_PATH/agent_config.yaml"
render_agent_config "$EXAMPLES_DIR/configs/deep_research.yaml" "$SGRPO_AGENT_CONFIG" \
  "sandbox_url=$SANDBOX_URL" "web_search_url=$WEB_SEARCH_URL" "max_turns=$MAX_TURNS" \
  "max_obs_tokens=$TOKENS_PER_OBS" "max_tokens_per_turn=$TOKENS_PER_TURN"
wait_for_health "$(health_url "$SANDBOX_URL")"
wait_for_health "$(health_url "$WEB_SEARCH_URL")"

gpus=$((NUM_NODES * GPUS_PER_NODE))
args=(
  --actor.num_nodes "$NUM_NODES" --actor.num_gpus_per_node "$GPUS_PER_NODE"
  --ref.num_nodes "$NUM_NODES" --ref.num_gpus_per_node "$GPUS_PER_NODE"
  --vllm.num_engines $((gpus / TP)) --vllm.tensor_parallel_size "$TP" --vllm.gpu_memory_utilization 0.6
  --train.colocate_all --vllm.enable_sleep --ds.enable_sleep
  --ds.zero_stage 3 --ds.param_dtype bf16 --ds.packing_samples --actor.gradient_checkpointing_enable
  --ds.adam_offload
  --actor.model_name_or_path "$MODEL"
  --data.prompt_dataset "$DATA_DIR/train.jsonl" --data.input_key question --data.label_key answers
  --data.max_samples $((STEPS * PROMPTS_PER_STEP)) --data.max_len "$MAX_LEN"
  --train.agent_func_path "$(agent_func_path)"
  --rollout.batch_size "$PROMPTS_PER_STEP" --rollout.n_samples_per_prompt "$SAMPLES_PER_PROMPT"
  --train.batch_size $((PROMPTS_PER_STEP * SAMPLES_PER_PROMPT)) --train.num_episodes 1 --train.max_epochs 1
  --rollout.micro_batch_size 4 --train.micro_batch_size 1 --train.dynamic_batch_enable
  --rollout.max_tokens_per_gpu 32768 --train.max_tokens_per_gpu 16384
  --actor.adam.lr 1e-6 --actor.lr_warmup_ratio 0.1 --actor.lr_scheduler constant_with_warmup
  --actor.eps_clip 0.2 --algo.kl.use_loss --algo.kl.estimator k3 --algo.kl.init_coef 0.001
  --rollout.temperature 1.0 --rollout.top_p 1.0 --rollout.max_new_tokens "$TOKENS_PER_TURN"
  --algo.advantage.estimator stratified_grpo --algo.advantage.sgrpo_alpha 0.6
  --algo.advantage.stratify_by search_calls,code_calls
  --logger.tensorboard_dir "$SAVE_PATH/tensorboard"
  --ckpt.output_dir "$SAVE_PATH/model" --ckpt.path "$SAVE_PATH/checkpoints" --ckpt.save_steps 25 --ckpt.save_hf
)
run_cli "${args[@]}"
