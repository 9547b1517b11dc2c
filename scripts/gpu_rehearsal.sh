#!/usr/bin/env bash
# CPU rehearsal of the lent GPU machine's run (issue #34): every step of the device sequence that
# needs no CUDA device, in an environment that mirrors the machine's image, so that the 15 lent
# minutes go to training steps, not to fixes. Run by a developer (not CI); ~10 GB under $REHEARSAL_DIR.
#
# 1. the image: Python 3.12 (pyenv) in a venv with scripts/gpu_image_requirements.txt (torch
#    2.11.0, PyPI's CUDA 13.0 build, which installs and imports without a GPU; transformers 5.17.0;
#    the image's other packages at the versions KINDS.md gives). Rebuilt when that file changes.
# 2. the pieces: .whl/vp/piece-* as scripts/gpu_vllm_pieces.sh cuts them (run first if absent).
# 3. unpacked by scripts/gpu_vllm_unpack.sh, as gpu_vllm_run.sh does, with its environment
#    (scripts/gpu_vllm_env.sh) and the image's TORCH_CUDA_ARCH_LIST=9.0a.
# 4. scripts/gpu_rehearsal.py: the checks (versions, driver imports and the upstream contract,
#    OpenRLHF's parser on both smoke runs, the agent loader, create_vllm_engines' engine arguments,
#    every Ray worker's imports, DeepSpeed's config and the optimizer it builds).
# 5. scripts/gpu_vllm_run.sh itself, as the device's last call runs it, with what a CPU can do in
#    place of the GPU work: the smoke with --dry-run, the study's CPU smoke in the device's
#    concurrent form (--smoke --split-arms, 2 seeds x 2 arms as 4 processes, HF engine) and its
#    study_seeds.tgz (docs/study.md).
#    Its timeline and logs land in $REHEARSAL_DIR/run_out.
#
# Usage: scripts/gpu_rehearsal.sh [gpu_rehearsal.py args, e.g. --check parse]  (REHEARSAL_RUN=0 skips 5)
# Env: REHEARSAL_DIR (default /tmp/gpu_rehearsal), PY312 (a Python 3.12), REHEARSAL_EXTRA (the flags
# gpu_vllm_run.sh passes the smoke after `--`, default its SMOKE_EXTRA default --vllm.enforce_eager).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${REHEARSAL_DIR:-/tmp/gpu_rehearsal}"
PY312="${PY312:-$(ls -d "$HOME"/.pyenv/versions/3.12*/bin/python3 2>/dev/null | tail -1)}"
[ -x "$PY312" ] || { echo "no Python 3.12: set PY312 (pyenv install 3.12)"; exit 3; }
mkdir -p "$DIR"
log() { echo "[gpu_rehearsal] $*"; }

if [ ! -f "$DIR/venv/.image-done" ] || [ scripts/gpu_image_requirements.txt -nt "$DIR/venv/.image-done" ]; then
  log "building the image's environment in $DIR/venv (several GB; minutes)"
  rm -rf "$DIR/venv" && "$PY312" -m venv "$DIR/venv"
  nice -n 19 "$DIR/venv/bin/python" -m pip install -q -r scripts/gpu_image_requirements.txt
  touch "$DIR/venv/.image-done"
fi
if ! ls .whl/vp/piece-* >/dev/null 2>&1; then
  log "no pieces in .whl/vp: cutting them (scripts/gpu_vllm_pieces.sh)"
  nice -n 19 bash scripts/gpu_vllm_pieces.sh
fi
log "unpacking the pieces as gpu_vllm_run.sh does"
rm -rf "$DIR/site" "$DIR/vp"
PATH="$DIR/venv/bin:$PATH" VP_DIR="$DIR/vp" nice -n 19 bash scripts/gpu_vllm_unpack.sh "$DIR"
source scripts/gpu_vllm_env.sh "$DIR/site"
export PATH="$DIR/venv/bin:$PATH" TORCH_CUDA_ARCH_LIST="9.0a" REHEARSAL_OUT="$DIR/out"
export REHEARSAL_EXTRA="${REHEARSAL_EXTRA---vllm.enforce_eager}"
# Ray on this CPU machine: no GPUs to find, workers started in the venv's python
export RAY_ENABLE_UV_RUN_RUNTIME_ENV=0
log "python: $(command -v python3) ($(python3 --version))"
rc=0
nice -n 19 python3 scripts/gpu_rehearsal.py --json "$DIR/rehearsal.json" "$@" || rc=$?
if [ "${REHEARSAL_RUN:-1}" = 1 ]; then
  log "gpu_vllm_run.sh as the device runs it (smoke --dry-run, the study's CPU smoke)"
  rm -rf "$DIR/run_out" "$DIR/gpu_smoke" "$DIR/gpu_study"
  # the image has no bubblewrap: hide this machine's behind a non-executable /dev/null in a private
  # mount namespace (the 2026-11-27 device run met it in the study's sandbox; root only)
  hide=()
  if bw="$(command -v bwrap)" && unshare --mount true 2>/dev/null; then
    hide=(unshare --mount --propagation private sh -c "mount --bind /dev/null '$bw' && exec \"\$0\" \"\$@\"")
  else
    log "note: bubblewrap is not hidden here (not installed, or no mount namespace): the image has none"
  fi
  # SYNC_CHECK=0: the carried vLLM is the CUDA build, which cannot start an engine on this CPU
  if OUT="$DIR/run_out" SITE_ROOT="$DIR" VP_DIR="$DIR/vp" SMOKE_FLAGS="--dry-run" SYNC_CHECK=0 \
     STUDY_ARGS="--smoke --seeds 0 1 --split-arms --arms grpo,random:0.8 -- --engine hf --steps 1" \
     nice -n 19 "${hide[@]}" bash scripts/gpu_vllm_run.sh 1800 2; then
    log "PASS gpu_vllm_run.sh: $(tail -1 "$DIR/run_out/timeline.txt")"
  else
    log "FAIL gpu_vllm_run.sh (exit $?): see $DIR/run_out"; rc=1
  fi
  grep -q "study exit 0" "$DIR/run_out/timeline.txt" || { log "FAIL the study's CPU smoke: $DIR/run_out/study.log"; rc=1; }
  # the device's concurrent form: 2 seeds x 2 arms as 4 processes; both seeds' folders come back
  seeds_back=$(tar tzf "$DIR/run_out/study_seeds.tgz" 2>/dev/null | grep -c "_seed[01]/seed.json$")
  [ "$seeds_back" = 2 ] || { log "FAIL study_seeds.tgz holds $seeds_back of 2 seed folders: $DIR/run_out"; rc=1; }
fi
exit $rc
