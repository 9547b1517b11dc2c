"""Serve Search-R1's prebuilt ``e5_Flat.index`` over wiki-18 without re-encoding 21M passages.

Search-R1 publishes wiki-18 with an E5 ``IndexFlatIP`` (64.5 GB, fp32) whose row i is line i of
the corpus jsonl. Two ways in:

* ``--index-type ivf_sq8`` or ``ivf_pq`` (what wiki-18 needs on a machine with less RAM than 64.5 GB): the file is **streamed** by byte offset
  (:mod:`retriever_server.flat_file`, one chunk in RAM) into an IVF index whose inverted lists are
  one memory-mapped file (:mod:`retriever_server.ivf_stream`): 16 GB (SQ8) or 2 GB (PQ) instead
  of 64.5 GB, RSS during the conversion a few GB, a progress bar, and a rerun after a crash
  continues with the next unfinished chunk.
* ``--index-type ivf_pqfs_sq8``: the same stream into an IVF of 4-bit fast-scan PQ codes (in RAM,
  2.2 GB at 21M) whose shortlist is re-ranked by SQ8 codes in a mapped file (16 GB at 21M):
  the same recall as ``ivf_sq8`` for far less search time on E5-like vectors
  (:mod:`retriever_server.rerank`, docs/retriever.md).
* ``--index-type flat`` (the default): the file itself is linked (or copied) in and served exact
  (``--mmap``).

Either way the docstore is written from the corpus (random access by offset, never loaded),
the row counts must agree, and ``meta.json`` is written last: a folder without it is refused by
the server, so a crash never leaves an index the server would start on.

    python -m retriever_server.import_index --faiss e5_Flat.index --corpus wiki-18.jsonl \\
        --model intfloat/e5-base-v2 --out idx/e5 --index-type ivf_sq8 [--nprobe 32]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from .build_index import META_FILE, BuildError, write_meta
from .calibrate import (
    DEFAULT_K,
    DEFAULT_SAMPLE,
    DEFAULT_TARGET,
    CalibrationError,
    ExactTopK,
    QuerySet,
    add_calibration_args,
    calibrate,
    check_target,
    load_queries,
    report_calibration,
    stand_in_queries,
    unreached_message,
)
from .corpora import CorpusError, file_sha256, iter_corpus
from .docstore import DOCS_FILE, OFFSETS_FILE, DocStoreWriter
from .faiss_index import DEFAULT_IVF_NPROBE, INDEX_FILE, open_index, read_index
from .flat_file import FlatFileError, open_flat_ip
from .ivf_stream import (
    IVFDATA_FILE,
    RERANK_KINDS,
    STATE_FILE,
    STREAM_KINDS,
    WORK_DIR,
    ConversionError,
    StreamingIVFBuilder,
    StreamSettings,
    VectorSource,
    check_kind,
    discard_unfinished,
    estimate_block_bytes,
    estimate_output_bytes,
)
from .profiles import DEFAULT_MODEL, resolve_profile
from .rerank import DEFAULT_K_FACTOR, RERANK_CODES_FILE, RERANK_SQ_FILE

log = logging.getLogger(__name__)
PLACEMENTS = ("symlink", "hardlink", "copy")
INDEX_TYPES = ("flat", *STREAM_KINDS)
DISK_MARGIN_BYTES = 1 << 30  # never fill the disk to the last byte: logs and others need room
DOCSTORE_OVERHEAD = 1.05  # docs.jsonl re-serializes each row ({"id", "contents"}), plus offsets


def _place(src: Path, dst: Path, how: str) -> None:
    dst.unlink(missing_ok=True)
    if how == "symlink":
        dst.symlink_to(src.resolve())
    elif how == "hardlink":
        os.link(src, dst)
    else:
        shutil.copyfile(src, dst)


def check_disk(out: Path, need: int, what: str) -> None:
    """Refuse to start a conversion that cannot finish: the free space must hold ``need`` bytes."""
    probe = out if out.exists() else next(p for p in out.parents if p.exists())
    free = shutil.disk_usage(probe).free
    if free < need + DISK_MARGIN_BYTES:
        raise BuildError(f"not enough disk for {what} in {out}: needs {need / 1e9:.1f} GB "
                         f"(+{DISK_MARGIN_BYTES / 1e9:.1f} GB margin), {free / 1e9:.1f} GB free; "
                         "free space or choose --out on another disk (ivf_pq needs ~8x less than ivf_sq8)")


def streamed_need_bytes(kind: str, dim: int, ntotal: int, docs_bytes: int) -> int:
    """Blocks and merged lists exist side by side until the merge ends, plus the docstore."""
    return (estimate_output_bytes(kind, dim, ntotal) + estimate_block_bytes(kind, dim, ntotal)
            + int(docs_bytes * DOCSTORE_OVERHEAD))


def write_docstore_from_corpus(corpus_path: Path, out: Path, progress: bool) -> int:
    """docs.jsonl + offsets.npy from the corpus (skipped when a finished one is already there)."""
    if (out / DOCS_FILE).exists() and (out / OFFSETS_FILE).exists():
        offsets = np.load(out / OFFSETS_FILE, mmap_mode="r")
        if int(offsets[-1]) == (out / DOCS_FILE).stat().st_size:
            return len(offsets) - 1
    writer = DocStoreWriter(out)
    for row in tqdm(iter_corpus(corpus_path), desc="import: docstore", unit="psg", unit_scale=True,
                    disable=not progress, mininterval=5.0):
        writer.add(row)
    return writer.close()


def convert(source: VectorSource, out_dir: str | Path, *, settings: StreamSettings, docstore: Callable[[Path], int],
            state: dict[str, Any], nprobe: int | None = None, docs_bytes: int = 0, overwrite: bool = False,
            on_chunk: Callable[[int, np.ndarray], None] | None = None, progress: bool = True,
            queries: QuerySet | None = None, calibration_sample: int = DEFAULT_SAMPLE,
            target_recall: float = DEFAULT_TARGET, recall_k: int = DEFAULT_K) -> dict[str, Any]:
    """Stream ``source`` into a servable IVF folder; ``docstore(out)`` writes the passages.

    The shared core of :func:`import_index` (a Search-R1 flat file), ``build_index``'s streamed
    types and the scale bench (synthetic rows generated chunk by chunk, no source file at all).

    Calibration (:mod:`retriever_server.calibrate`): the exact top-``recall_k`` of ``queries``
    (or, without them, of ``calibration_sample`` stand-in queries; 0 = no calibration) is kept
    while the chunks stream by; after the merge the smallest nprobe reaching ``target_recall``
    is measured and becomes the server's default, unless ``nprobe`` fixes it.
    """
    out = Path(out_dir)
    check_kind(settings.kind)
    if nprobe is not None and nprobe < 1:
        raise BuildError(f"--nprobe must be >= 1, got {nprobe}")
    check_target(target_recall, recall_k)
    if queries is None and calibration_sample > 0:
        queries = stand_in_queries(source, calibration_sample)
    exact = ExactTopK(queries.vectors, recall_k) if queries is not None else None

    def on_chunk_all(start: int, x: np.ndarray) -> None:
        if exact is not None:
            exact.add(start, x)
        if on_chunk is not None:
            on_chunk(start, x)
    out.mkdir(parents=True, exist_ok=True)
    (out / META_FILE).unlink(missing_ok=True)  # from here on the folder is not servable
    if overwrite:
        discard_unfinished(out)
    builder = StreamingIVFBuilder(source, out, settings, progress=progress)
    if not (out / WORK_DIR / STATE_FILE).exists():  # a resumed run already passed this check
        check_disk(out, streamed_need_bytes(settings.kind, source.dim, source.ntotal, docs_bytes),
                   f"a {settings.kind} index of {source.ntotal} x {source.dim}")
    t0 = time.perf_counter()
    count = docstore(out)
    docs_s = time.perf_counter() - t0
    if count != source.ntotal:
        raise BuildError(f"the source holds {source.ntotal} vectors but the corpus has {count} passages: "
                         "row i of the index must be passage i of the corpus")
    for name in (INDEX_FILE, IVFDATA_FILE, RERANK_CODES_FILE, RERANK_SQ_FILE):  # another kind's, from before
        (out / name).unlink(missing_ok=True)
    info = builder.build(on_chunk_all)
    info["docstore_s"] = docs_s
    s = builder.settings
    meta_state = {**state, "nlist": s.nlist, "ivf_factory": info["factory"],
                  "import": {k: (round(v, 1) if isinstance(v, float) else v) for k, v in info.items()}}
    cal = None
    if exact is not None and queries is not None:
        t0 = time.perf_counter()
        refed = exact.fill_gaps(source, s.chunk_rows)  # chunks a resumed run skipped
        cal = calibrate(open_index(out / INDEX_FILE), queries, exact, k=recall_k, target=target_recall,
                        progress=progress)
        cal["seconds"] = round(time.perf_counter() - t0, 1)
        cal["rows_reread"] = refed
        if not cal["reached"]:
            log.warning("%s", unreached_message(cal))
        meta_state["calibration"] = cal
    chosen = nprobe if nprobe is not None else cal["nprobe"] if cal else DEFAULT_IVF_NPROBE
    meta_state["nprobe"] = min(chosen, s.nlist)
    if s.kind in RERANK_KINDS:
        meta_state["k_factor"] = cal["k_factor"] if cal else DEFAULT_K_FACTOR
    return meta_state



def import_index(faiss_path: str | Path, corpus_path: str | Path, out_dir: str | Path,
                 model: str = DEFAULT_MODEL, *, profile: str | None = None, max_length: int = 256,
                 index_type: str = "flat", place: str = "symlink", nprobe: int | None = None,
                 settings: StreamSettings | None = None, overwrite: bool = False,
                 on_chunk: Callable[[int, np.ndarray], None] | None = None, progress: bool = True,
                 calibration_queries: str | Path | None = None, calibration_sample: int = DEFAULT_SAMPLE,
                 target_recall: float = DEFAULT_TARGET, recall_k: int = DEFAULT_K) -> dict:
    """Make ``out_dir`` a servable index folder from a prebuilt FAISS file and its corpus.

    Streamed types are calibrated (see :func:`convert`); ``calibration_queries`` is a text file
    of questions (encoded with ``model``, as the server will) or a ``.npy`` of query vectors."""
    faiss_path, corpus_path, out = Path(faiss_path), Path(corpus_path), Path(out_dir)
    if index_type not in INDEX_TYPES:
        check_kind(index_type)  # raises with the reason this type cannot be streamed
    if place not in PLACEMENTS:
        raise BuildError(f"--place must be one of {PLACEMENTS}, got {place!r}")
    for what, p in (("FAISS index", faiss_path), ("corpus", corpus_path)):
        if not p.is_file():
            raise BuildError(f"{what} file not found: {p}")
    prof = resolve_profile(model, profile)
    state = {"corpus_sha256": None, "model": model, "profile": prof.to_dict(), "max_length": max_length,
             "imported_from": str(faiss_path.resolve())}
    if index_type == "flat":
        index = read_index(faiss_path, mmap=True)  # header and mapped codes only: no RAM for 60 GB
        out.mkdir(parents=True, exist_ok=True)
        (out / META_FILE).unlink(missing_ok=True)
        count = write_docstore_from_corpus(corpus_path, out, progress)
        if count != index.ntotal:
            raise BuildError(f"{faiss_path} holds {index.ntotal} vectors but {corpus_path} has {count} passages: "
                             "row i of the index must be passage i of the corpus")
        _place(faiss_path, out / INDEX_FILE, place)
        state["corpus_sha256"] = file_sha256(corpus_path)
        return write_meta(out, state, prof, f"imported:{type(index).__name__}", index.d, count, corpus_path)
    source = open_flat_ip(faiss_path)
    check_target(target_recall, recall_k)
    queries = None
    if calibration_queries is not None:
        queries = load_queries(calibration_queries, source.dim, _query_encoder(model, prof, max_length))
    settings = StreamSettings(kind=index_type) if settings is None else settings
    if settings.kind != index_type:
        settings = dataclasses.replace(settings, kind=index_type)
    if not 0 <= settings.coarse_dim <= source.dim:
        raise BuildError(f"--coarse-dim must be between 0 (lists in the full {source.dim}-d space) and "
                         f"{source.dim}, got {settings.coarse_dim}")
    meta_state = convert(source, out, settings=settings,
                         docstore=lambda o: write_docstore_from_corpus(corpus_path, o, progress),
                         state=state, nprobe=nprobe, docs_bytes=corpus_path.stat().st_size,
                         overwrite=overwrite, on_chunk=on_chunk, progress=progress, queries=queries,
                         calibration_sample=calibration_sample, target_recall=target_recall, recall_k=recall_k)
    meta_state["corpus_sha256"] = file_sha256(corpus_path)
    meta = write_meta(out, meta_state, prof, index_type, source.dim, source.ntotal, corpus_path)
    log.info("imported %s (%d x %d) into %s as %s", faiss_path, source.ntotal, source.dim, out, index_type)
    return meta


def _query_encoder(model: str, prof, max_length: int) -> Callable[[list[str]], np.ndarray]:
    """Encode calibration questions with the index's model, exactly as the server encodes queries."""
    def encode(texts: list[str]) -> np.ndarray:
        from .encoder import load_encoder

        enc = load_encoder(model, prof, max_length=max_length)
        return enc.encode(texts, is_query=True, batch_size=64)
    return encode


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m retriever_server.import_index", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    d = StreamSettings()
    p.add_argument("--faiss", required=True, help="Search-R1's IndexFlatIP file (row i = corpus line i)")
    p.add_argument("--corpus", required=True, help="the corpus jsonl the index was built from")
    p.add_argument("--out", required=True)
    p.add_argument("--model", default=DEFAULT_MODEL, help="the encoder the index was built with")
    p.add_argument("--profile", default=None, help="e5 | st (default: inferred from the model name)")
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--index-type", default="flat",
                   help=f"{' | '.join(INDEX_TYPES)} (default %(default)s: link the file as it is and serve it "
                        "exact; ivf_sq8 or ivf_pqfs_sq8 for wiki-18 on a machine with less RAM than the file: "
                        "ivf_pqfs_sq8 answers faster at the same recall for 2.2 GB more RAM at 21M rows)")
    p.add_argument("--nprobe", type=int, default=None,
                   help="lists searched per query, the server's default (default: the calibrated one)")
    p.add_argument("--nlist", type=int, default=0, help="IVF lists (default ~sqrt(rows), a power of two)")
    p.add_argument("--chunk-rows", type=int, default=d.chunk_rows,
                   help="vectors in RAM at a time, and the unit a restart resumes from (default %(default)s)")
    p.add_argument("--train-rows", type=int, default=0, help="k-means sample (default 40 x nlist)")
    p.add_argument("--coarse-dim", type=int, default=d.coarse_dim,
                   help="the PCA space the lists are chosen in (default %(default)s; 0: the full vectors, "
                        "which reach a recall with fewer codes scanned per query for more assignment "
                        "arithmetic; docs/retriever.md has the measured trade)")
    p.add_argument("--overwrite", action="store_true", help="discard an unfinished conversion in --out")
    p.add_argument("--place", default="symlink", choices=PLACEMENTS, help="--index-type flat: how the file enters --out")
    add_calibration_args(p)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        meta = import_index(a.faiss, a.corpus, a.out, a.model, profile=a.profile, max_length=a.max_length,
                            index_type=a.index_type, place=a.place, nprobe=a.nprobe, overwrite=a.overwrite,
                            settings=StreamSettings(a.index_type, a.nlist, a.chunk_rows, a.train_rows,
                                                    coarse_dim=a.coarse_dim),
                            calibration_queries=a.calibration_queries, calibration_sample=a.calibration_sample,
                            target_recall=a.target_recall, recall_k=a.recall_k)
    except (BuildError, CorpusError, ConversionError, FlatFileError, CalibrationError, ValueError, OSError) as exc:
        print(f"import_index: error: {exc}", file=sys.stderr)
        return 2
    report_calibration(meta, "import_index")
    cal = meta.get("calibration") or {}
    print(json.dumps({**{k: meta.get(k) for k in ("index_type", "count", "dim", "nlist", "nprobe", "import")},
                      "calibration": {k: cal.get(k) for k in ("nprobe", "recall", "k", "target", "reached")}
                      if cal else None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
