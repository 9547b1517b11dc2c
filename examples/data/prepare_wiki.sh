#!/usr/bin/env bash
# wiki-18 (DPR, Dec 2018: 21M passages) and its dense index for the retriever service, written to
# $OUT/e5-index (default ~/data/wiki18/e5-index), the folder `INDEX_DIR=... docker compose up -d` serves.
#
# Two routes:
#   build (default)  fetch the corpus (PeterJinGo/wiki-18-corpus, the Search-R1 copy) from the hub, or
#                    use CORPUS=..., and encode every passage with retriever_server.build_index
#                    (resumable; 21M passages with E5: hours on a GPU, days on a CPU).
#   PREBUILT=1       Search-R1's route: also fetch its prebuilt e5 Flat index (PeterJinGo/
#                    wiki-18-e5-index, 64.5 GB), or use FLAT_INDEX=..., and import it with
#                    retriever_server.import_index: no re-encoding.
# INDEX_TYPE picks the index on both routes:
#   flat (default)   exact search over 64.5 GB of vectors: needs that much RAM (or --mmap and a fast
#                    disk). On the PREBUILT route the file itself enters $OUT/e5-index as a hard link
#                    (PLACE=hardlink: no extra disk, and the folder works inside the compose container,
#                    which mounts only INDEX_DIR); PLACE=copy writes a second 64.5 GB copy (for an OUT
#                    on a filesystem without hard links).
#   ivf_pqfs_sq8     what fits one 24 GB machine: streamed from the flat file (never whole in memory),
#                    18.3 GB of disk, 2.2 GB of private memory while serving, recall@3 0.958 at 21M
#                    (docs/retriever.md); ivf_sq8 and ivf_pq are the other streamed kinds. The flat
#                    file is not needed afterwards (delete it to get its 64.5 GB back).
# Examples:
#   PREBUILT=1 INDEX_TYPE=ivf_pqfs_sq8 ./prepare_wiki.sh        # the 24 GB route
#   CORPUS=/data/wiki-18.jsonl ./prepare_wiki.sh                  # offline: a corpus you already have
#   PREBUILT=1 CORPUS=/data/wiki-18.jsonl FLAT_INDEX=/data/e5_Flat.index ./prepare_wiki.sh
# Environment: OUT ($HOME/data/wiki18), CORPUS (download to $OUT/wiki-18.jsonl), PREBUILT (0),
# FLAT_INDEX (download to $OUT/e5_Flat.index), INDEX_TYPE (flat), PLACE (hardlink), MODEL
# (intfloat/e5-base-v2), DEVICE (cuda if nvidia-smi works, else cpu), PYTHON (this checkout's
# .venv/bin/python when it exists, else python3).
# Then: INDEX_DIR=$OUT/e5-index docker compose up -d
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib/python.sh"
PYTHON="$(default_python)"
OUT="${OUT:-$HOME/data/wiki18}"
MODEL="${MODEL:-intfloat/e5-base-v2}"
INDEX_TYPE="${INDEX_TYPE:-flat}"
PLACE="${PLACE:-hardlink}"
case "$PLACE" in hardlink|copy) ;; *) echo "error: PLACE=$PLACE: choose hardlink or copy (a symlink would point outside the index folder, which the compose container cannot see)" >&2; exit 2;; esac
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
  if [ -z "${FLAT_INDEX:-}" ]; then
    FLAT_INDEX="$OUT/e5_Flat.index"
    if [ ! -s "$FLAT_INDEX" ]; then
      echo "[wiki] downloading Search-R1's prebuilt e5 Flat index (~65 GB)" >&2
      for part in part_aa part_ab; do hub_get PeterJinGo/wiki-18-e5-index "$part" >/dev/null; done
      cat "$OUT/part_aa" "$OUT/part_ab" > "$FLAT_INDEX.part" && mv "$FLAT_INDEX.part" "$FLAT_INDEX"
      rm -f "$OUT/part_aa" "$OUT/part_ab"
    fi
  fi
  [ -s "$FLAT_INDEX" ] || { echo "error: FLAT_INDEX=$FLAT_INDEX does not exist or is empty" >&2; exit 2; }
  echo "[wiki] importing the prebuilt index (row i = corpus line i) into $OUT/e5-index as $INDEX_TYPE" >&2
  exec "$PYTHON" -m retriever_server.import_index --faiss "$FLAT_INDEX" --corpus "$CORPUS" \
    --model "$MODEL" --out "$OUT/e5-index" --index-type "$INDEX_TYPE" --place "$PLACE"
fi

echo "[wiki] building $INDEX_TYPE index of $CORPUS with $MODEL on $DEVICE (resumable)" >&2
fp16=()
if [ "$DEVICE" != cpu ]; then fp16=(--fp16); fi
exec "$PYTHON" -m retriever_server.build_index --corpus "$CORPUS" --model "$MODEL" --out "$OUT/e5-index" \
  --index-type "$INDEX_TYPE" --device "$DEVICE" --batch-size 512 "${fp16[@]}"
