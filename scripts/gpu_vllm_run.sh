#!/usr/bin/env bash
# The lent GPU machine's last call: unpack the pieces that scripts/gpu_vllm_pieces.sh cut (vLLM 0.26.0,
# Ray, DeepSpeed, OpenRLHF and what the image lacks, carried over earlier calls into /tmp/vp), then
# run the cluster path on vLLM (scripts/gpu_smoke.py --engine vllm), the engine bench (our
# VLLMGenerationEngine on CUDA, its weight sync included) and, with the time left, the GRPO vs
# Stratified GRPO study (examples/study/sgrpo_vs_grpo.py; $STUDY_ARGS, small by default). Logs and the
# study's table go to $OUT.
#
# Usage (on the device, repo root): bash scripts/gpu_vllm_run.sh SECONDS [SMOKE_STEPS]
# SECONDS is the wall time this call may use: the smoke first, then the bench, then the study with what is left.
set -uo pipefail
budget="${1:?usage: gpu_vllm_run.sh SECONDS [SMOKE_STEPS]}"
steps="${2:-2}"
OUT="${OUT:-/tmp/gpu_out}"
mkdir -p "$OUT" /tmp/vp
start=$(date +%s)
left() { echo $((budget - ($(date +%s) - start))); }

cp .whl/vp/piece-* /tmp/vp/ 2>/dev/null
if [ ! -d /tmp/site/vllm ]; then
  if command -v xz >/dev/null; then cat /tmp/vp/piece-* | xz -dc -T0 | tar x -C /tmp
  else cat /tmp/vp/piece-* | python3 -c "import sys, tarfile; tarfile.open(fileobj=sys.stdin.buffer, mode='r|xz').extractall('/tmp')"
  fi || { echo "unpacking the pieces failed"; ls -la /tmp/vp; exit 3; }
fi
# wheels that replace or add to the pieces (a fix found after they were cut): carried in .whl/vp/extra
if ls .whl/vp/extra/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/vp/extra/*.whl
fi
echo "[gpu_vllm_run] unpacked in $(( $(date +%s) - start )) s"
# flashinfer is not carried (vLLM then samples top-k/top-p in torch); the Ray workers inherit this
export VLLM_USE_FLASHINFER_SAMPLER=0
export PYTHONPATH="/tmp/site:$PWD" PATH="/tmp/site/bin:$PATH" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"
python3 - <<'EOF' 2>&1 | grep -v Warning | tee -a "$OUT/device.txt"
import importlib, platform
print("python", platform.python_version())
for m in ("torch", "vllm", "ray", "deepspeed", "openrlhf", "transformers"):
    try:
        print(m, importlib.import_module(m).__version__)
    except Exception as e:  # report every missing piece at once, then go on
        print(m, "IMPORT FAILED:", repr(e)[:300])
EOF

smoke_s=$(( $(left) - 100 - ${STUDY_RESERVE_S:-0} ))
echo "[gpu_vllm_run] smoke: $steps steps per run, up to $smoke_s s"
timeout "$smoke_s" python3 scripts/gpu_smoke.py --engine vllm --steps "$steps" --no-sandbox --out /tmp/gpu_smoke \
  -- --vllm.enforce_eager > "$OUT/smoke.log" 2>&1
echo "[gpu_vllm_run] smoke exit $? after $(( $(date +%s) - start )) s"
grep -E "^\[gpu_smoke\]|step|Error|error|Traceback" "$OUT/smoke.log" | grep -v "^\[gpu_smoke\] /" | tail -60

bench_s=$(( $(left) - 10 ))
if [ "$bench_s" -gt 45 ]; then
  timeout "$bench_s" python3 bench/engine_throughput.py --vllm-dtype bfloat16 --prompts 64 --tokens 128 \
    > "$OUT/bench.log" 2>&1
  echo "[gpu_vllm_run] bench exit $?"; tail -8 "$OUT/bench.log"
fi

# the study gets what is left (reserve it with STUDY_RESERVE_S); a seed cut off leaves its partial run
study_s=$(( $(left) - 15 ))
if [ "$study_s" -gt 120 ]; then
  read -r -a study_args <<< "${STUDY_ARGS:---seeds 0 1 -- --device cuda --steps 20 --prompts-per-step 8 --n-samples 8 --warmup-steps 16 --micro-batch-size 8 --concurrency 64}"
  timeout "$study_s" python3 examples/study/sgrpo_vs_grpo.py --out /tmp/gpu_study "${study_args[@]}" > "$OUT/study.log" 2>&1
  echo "[gpu_vllm_run] study exit $?"; cp /tmp/gpu_study/study_table.md /tmp/gpu_study/study.json "$OUT/" 2>/dev/null
  tail -20 "$OUT/study.log"
fi
