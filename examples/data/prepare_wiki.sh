#!/usr/bin/env bash
# wiki-18 (DPR, Dec 2018: 21M passages) and its dense index for the retriever service.
#   online:  fetch the corpus (PeterJinGo/wiki-18-corpus, the Search-R1 copy) from the hub,
#            optionally the prebuilt e5 Flat index too (PREBUILT=1; Search-R1's FAISS file), then
#   PREBUILT=1: import that index with retriever_server.import_index (no re-encoding), else
#   build our index folder with retriever_server.build_index (resumable; GPU advised).
#   CORPUS=/data/wiki-18.jsonl ./prepare_wiki.sh     # offline: use a corpus you already have
# Environment: OUT ($HOME/data/wiki18), CORPUS (download), MODEL (intfloat/e5-base-v2),
# INDEX_TYPE (flat), DEVICE (cuda if nvidia-smi works, else cpu), PYTHON (python3), PREBUILT (0).
# Then: INDEX_DIR=$OUT/e5-index docker compose up -d
set -euo pipefail
PYTHON="${PYTHON:-python3}"
OUT="${OUT:-$HOME/data/wiki18}"
MODEL="${MODEL:-intfloat/e5-base-v2}"
INDEX_TYPE="${INDEX_TYPE:-flat}"
if [ -z "${DEVICE:-}" ]; then
  if command -v nvidia-smi >/dev/null && nvidia-smi >/dev/null 2>&1; then DEVICE=cuda; else DEVICE=cpu; fi
fi
mkdir -p "$OUT"

hub_get() {  # hub_get REPO FILE: download one file of a hub dataset repo into $OUT, print its path
  "$PYTHON" -c 'import sys; from huggingface_hub import hf_hub_download as d
print(d(sys.argv[1], sys.argv[2], repo_type="dataset", local_dir=sys.argv[3]))' "$1" "$2" "$OUT"
}

if [ -z "${CORPUS:-}" ]; then
  CORPUS="$OUT/wiki-18.jsonl"
  if [ ! -s "$CORPUS" ]; then
    echo "[wiki] downloading wiki-18 corpus (~14 GB unpacked)" >&2
    gz="$(hub_get PeterJinGo/wiki-18-corpus wiki-18.jsonl.gz)"
    gzip -dc "$gz" > "$CORPUS.part" && mv "$CORPUS.part" "$CORPUS"
  fi
fi
[ -s "$CORPUS" ] || { echo "error: corpus $CORPUS does not exist or is empty" >&2; exit 2; }

if [ "${PREBUILT:-0}" = 1 ]; then
  if [ ! -s "$OUT/e5_Flat.index" ]; then
    echo "[wiki] downloading Search-R1's prebuilt e5 Flat index (~65 GB)" >&2
    for part in part_aa part_ab; do hub_get PeterJinGo/wiki-18-e5-index "$part" >/dev/null; done
    cat "$OUT/part_aa" "$OUT/part_ab" > "$OUT/e5_Flat.index.part" && mv "$OUT/e5_Flat.index.part" "$OUT/e5_Flat.index"
    rm -f "$OUT/part_aa" "$OUT/part_ab"
  fi
  echo "[wiki] importing the prebuilt index (row i = corpus line i) into $OUT/e5-index" >&2
  exec "$PYTHON" -m retriever_server.import_index --faiss "$OUT/e5_Flat.index" --corpus "$CORPUS" \
    --model "$MODEL" --out "$OUT/e5-index"
fi

echo "[wiki] building $INDEX_TYPE index of $CORPUS with $MODEL on $DEVICE (resumable)" >&2
fp16=()
if [ "$DEVICE" != cpu ]; then fp16=(--fp16); fi
exec "$PYTHON" -m retriever_server.build_index --corpus "$CORPUS" --model "$MODEL" --out "$OUT/e5-index" \
  --index-type "$INDEX_TYPE" --device "$DEVICE" --batch-size 512 "${fp16[@]}"
