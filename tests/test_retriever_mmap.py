"""``--mmap`` for every index kind the builder and the importer write, through the real HTTP server.

Issue #49: an ``ivf_sq8`` folder served with ``--mmap`` died with a segmentation fault on its
warm-up search (FAISS's ``IO_FLAG_MMAP`` skips mapping on-disk lists). Each kind here is served
by ``python -m retriever_server.serve`` (a child process, so a crash is an exit code, not a dead
test run) with and without ``--mmap``; both must answer ``/retrieve`` and answer the same rows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import requests

faiss = pytest.importorskip("faiss")

from retriever_server import import_index as imp
from retriever_server.background import ServerProcess
from retriever_server.build_index import build_index
from retriever_server.faiss_index import INDEX_TYPES, STREAMED_TYPES, read_index, unmapped_lists
from retriever_server.ivf_stream import StreamSettings
from retriever_server.synthetic import SyntheticSpec, SyntheticVectors, write_search_r1_pair

ROWS, DIM = 3_000, 64
SPEC = SyntheticSpec(dim=DIM)
BUILT = [f"build:{k}" for k in (*INDEX_TYPES, *STREAMED_TYPES)]
IMPORTED = [f"import:{k}" for k in imp.INDEX_TYPES]
QUERIES = [f"what is question {i}?" for i in range(8)]


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> tuple[Path, Path]:
    """A corpus of ROWS synthetic passages and its Search-R1-style IndexFlatIP file."""
    return write_search_r1_pair(SyntheticVectors(SPEC, ROWS), tmp_path_factory.mktemp("mmap_src"))


@pytest.fixture(scope="module")
def folders(sources, tmp_path_factory) -> dict[str, Path]:
    corpus, flat = sources
    work = tmp_path_factory.mktemp("mmap_idx")
    out: dict[str, Path] = {}
    for name in BUILT:
        kind = name.split(":", 1)[1]
        d = work / kind.replace(",", "_")
        build_index(corpus, d, model=SPEC.model_name, profile="e5", index_type=kind, chunk_size=1_000,
                    progress=False, calibration_sample=0)
        out[name] = d
    for name in IMPORTED:
        kind = name.split(":", 1)[1]
        d = work / f"imported_{kind}"
        settings = StreamSettings(kind, nlist=32, chunk_rows=1_000, coarse_dim=16) if kind != "flat" else None
        imp.import_index(flat, corpus, d, SPEC.model_name, profile="e5", index_type=kind, place="copy",
                         settings=settings, progress=False, calibration_sample=0)
        out[name] = d
    return out


def _answers(url: str) -> list[list[str]]:
    r = requests.post(url + "/retrieve", json={"queries": QUERIES, "topk": 3}, timeout=60)
    assert r.status_code == 200, r.text
    res = r.json()["result"]
    assert len(res) == len(QUERIES) and all(len(hits) == 3 for hits in res)
    return [[h["id"] for h in hits] for hits in res]


@pytest.mark.parametrize("kind", BUILT + IMPORTED)
def test_every_index_kind_serves_with_and_without_mmap(folders, kind):
    d = folders[kind]
    answers = {}
    for mmap in (False, True):
        with ServerProcess("--index", str(d), *(["--mmap"] if mmap else []), "--max-batch", "8") as srv:
            answers[mmap] = _answers(srv.url)
            h = requests.get(srv.url + "/health", timeout=30).json()
            assert h["index_size"] == ROWS
            assert srv.proc.poll() is None, srv.stderr_text()  # still alive after searching
    assert answers[True] == answers[False], kind  # the same index, mapped or read, answers the same


def test_flat_answers_are_the_exact_top3(folders):
    """A check the per-kind test cannot make by comparing two servers: the answers are right."""
    vecs = SyntheticVectors(SPEC, ROWS)
    x = vecs.read(0, ROWS)
    q = np.stack([vecs.query(t) for t in QUERIES])
    exact = np.argsort(-(q @ x.T), axis=1)[:, :3]
    with ServerProcess("--index", str(folders["import:flat"]), "--mmap") as srv:
        assert _answers(srv.url) == [[str(i) for i in row] for row in exact]


def test_ondisk_lists_read_with_faiss_mmap_flag_are_unmapped_and_refused(folders):
    """The root cause, pinned: FAISS's IO_FLAG_MMAP (= SKIP_IVF_DATA | tag) leaves on-disk lists
    unmapped; our reader detects that instead of handing out an index that crashes on search."""
    path = folders["build:ivf_sq8"] / "index.faiss"
    raw = faiss.read_index(str(path), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY | faiss.IO_FLAG_ONDISK_SAME_DIR)
    assert unmapped_lists(raw)  # searching `raw` would segfault: never do it
    del raw
    ok = read_index(path, mmap=True)
    assert not unmapped_lists(ok) and ok.ntotal == ROWS
