#!/usr/bin/env bash
# Prepares vLLM 0.26.0 (the release whose PyPI wheel fits the lent GPU machine's torch 2.11.0 and
# CUDA 13) and the packages it needs that the machine's image lacks, cut into pieces a device call
# can carry (64 MiB each at most), and prints the calls that move and install them. The machine
# reaches no network and keeps /tmp between calls only while it is warm (~30 s idle), so the calls
# must follow one another at once. Then `scripts/gpu_smoke.py --engine vllm` runs there.
#
# Usage: scripts/gpu_vllm_pieces.sh [OUT_DIR]      (default .whl/vllm, ignored by git)
# Not yet run on a GPU: no session on issue #22 was lent one (docs/deploy.md records runs).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-.whl/vllm}"
PIECE_MB=60
# What the GPU image already holds (/work/.library/device/KINDS.md, 2026-11-17): never carried.
IMAGE_HAS="accelerate aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs certifi charset-normalizer
click cloudpickle cmake cuda-bindings cuda-core cuda-pathfinder cuda-toolkit einops filelock frozenlist fsspec
h11 hf-xet httpcore httpx huggingface-hub idna jinja2 llvmlite markupsafe mpmath msgpack multidict networkx
ninja numba numpy nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13
nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py
nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx opencv-python-headless packaging pillow
prometheus-client propcache protobuf psutil py-cpuinfo pyyaml regex requests safetensors sentencepiece
setuptools six sympy tiktoken tokenizers torch torchaudio torchvision tqdm transformers triton
typing-extensions urllib3 uvloop yarl"

mkdir -p "$OUT/wheels"
grep -qxF "/.whl/" .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo "/.whl/" >> .git/info/exclude; }
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64 \
  -d "$OUT/wheels" "vllm==0.26.0" "ray==2.55.0" "deepspeed==0.19.6"
for whl in "$OUT"/wheels/*.whl; do
  name="$(basename "$whl" | cut -d- -f1 | tr '_A-Z' '-a-z')"
  if printf '%s\n' $IMAGE_HAS | grep -qxF "$name"; then rm -f "$whl"; fi
done
( cd "$OUT" && rm -f piece-* && tar cf - wheels | split -b "${PIECE_MB}M" -d -a 2 - piece- )
pieces=("$OUT"/piece-*)
echo "vLLM 0.26.0 + what the GPU image lacks: $(du -sh "$OUT/wheels" | cut -f1) in ${#pieces[@]} pieces of <= ${PIECE_MB} MiB"
echo "Device calls, back to back on a warm machine (each carries one piece):"
for p in "${pieces[@]}"; do
  echo "  run(carry=[\"$p\"], command=\"mkdir -p /tmp/vp && cp $p /tmp/vp/\")"
done
echo "  then: cat /tmp/vp/piece-* | tar xf - -C /tmp && python3 -m pip install -q --no-index --no-deps" \
     "--no-compile --target /tmp/site /tmp/wheels/*.whl && export PYTHONPATH=/tmp/site:\$PYTHONPATH &&" \
     "pip install --no-deps --target /tmp/site -e . && python3 scripts/gpu_smoke.py --engine vllm"
