#!/usr/bin/env bash
# Evaluates a deep-research checkpoint on GAIA (validation set): the agent with Google search
# (Serper) and the code sandbox, up to 10 turns, GAIA's quasi-exact-match scorer, accuracy per
# level. Runs `python -m openrlhf_sgrpo.eval --gaia` on vLLM. GAIA is gated on the hub: download
# it yourself, then
#   MODEL=runs/deep-research-qwen3-8b/model GAIA_METADATA=GAIA/2023/validation/metadata.jsonl \
#   WEB_SEARCH_URL=http://tools-host:8000/search ./eval_gaia.sh
# Google search goes through retriever_server's /search proxy, started with SERPER_API_KEY in its
# environment (python -m retriever_server.serve --port 8000); this script needs no key.
# Environment: MODEL (required, an HF folder), GAIA_METADATA ($HOME/data/gaia/2023/validation/
# metadata.jsonl; attached files are read next to it), WEB_SEARCH_URL (http://127.0.0.1:8000/search),
# SANDBOX_URL (http://127.0.0.1:8080/run_code), TP (2), OUT ($MODEL/eval_gaia: predictions.jsonl
# and summary.json, resumable), LIMIT (unset = all), plus PYTHON, EXTRA_ARGS, DRY_RUN from ../lib/launch.sh.
source "$(dirname "${BASH_SOURCE[0]}")/../lib/launch.sh"

: "${MODEL:?set MODEL to the checkpoint (an HF model folder) to evaluate}"
GAIA_METADATA="${GAIA_METADATA:-$HOME/data/gaia/2023/validation/metadata.jsonl}"
SANDBOX_URL="${SANDBOX_URL:-http://127.0.0.1:8080/run_code}"
WEB_SEARCH_URL="${WEB_SEARCH_URL:-http://127.0.0.1:8000/search}"
OUT="${OUT:-$MODEL/eval_gaia}"
agent_config="$OUT/agent.yaml"
render_agent_config "$EXAMPLES_DIR/configs/gaia_eval.yaml" "$agent_config" \
  "sandbox_url=$SANDBOX_URL" "web_search_url=$WEB_SEARCH_URL" "max_turns=10"
wait_for_health "$(health_url "$SANDBOX_URL")"
wait_for_health "$(health_url "$WEB_SEARCH_URL")"
limit=()
if [ -n "${LIMIT:-}" ]; then limit=(--limit "$LIMIT"); fi
run_eval --model "$MODEL" --engine vllm --tensor-parallel-size "${TP:-2}" --agent-config "$agent_config" \
  --gaia "$GAIA_METADATA" --sandbox-url "$SANDBOX_URL" --max-len 16384 --max-tokens-per-turn 4096 \
  --concurrency 32 --out "$OUT" "${limit[@]}"
