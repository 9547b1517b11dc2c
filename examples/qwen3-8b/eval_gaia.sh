#!/usr/bin/env bash
# Evaluates a deep-research checkpoint on GAIA (validation set): the agent with Google search
# (Serper) and the code sandbox, up to 10 turns, GAIA's quasi-exact-match scorer, reported per
# level (gaia_level1..3). GAIA is gated on the hub: download it yourself, then
#   python examples/data/prepare_qa.py gaia --metadata GAIA/2023/validation/metadata.jsonl \
#          --out ~/data/gaia/validation.jsonl
#   MODEL=runs/deep-research-qwen3-8b/model WEB_SEARCH_URL=http://tools-host:8000/search ./eval_gaia.sh
# Google search goes through retriever_server's /search proxy, started with SERPER_API_KEY in its
# environment (python -m retriever_server.serve --port 8000); this script needs no key.
# Environment: MODEL (required), GAIA_DATA ($HOME/data/gaia/validation.jsonl), WEB_SEARCH_URL
# (http://127.0.0.1:8000/search), SANDBOX_URL (http://127.0.0.1:8080/run_code), TP (2),
# OUT ($MODEL/eval_gaia.json), LIMIT (0 = all), plus PYTHON, EXTRA_ARGS, DRY_RUN from ../lib/launch.sh.
source "$(dirname "${BASH_SOURCE[0]}")/../lib/launch.sh"

: "${MODEL:?set MODEL to the checkpoint (HF folder or hub id) to evaluate}"
GAIA_DATA="${GAIA_DATA:-$HOME/data/gaia/validation.jsonl}"
SANDBOX_URL="${SANDBOX_URL:-http://127.0.0.1:8080/run_code}"
WEB_SEARCH_URL="${WEB_SEARCH_URL:-http://127.0.0.1:8000/search}"
OUT="${OUT:-$MODEL/eval_gaia.json}"
agent_config="$(dirname "$OUT")/eval_gaia_agent.yaml"
render_agent_config "$EXAMPLES_DIR/configs/gaia_eval.yaml" "$agent_config" \
  "sandbox_url=$SANDBOX_URL" "web_search_url=$WEB_SEARCH_URL" "max_turns=10"
wait_for_health "$(health_url "$SANDBOX_URL")"
wait_for_health "$(health_url "$WEB_SEARCH_URL")"
# The agent renders the deep-research prompt from the raw question (the 'question' key).
run_eval --model "$MODEL" --data "$GAIA_DATA" --agent-config "$agent_config" --out "$OUT" \
  --input-key question --max-len 16384 --max-new-tokens 4096 --temperature 0 \
  --tensor-parallel-size "${TP:-2}" --limit "${LIMIT:-0}" --concurrency 32
