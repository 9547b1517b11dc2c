#!/usr/bin/env bash
# Unpack the pieces that scripts/gpu_vllm_pieces.sh cut into ROOT/site (default /tmp/site): the one
# unpack step both the lent GPU machine (scripts/gpu_vllm_run.sh) and the CPU rehearsal
# (scripts/gpu_rehearsal.sh) run. Pieces are gathered in $VP_DIR (default /tmp/vp, where earlier
# device calls left them) with those in .whl/vp (the last call's own); wheels in .whl/vp/extra replace or add to the site
# folder (a fix found after the pieces were cut). Needs python3 on PATH (the image's).
#
# Usage: bash scripts/gpu_vllm_unpack.sh [ROOT]
set -uo pipefail
root="${1:-/tmp}"
vp="${VP_DIR:-/tmp/vp}"
mkdir -p "$vp" "$root"
cp .whl/vp/piece-* "$vp/" 2>/dev/null
if [ ! -d "$root/site/vllm" ]; then
  if command -v xz >/dev/null; then cat "$vp"/piece-* | xz -dc -T0 | tar x -C "$root"
  else cat "$vp"/piece-* | python3 -c "import sys, tarfile; tarfile.open(fileobj=sys.stdin.buffer, mode='r|xz').extractall('$root')"
  fi || { echo "unpacking the pieces failed"; ls -la "$vp"; exit 3; }
fi
if ls .whl/vp/extra/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$root/site" .whl/vp/extra/*.whl || exit 3
fi
