# Sourced (bash) by scripts/gpu_vllm_run.sh on the lent GPU machine and by the CPU rehearsal: the
# environment the smoke, its Ray workers (they inherit it) and the study run in.
# Usage: source scripts/gpu_vllm_env.sh SITE_DIR
# flashinfer is not carried (vLLM then samples top-k/top-p in torch)
export VLLM_USE_FLASHINFER_SAMPLER=0
export PYTHONPATH="$1:$PWD" PATH="$1/bin:$PATH" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
