"""Serve a prebuilt FAISS index (e.g. Search-R1's ``e5_Flat.index`` over wiki-18) without re-encoding.

Search-R1 publishes the wiki-18 corpus with an E5 Flat index whose row i is line i of the corpus
jsonl. Re-encoding 21M passages costs GPU-hours, so this writes our docstore from the corpus,
links (or copies) the index file, checks that the row counts agree, and writes the same
``meta.json`` as ``build_index``; the server then refuses any model/index mismatch as usual.

    python -m retriever_server.import_index --faiss e5_Flat.index --corpus wiki-18.jsonl \\
        --model intfloat/e5-base-v2 --out idx/e5
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
from pathlib import Path

from tqdm import tqdm

from .build_index import META_FILE, BuildError, write_meta
from .corpora import CorpusError, file_sha256, iter_corpus
from .docstore import DocStoreWriter
from .faiss_index import INDEX_FILE, read_index
from .profiles import DEFAULT_MODEL, resolve_profile

log = logging.getLogger(__name__)
PLACEMENTS = ("symlink", "hardlink", "copy")


def _place(src: Path, dst: Path, how: str) -> None:
    dst.unlink(missing_ok=True)
    if how == "symlink":
        dst.symlink_to(src.resolve())
    elif how == "hardlink":
        os.link(src, dst)
    else:
        shutil.copyfile(src, dst)


def import_index(faiss_path: str | Path, corpus_path: str | Path, out_dir: str | Path,
                 model: str = DEFAULT_MODEL, *, profile: str | None = None, max_length: int = 256,
                 place: str = "symlink", progress: bool = True) -> dict:
    """Make ``out_dir`` a servable index folder from a prebuilt FAISS file and its corpus."""
    faiss_path, corpus_path, out = Path(faiss_path), Path(corpus_path), Path(out_dir)
    for what, p in (("FAISS index", faiss_path), ("corpus", corpus_path)):
        if not p.is_file():
            raise BuildError(f"{what} file not found: {p}")
    if place not in PLACEMENTS:
        raise BuildError(f"--place must be one of {PLACEMENTS}, got {place!r}")
    index = read_index(faiss_path, mmap=True)  # header and mapped codes only: no RAM for 60 GB
    prof = resolve_profile(model, profile)
    out.mkdir(parents=True, exist_ok=True)
    (out / META_FILE).unlink(missing_ok=True)
    writer = DocStoreWriter(out)
    for row in tqdm(iter_corpus(corpus_path), desc="docstore", unit="psg", disable=not progress, mininterval=2.0):
        writer.add(row)
    count = writer.close()
    if count != index.ntotal:
        raise BuildError(f"{faiss_path} holds {index.ntotal} vectors but {corpus_path} has {count} passages: "
                         "row i of the index must be passage i of the corpus")
    _place(faiss_path, out / INDEX_FILE, place)
    state = {"corpus_sha256": file_sha256(corpus_path), "model": model, "profile": prof.to_dict(),
             "max_length": max_length, "imported_from": str(faiss_path.resolve())}
    meta = write_meta(out, state, prof, f"imported:{type(index).__name__}", index.d, count, corpus_path)
    log.info("imported %s (%d x %d) into %s", faiss_path, count, index.d, out)
    return meta


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--faiss", required=True, help="prebuilt FAISS index file (row i = corpus line i)")
    p.add_argument("--corpus", required=True, help="the corpus jsonl the index was built from")
    p.add_argument("--out", required=True)
    p.add_argument("--model", default=DEFAULT_MODEL, help="the encoder the index was built with")
    p.add_argument("--profile", default=None, help="e5 | st (default: inferred from the model name)")
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--place", default="symlink", choices=PLACEMENTS, help="how the index file enters --out")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        import_index(a.faiss, a.corpus, a.out, a.model, profile=a.profile, max_length=a.max_length, place=a.place)
    except (BuildError, CorpusError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
