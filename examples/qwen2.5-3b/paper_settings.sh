# shellcheck shell=bash
# The paper's Qwen2.5-3B setting, shared by the three launch scripts here (sourced, not run).
# Each script sets ESTIMATOR, ALPHA, MODEL_DEFAULT, CHAT, SAPO, UPDATES_PER_STEP and RUN_NAME, then
# calls launch_paper_run. All but RUN_NAME are the script's own: it assigns them, so a variable of the
# same name exported in your shell (an `export SAPO=1`) cannot change what a script runs.
#
# "200 steps" in OpenRLHF's terms: a step is one rollout of --rollout.batch_size prompts
# followed by the policy update(s) on its samples. OpenRLHF reads --data.max_samples prompts
# (the first ones of train.jsonl, which prepare_qa.py shuffles), so
#     steps            = max_samples / rollout.batch_size           = 51,200 / 256 = 200
#     optimizer steps  = max_samples * n_samples / train.batch_size = 51,200 * 8 / 2,048 = 200
# i.e. mini-batch = global batch = 256 prompts (2,048 samples): one on-policy update per step,
# and the LR scheduler (warm-up 0.1 = 20 steps) sees the same 200 steps.
#
# Environment (defaults in parentheses):
#   MODEL            policy checkpoint or hub id                 (MODEL_DEFAULT of the script)
#   DATA_DIR         prepare_qa.py output with train.jsonl       ($HOME/data/sgrpo)
#   RETRIEVER_URL    one retriever every node can reach          (http://127.0.0.1:8000/retrieve)
#   NUM_NODES        nodes in the Ray cluster                    (1)
#   GPUS_PER_NODE    GPUs per node                               (8)
#   SAVE_PATH        run folder                                  (./runs/$RUN_NAME)
#                    with NUM_NODES > 1: absolute, on storage every node mounts at that
#                    path (or name that folder with SHARED_FS); see docs/multinode.md
#   RUN_NAME         names the default SAVE_PATH                 (the script's, e.g. sgrpo-qwen2.5-3b-base)
#   EVAL_DATASET     optional test.jsonl evaluated every EVAL_STEPS (50) steps
# plus PYTHON, RAY_ADDRESS, SHARED_FS, EXTRA_ARGS, WANDB_API_KEY, DRY_RUN, SKIP_HEALTH_CHECK from
# ../lib/launch.sh (the full list with defaults: docs/deploy.md, "Every variable the scripts read").

source "$(dirname "${BASH_SOURCE[0]}")/../lib/launch.sh"

# Hyper-parameters of the paper (edit here, not per script, so the three runs stay comparable).
readonly PROMPTS_PER_STEP=256        # global batch (prompts per rollout)
readonly PROMPTS_PER_UPDATE=256      # mini-batch (prompts per optimizer step)
readonly SAMPLES_PER_PROMPT=8
readonly TRAIN_STEPS=200
readonly LR=1e-6
readonly WARMUP_RATIO=0.1
readonly KL_COEF=0.001
readonly CLIP_EPS=0.2
readonly TEMPERATURE=1.0
readonly TOP_P=1.0
readonly MAX_TURNS=4
readonly TOKENS_PER_TURN=500         # generated tokens per assistant turn
readonly TOKENS_PER_OBS=500          # tokens per <information> block
readonly TOPK=3                      # passages per search
readonly PROMPT_BUDGET=512           # the Search-R1 prompt is ~200 tokens
readonly OBS_WRAPPER_TOKENS=16       # "\n\n<information>" + "</information>\n\n" around a capped observation (8 in Qwen2.5's vocabulary)
# Worst case: every tool turn at its cap (action + observation), then the final answer turn,
# which must still get its TOKENS_PER_TURN (tests/test_length_budget.py runs that case).
readonly MAX_LEN=$((PROMPT_BUDGET + MAX_TURNS * (TOKENS_PER_TURN + TOKENS_PER_OBS + OBS_WRAPPER_TOKENS) + TOKENS_PER_TURN))

# require_shared_url URL: multi-node runs need one service every node reaches, not loopback.
require_shared_url() {
  local name="$1" url="$2"
  if [ "${NUM_NODES}" -gt 1 ] && [[ "$url" =~ ://(127\.|localhost|\[::1\]) ]]; then
    echo "error: $name=$url is a loopback address but NUM_NODES=$NUM_NODES; point it at the one shared" \
         "service every node can reach (docs/deploy.md, 'Multi-node retriever')" >&2
    exit 2
  fi
}

launch_paper_run() {
  # UPDATES_PER_STEP > 1 splits each rollout into that many mini-batches (optimizer steps); the
  # SAPO example uses 2, Search-R1's ratio (512 prompts per rollout, 256 per mini-batch). With one
  # update per rollout the policy that sampled is the one updated, every importance ratio is 1,
  # and SAPO's term is exactly 0 (docs/sapo_calibadv.md).
  local updates="$UPDATES_PER_STEP"
  if [ $((PROMPTS_PER_UPDATE % updates)) -ne 0 ]; then
    echo "error: UPDATES_PER_STEP=$updates does not divide $PROMPTS_PER_UPDATE prompts" >&2
    exit 2
  fi
  MODEL="${MODEL:-$MODEL_DEFAULT}"
  DATA_DIR="${DATA_DIR:-$HOME/data/sgrpo}"
  RETRIEVER_URL="${RETRIEVER_URL:-http://127.0.0.1:8000/retrieve}"
  NUM_NODES="${NUM_NODES:-1}"
  GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
  SAVE_PATH="${SAVE_PATH:-./runs/$RUN_NAME}"
  require_shared_url RETRIEVER_URL "$RETRIEVER_URL"

  export SGRPO_AGENT_CONFIG="$SAVE_PATH/agent_config.yaml"
  render_agent_config "$EXAMPLES_DIR/configs/search_r1_base.yaml" "$SGRPO_AGENT_CONFIG" \
    "retriever_url=$RETRIEVER_URL" "max_turns=$MAX_TURNS" "topk=$TOPK" "max_obs_tokens=$TOKENS_PER_OBS" \
    "max_tokens_per_turn=$TOKENS_PER_TURN"
  wait_for_health "$(health_url "$RETRIEVER_URL")"

  local gpus=$((NUM_NODES * GPUS_PER_NODE))
  local -a args=(
    # placement: actor, reference and vLLM share every GPU (hybrid engine)
    --actor.num_nodes "$NUM_NODES" --actor.num_gpus_per_node "$GPUS_PER_NODE"
    --ref.num_nodes "$NUM_NODES" --ref.num_gpus_per_node "$GPUS_PER_NODE"
    --vllm.num_engines "$gpus" --vllm.tensor_parallel_size 1 --vllm.gpu_memory_utilization 0.6
    --train.colocate_all --vllm.enable_sleep --ds.enable_sleep
    --ds.zero_stage 3 --ds.param_dtype bf16 --ds.packing_samples --actor.gradient_checkpointing_enable
    # model and data
    --actor.model_name_or_path "$MODEL"
    --data.prompt_dataset "$DATA_DIR/train.jsonl" --data.input_key prompt --data.label_key answers
    --data.max_samples $((TRAIN_STEPS * PROMPTS_PER_STEP)) --data.max_len "$MAX_LEN"
    --train.agent_func_path "$(agent_func_path)"
    # batch and steps (see the header)
    --rollout.batch_size "$PROMPTS_PER_STEP" --rollout.n_samples_per_prompt "$SAMPLES_PER_PROMPT"
    --train.batch_size $((PROMPTS_PER_UPDATE / updates * SAMPLES_PER_PROMPT))
    --train.num_episodes 1 --train.max_epochs 1
    --rollout.micro_batch_size 16 --train.micro_batch_size 4
    # optimisation
    --actor.adam.lr "$LR" --actor.lr_warmup_ratio "$WARMUP_RATIO" --actor.lr_scheduler constant_with_warmup
    --actor.eps_clip "$CLIP_EPS"
    --algo.kl.use_loss --algo.kl.estimator k3 --algo.kl.init_coef "$KL_COEF"
    # sampling: TOKENS_PER_TURN is the generation budget of one turn
    --rollout.temperature "$TEMPERATURE" --rollout.top_p "$TOP_P" --rollout.max_new_tokens "$TOKENS_PER_TURN"
    # advantage estimator of this run
    --algo.advantage.estimator "$ESTIMATOR"
    # logging and checkpoints
    --logger.tensorboard_dir "$SAVE_PATH/tensorboard"
    --ckpt.output_dir "$SAVE_PATH/model" --ckpt.path "$SAVE_PATH/checkpoints" --ckpt.save_steps 50 --ckpt.save_hf
  )
  if [ "$ESTIMATOR" != group_norm ]; then
    args+=(--algo.advantage.sgrpo_alpha "$ALPHA" --algo.advantage.stratify_by tool_calls)
  fi
  if [ "$CHAT" = 1 ]; then args+=(--data.apply_chat_template); fi
  if [ "$SAPO" = 1 ]; then args+=(--algo.sapo.enable); fi
  if [ -n "${EVAL_DATASET:-}" ]; then
    args+=(--eval.dataset "$EVAL_DATASET" --eval.steps "${EVAL_STEPS:-50}" --eval.n_samples_per_prompt 1
           --eval.temperature 0.0)
  fi
  run_cli "${args[@]}"
}
