#!/usr/bin/env bash
# The lent GPU machine's last call: unpack the pieces that scripts/gpu_vllm_pieces.sh cut (vLLM 0.26.0,
# Ray, DeepSpeed, OpenRLHF and what the image lacks, carried over earlier calls into /tmp/vp), then
# run the cluster path on vLLM (scripts/gpu_smoke.py --engine vllm: run A stratified_grpo, run B
# SAPO + CalibAdv, each SMOKE_STEPS steps, every step and monitor read back from TensorBoard, and
# the per-step time split; SMOKE=0 skips it), then with the time left the GRPO vs Stratified GRPO study
# (examples/study/sgrpo_vs_grpo.py; $STUDY_ARGS). Before all that (SYNC_CHECK=1, the default), our
# engine's weight sync is checked by value on the GPU (SYNC_DTYPES, default "bfloat16 float32"). The
# engine bench runs only with BENCH=1.
# Logs, the time split and the study's files go to $OUT (at most 8 files come back: keep it so).
#
# Usage (on the device, repo root): bash scripts/gpu_vllm_run.sh SECONDS [SMOKE_STEPS]
# SECONDS is the wall time this call may use. The timing plan (docs/deploy.md, "CPU rehearsal"):
# the first piece call starts the machine and writes /tmp/vp/t0; every milestone below is printed
# as seconds since then ("T+"), so the log shows whether the first training step began within
# 4 minutes of the machine's start and the sequence ended inside 12 of the 15 device minutes.
# SMOKE_RUNS: AB (default), A or B (one run leaves minutes for the study).
# A study session (docs/study.md): SMOKE=0 SYNC_CHECK=0 bash scripts/gpu_vllm_run.sh 570; STUDY_SEEDS and
# STUDY_ARGS override the study's seeds and flags; its seed folders come back in study_seeds.tgz.
# SMOKE_EXTRA: more train_ppo_ray flags for both runs (default --vllm.enforce_eager; set it empty
# for CUDA graphs). The CPU rehearsal (scripts/gpu_rehearsal.sh) runs this script too, with
# SITE_ROOT/VP_DIR in its own folder, SMOKE_FLAGS=--dry-run and a CPU study.
set -uo pipefail
budget="${1:?usage: gpu_vllm_run.sh SECONDS [SMOKE_STEPS]}"
steps="${2:-2}"
OUT="${OUT:-/tmp/gpu_out}"
root="${SITE_ROOT:-/tmp}"
mkdir -p "$OUT" "${VP_DIR:-/tmp/vp}"
start=$(date +%s)
t0=$(cat "${VP_DIR:-/tmp/vp}/t0" 2>/dev/null || echo "$start")   # the first device call's clock: the machine's start
left() { echo $((budget - ($(date +%s) - start))); }
mark() { echo "[gpu_vllm_run] T+$(( $(date +%s) - t0 )) s: $*" | tee -a "$OUT/timeline.txt"; }
mark "last call starts (budget $budget s)"

bash scripts/gpu_vllm_unpack.sh "$root" || exit 3
mark "unpacked"
source scripts/gpu_vllm_env.sh "$root/site"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$OUT/device.txt"
# versions from the distributions' metadata, not imports: importing torch + vLLM + DeepSpeed here
# cost 27 s of device time on 2026-11-27 (H100); the smoke imports them all anyway, and the CPU
# rehearsal (scripts/gpu_rehearsal.py) checks every import of the driver and of each Ray worker
python3 - <<'EOF' 2>&1 | tee -a "$OUT/device.txt"
import importlib.metadata, platform
print("python", platform.python_version())
for m in ("torch", "vllm", "ray", "deepspeed", "openrlhf", "transformers"):
    try:
        print(m, importlib.metadata.version(m))
    except importlib.metadata.PackageNotFoundError:  # report every missing piece at once, then go on
        print(m, "NOT INSTALLED")
EOF

# Our single-machine engine's weight sync, checked by value with the trainer on the GPU (a CUDA-only
# bug dropped part of every sync until 2026-11-27): SmolLM2, bf16 and fp32 engines, ~1-2 min
if [ "${SYNC_CHECK:-1}" = 1 ]; then
  mark "sync check (scripts/gpu_sync_check.py)"
  timeout "$(( $(left) / 3 ))" python3 scripts/gpu_sync_check.py --dtypes ${SYNC_DTYPES:-bfloat16 float32} --json "$OUT/sync_check.json" \
    > "$OUT/sync_check.log" 2>&1
  mark "sync check exit $?"; grep "^\[gpu_sync_check\]" "$OUT/sync_check.log"
fi

smoke_rc=0
if [ "${SMOKE:-1}" = 1 ]; then
  # The smoke gets all but the study's reserve (default: none; the study runs on what is left).
  smoke_s=$(( $(left) - 20 - ${STUDY_RESERVE_S:-0} ))
  read -r -a smoke_extra <<< "${SMOKE_EXTRA---vllm.enforce_eager}"
  mark "smoke: $steps steps per run, up to $smoke_s s, extra flags: ${smoke_extra[*]:-none}"
  read -r -a smoke_flags <<< "${SMOKE_FLAGS:-}"
  timeout "$smoke_s" python3 scripts/gpu_smoke.py --engine vllm --steps "$steps" --runs "${SMOKE_RUNS:-AB}" --no-sandbox --out "$root/gpu_smoke" \
    "${smoke_flags[@]}" -- "${smoke_extra[@]}" > "$OUT/smoke.log" 2>&1
  smoke_rc=$?
  mark "smoke exit $smoke_rc"
  # when each run's first training step began (OpenRLHF logs each step's timing/* with it)
  grep -E "^\[gpu_smoke\] run [AB] step 1 started" "$OUT/smoke.log" | while read -r _ _ run _ _ _ _ _ epoch; do
    echo "[gpu_vllm_run] T+$(awk -v e="$epoch" -v t="$t0" 'BEGIN { printf "%.0f", e - t }') s: run $run's first training step started"
  done | tee -a "$OUT/timeline.txt"
  grep -E "^\[gpu_smoke\]|^\| |Error|error|Traceback" "$OUT/smoke.log" | grep -v "^\[gpu_smoke\] /" | tail -60
else
  mark "smoke skipped (SMOKE=0): the study gets the call"
fi

if [ "${BENCH:-0}" = 1 ] && [ "$(( $(left) - 10 ))" -gt 45 ]; then
  timeout "$(( $(left) - 10 ))" python3 bench/engine_throughput.py --vllm-dtype bfloat16 --prompts 64 --tokens 128 \
    > "$OUT/bench.log" 2>&1
  mark "bench exit $?"; tail -8 "$OUT/bench.log"
fi

# the study gets what is left; a process cut off keeps its last checkpoint (a second call resumes it).
# Its default (docs/study.md, the sizing): 3 seeds x 3 arms (GRPO, Stratified GRPO 0.8, random strata
# 0.8) x 20 steps of 8 prompts x 8 samples, one demo process per (seed, arm) side by side on the GPU
# (--split-arms: each seed's GRPO process does the warm-up, its other arms start from those weights),
# each vLLM engine allowed 0.08 of the GPU's memory. STUDY_SEEDS (default: the 3 smallest seeds
# with no folder in docs/study/seeds yet, so that each session adds new ones). A study session runs
# with SMOKE=0 SYNC_CHECK=0: the first study step then comes ~3 min after the first device call.
study_s=$(( $(left) - 60 ))
if [ "$study_s" -gt 120 ]; then
  seeds="${STUDY_SEEDS:-$(python3 -c 'import pathlib, re
used = {int(m.group(1)) for p in pathlib.Path("docs/study/seeds").glob("*") if (m := re.search(r"_seed(\d+)$", p.name))}
print(" ".join(str(k) for k in [k for k in range(1000) if k not in used][:3]))')}"
  read -r -a study_args <<< "${STUDY_ARGS:---seeds $seeds --split-arms --gpu-memory-share 0.08 -- --device cuda --steps 20 --prompts-per-step 8 --n-samples 8 --warmup-steps 16 --micro-batch-size 8 --concurrency 64}"
  # the image has no bubblewrap, so the local sandbox cannot start there (2026-11-27, H100: the
  # study's first seed stopped at "sandbox: refusing to start"); the demo's prompts offer search
  # only. STUDY_ARGS holds a `--`, so this goes to every process's demo
  study_args+=(--no-sandbox)
  mark "study: up to $study_s s: ${study_args[*]}"
  # a second call (machine still warm) continues every process where the first one was cut off
  resume=(); [ -d "$root/gpu_study" ] && resume=(--resume)
  study_t0=$(date +%s)
  # SIGINT to the whole process group at the limit: every demo keeps its checkpoint and the study
  # writes what finished; SIGKILL 40 s later if anything still runs
  timeout -s INT -k 40 "$study_s" python3 examples/study/sgrpo_vs_grpo.py --out "$root/gpu_study" "${resume[@]}" "${study_args[@]}" \
    > "$OUT/study.log" 2>&1
  mark "study exit $?"
  # the first training step of any process (progress lines carry T+ from the study's start)
  first=$(grep -m1 -E " step +1 " "$root/gpu_study/progress.log" 2>/dev/null | sed -E 's/^\[study\] T\+ *([0-9]+) s.*/\1/')
  [ -n "$first" ] && echo "[gpu_vllm_run] T+$(( study_t0 - t0 + first )) s: the study's first training step" | tee -a "$OUT/timeline.txt"
  # every run's metrics, evaluations and logs (no checkpoints), also of a run cut off, in one file
  # (the device returns 8 files at most), and the finished seeds' folders to commit in another:
  #   tar xzf study_seeds.tgz -C docs/study/seeds   (docs/study.md)
  (cd "$root/gpu_study" && find . \( -name "*.json" -o -name "*.jsonl" -o -name "*.md" -o -name "*.log" \) -size -4M \
    -not -path "./seeds/*" -print0 | tar czf "$OUT/study_files.tgz" --null -T -) 2>/dev/null
  if [ -d "$root/gpu_study/seeds" ]; then
    (cd "$root/gpu_study/seeds" && tar czf "$OUT/study_seeds.tgz" .) && mark "seed folders: $(ls "$root/gpu_study/seeds" | tr '\n' ' ')"
  fi
  grep -E "FAILED|NOT STARTED| done in " "$root/gpu_study/progress.log" 2>/dev/null | tail -12
  tail -20 "$OUT/study.log"
else
  mark "no time left for the study ($study_s s)"
fi
exit "$smoke_rc"
