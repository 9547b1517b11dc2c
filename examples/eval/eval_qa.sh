#!/usr/bin/env bash
# Evaluates a checkpoint on the paper's 7 QA benchmarks (NQ, TriviaQA, PopQA, HotpotQA, 2Wiki,
# MuSiQue, Bamboogle): one greedy trajectory per question with the Search-R1 agent (4 turns,
# top-3 passages, 500-token observations), exact match per benchmark (the rows' `datasource`),
# as in the paper's table. Runs `python -m openrlhf_sgrpo.eval` on vLLM.
#   MODEL=runs/sgrpo-qwen2.5-3b-base/model ./eval_qa.sh
# Environment: MODEL (required, an HF folder), DATA_DIR ($HOME/data/sgrpo: prepare_qa.py output
# with test.jsonl), RETRIEVER_URL (http://127.0.0.1:8000/retrieve), CHAT (0; 1 for instruct
# models: Search-R1's chat prompt), TP (1), OUT ($MODEL/eval_qa: predictions.jsonl and
# summary.json, resumable), LIMIT (questions per benchmark; unset = all), plus PYTHON,
# EXTRA_ARGS, DRY_RUN from ../lib/launch.sh.
source "$(dirname "${BASH_SOURCE[0]}")/../lib/launch.sh"

: "${MODEL:?set MODEL to the checkpoint (an HF model folder) to evaluate}"
DATA_DIR="${DATA_DIR:-$HOME/data/sgrpo}"
RETRIEVER_URL="${RETRIEVER_URL:-http://127.0.0.1:8000/retrieve}"
OUT="${OUT:-$MODEL/eval_qa}"
agent_config="$OUT/agent.yaml"
# The agent renders Search-R1's prompt from each row's raw question (the text prepare_qa.py
# puts in its 'prompt' column for base models; the chat turn for instruct models).
template=search_r1_base
if [ "${CHAT:-0}" = 1 ]; then template=search_r1_chat; fi

render_agent_config "$EXAMPLES_DIR/configs/search_r1_base.yaml" "$agent_config" \
  "retriever_url=$RETRIEVER_URL" "max_turns=4" "topk=3" "max_obs_tokens=500" "template=$template"
wait_for_health "$(health_url "$RETRIEVER_URL")"
limit=()
if [ -n "${LIMIT:-}" ]; then limit=(--limit "$LIMIT"); fi
run_eval --model "$MODEL" --engine vllm --tensor-parallel-size "${TP:-1}" --agent-config "$agent_config" \
  --data "$DATA_DIR/test.jsonl" --max-len 4512 --max-tokens-per-turn 500 --out "$OUT" "${limit[@]}"
