#!/usr/bin/env bash
# Evaluates a checkpoint on the paper's 7 QA benchmarks (NQ, TriviaQA, PopQA, HotpotQA, 2Wiki,
# MuSiQue, Bamboogle): one greedy trajectory per question with the Search-R1 agent (4 turns,
# top-3 passages, 500-token observations), exact match per benchmark, as in the paper's table.
#   MODEL=runs/sgrpo-qwen2.5-3b-base/model ./eval_qa.sh
# Environment: MODEL (required), DATA_DIR ($HOME/data/sgrpo: prepare_qa.py output with
# test.jsonl), RETRIEVER_URL (http://127.0.0.1:8000/retrieve), CHAT (0; 1 for instruct models:
# the prompt is sent as the user turn), TP (1), OUT ($MODEL/eval_qa.json), LIMIT (0 = all),
# plus PYTHON, EXTRA_ARGS, DRY_RUN from ../lib/launch.sh.
source "$(dirname "${BASH_SOURCE[0]}")/../lib/launch.sh"

: "${MODEL:?set MODEL to the checkpoint (HF folder or hub id) to evaluate}"
DATA_DIR="${DATA_DIR:-$HOME/data/sgrpo}"
RETRIEVER_URL="${RETRIEVER_URL:-http://127.0.0.1:8000/retrieve}"
OUT="${OUT:-$MODEL/eval_qa.json}"
agent_config="$(dirname "$OUT")/eval_qa_agent.yaml"
template=none
if [ "${CHAT:-0}" = 1 ]; then template=search_r1_chat; fi

render_agent_config "$EXAMPLES_DIR/configs/search_r1_base.yaml" "$agent_config" \
  "retriever_url=$RETRIEVER_URL" "max_turns=4" "topk=3" "max_obs_tokens=500" "template=$template"
wait_for_health "$(health_url "$RETRIEVER_URL")"
# CHAT=1: the agent renders the chat prompt from the raw question (the 'question' key).
input_key=prompt
if [ "${CHAT:-0}" = 1 ]; then input_key=question; fi
run_eval --model "$MODEL" --data "$DATA_DIR/test.jsonl" --agent-config "$agent_config" --out "$OUT" \
  --input-key "$input_key" --max-len 4512 --max-new-tokens 500 --temperature 0 \
  --tensor-parallel-size "${TP:-1}" --limit "${LIMIT:-0}"
