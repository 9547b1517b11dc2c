# shellcheck shell=bash
# Shared by every launch script (sourced, not run). One job: turn the command line a script
# built into either a local `--dry_run` (DRY_RUN=1: OpenRLHF's real parser, no Ray, no GPU) or
# a `ray job submit` of the very same arguments, so the two can never diverge.
#
# Environment (all optional):
#   PYTHON        interpreter with openrlhf-sgrpo installed            (this checkout's .venv/bin/python
#                 when it exists, as `make` creates it; else python3)
#   RAY_ADDRESS   Ray dashboard of the head node                       (http://127.0.0.1:8265)
#   SAVE_PATH     run folder: checkpoints, logs, rendered agent config (./runs/$RUN_NAME);
#                 with NUM_NODES > 1 an absolute path on storage every node mounts there
#   SHARED_FS     folder every node mounts at the same path (default with NUM_NODES > 1: SAVE_PATH)
#   EXTRA_ARGS    extra CLI flags appended last (argparse: the last value wins); a resume of a run
#                 that saved checkpoints: the same command with EXTRA_ARGS=--ckpt.load_enable
#   WANDB_API_KEY set: wandb logging on (OpenRLHF logs to wandb only when --logger.wandb.key is given;
#                 the scripts pass the placeholder `env`, and wandb reads the key itself from
#                 WANDB_API_KEY, which reaches the workers through the job's environment, never the
#                 command line). WANDB_PROJECT / WANDB_ENTITY are wandb's own variables.
#   DRY_RUN=1     print the parsed config as JSON instead of submitting
#   SKIP_HEALTH_CHECK=1  do not wait for the tool services' /health before submitting
#   SGRPO_TOOLS_TOKEN  the tool services' shared token; with WANDB_API_KEY and HF_HOME it reaches the
#                 job by its runtime environment (the machine that submits may not be the head)
#   TOOLS_TOKEN_FILE  the file holding that token (the one docker compose mounts): read here when
#                 SGRPO_TOOLS_TOKEN is unset, so the job and the eval driver carry its content, never
#                 the path (a worker node has no file of this machine's)

set -euo pipefail

EXAMPLES_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$EXAMPLES_DIR/lib/python.sh"
PYTHON="$(default_python)"
RAY_ADDRESS="${RAY_ADDRESS:-http://127.0.0.1:8265}"
if [ -z "${SGRPO_TOOLS_TOKEN:-}" ] && [ -n "${TOOLS_TOKEN_FILE:-}" ]; then
  [ -r "$TOOLS_TOKEN_FILE" ] || { echo "error: TOOLS_TOKEN_FILE=$TOOLS_TOKEN_FILE cannot be read" >&2; exit 2; }
  SGRPO_TOOLS_TOKEN="$(tr -d '[:space:]' < "$TOOLS_TOKEN_FILE")"
  export SGRPO_TOOLS_TOKEN
fi

# The .py file OpenRLHF loads for --train.agent_func_path, found without importing it
# (importing would pull torch + OpenRLHF just to print a path).
agent_func_path() {
  "$PYTHON" -c 'import importlib.util as u; s = u.find_spec("agent_env.openrlhf_agent"); print(s.origin)'
}

# render_agent_config BASE_YAML OUT_YAML KEY=VALUE...: validated copy with overrides applied.
render_agent_config() {
  local base="$1" out="$2"
  shift 2
  mkdir -p "$(dirname "$out")"
  "$PYTHON" "$EXAMPLES_DIR/lib/render_agent_config.py" --base "$base" --out "$out" "$@"
}

# run_cli ARG...: the CLI with these arguments, dry or through `ray job submit`.
# The agent config travels by content, not by path: the job gets the file's text as
# SGRPO_AGENT_CONFIG_YAML (the machine that submits need not be the head, nor share its disk),
# and the CLI forwards it to every Ray worker the same way (docs/multinode.md). The file named by
# --train.agent_func_path is read by the CLI on the head and shipped to every node by content too.
run_cli() {
  local -a extra=()
  if [ -n "${EXTRA_ARGS:-}" ]; then read -r -a extra <<< "$EXTRA_ARGS"; fi
  # Several nodes: the CLI refuses checkpoint/log paths not under --sgrpo.shared_fs (storage every
  # node mounts at the same path). These scripts have always required SAVE_PATH to be such storage,
  # so that is what they state unless SHARED_FS names the folder (a relative SAVE_PATH is refused).
  local -a shared=()
  if [ -n "${SHARED_FS:-}" ]; then
    shared=(--sgrpo.shared_fs "$SHARED_FS")
  elif [ "${NUM_NODES:-1}" -gt 1 ] && [ -n "${SAVE_PATH:-}" ]; then
    shared=(--sgrpo.shared_fs "$SAVE_PATH")
    echo "[launch] NUM_NODES=$NUM_NODES: SAVE_PATH=$SAVE_PATH is taken as storage every node mounts at that" \
         "path (SHARED_FS=DIR names another; docs/multinode.md)" >&2
  fi
  # OpenRLHF 0.11.2 creates its wandb logger only when --logger.wandb.key is set, and logs in with
  # that value only when wandb has no key of its own; WANDB_API_KEY is one (it wins over the flag).
  local -a wandb=()
  if [ -n "${WANDB_API_KEY:-}" ]; then wandb=(--logger.wandb.key env); fi
  local -a cli=(-m openrlhf_sgrpo.cli.train_ppo_ray "$@" "${shared[@]}" "${wandb[@]}" "${extra[@]}")
  if [ "${DRY_RUN:-0}" = 1 ]; then
    echo "[dry-run] SGRPO_AGENT_CONFIG=${SGRPO_AGENT_CONFIG:-} $PYTHON ${cli[*]} --dry_run" >&2
    exec "$PYTHON" "${cli[@]}" --dry_run
  fi
  local env_json
  env_json="$("$PYTHON" -c 'import json, os, sys
keys = ["SGRPO_AGENT_CONFIG", "HF_HOME", "WANDB_API_KEY", "SGRPO_TOOLS_TOKEN"]  # no SERPER_API_KEY: the /search proxy holds it
env = {k: os.environ[k] for k in keys if os.environ.get(k)}
if env.get("SGRPO_AGENT_CONFIG"):  # the text, read here: the head may not have this file
    env["SGRPO_AGENT_CONFIG_YAML"] = open(env["SGRPO_AGENT_CONFIG"]).read()
# The CLI, the driver of the job, hands the workers these variables again in its own ray.init;
# Ray refuses a job and a driver runtime env that set the same variable unless told to combine them.
env["RAY_OVERRIDE_JOB_RUNTIME_ENV"] = "1"
print(json.dumps({"env_vars": env}))')"
  echo "[launch] ray job submit --address=$RAY_ADDRESS -- python ${cli[*]}" >&2
  exec ray job submit --address="$RAY_ADDRESS" --runtime-env-json="$env_json" -- python "${cli[@]}"
}

# wait_for_health URL: fail fast when a tool service is not up (skipped in dry runs).
wait_for_health() {
  local url="$1"
  [ "${DRY_RUN:-0}" = 1 ] && return 0
  [ "${SKIP_HEALTH_CHECK:-0}" = 1 ] && return 0
  for _ in $(seq 1 30); do
    if "$PYTHON" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)' "$url" 2>/dev/null; then
      return 0
    fi
    sleep 2
  done
  echo "error: $url did not answer within 60 s (start the tool stack: docker compose up -d; SKIP_HEALTH_CHECK=1 skips)" >&2
  exit 1
}

# health_url SERVICE_URL: http://host:port/anything -> http://host:port/health
health_url() {
  local url="$1"
  local origin="${url#*://}"
  echo "${url%%://*}://${origin%%/*}/health"
}

# run_eval ARG...: the evaluation CLI (python -m openrlhf_sgrpo.eval) with these arguments
# (DRY_RUN=1: --dry-run, which checks the inputs and prints the settings as JSON).
run_eval() {
  local -a extra=()
  if [ -n "${EXTRA_ARGS:-}" ]; then read -r -a extra <<< "$EXTRA_ARGS"; fi
  local -a cmd=("$PYTHON" -m openrlhf_sgrpo.eval "$@" "${extra[@]}")
  if [ "${DRY_RUN:-0}" = 1 ]; then exec "${cmd[@]}" --dry-run; fi
  echo "[eval] ${cmd[*]}" >&2
  exec "${cmd[@]}"
}
