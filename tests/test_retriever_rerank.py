"""The ``ivf_pqfs_sq8`` kind (issue #49): an IVF of 4-bit fast-scan PQ codes proposes a
shortlist, re-ranked by SQ8 codes read from a mapped file (retriever_server/rerank.py).

Built through ``import_index``'s CLI on the hard synthetic set with the user's questions,
calibrated over nprobe and the re-rank depth, served over HTTP. The re-rank is held to FAISS's
own: its scores to FAISS's SQ8 decode, its answers to FAISS's ``IndexRefine`` over the same
shortlist. ``--mmap`` for this kind is in tests/test_retriever_mmap.py (every streamed kind)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import requests

faiss = pytest.importorskip("faiss")

from retriever_server import import_index as imp
from retriever_server import ivf_stream
from retriever_server.background import ServerProcess
from retriever_server.calibrate import ExactTopK, recall_at_k
from retriever_server.faiss_index import INDEX_FILE, open_index
from retriever_server.ivf_stream import IVFDATA_FILE, StreamSettings
from retriever_server.rerank import (
    K_FACTORS,
    RERANK_CODES_FILE,
    RERANK_SQ_FILE,
    RerankedIndex,
    RerankFilesError,
    SQ8Scorer,
    encode_rerank,
    train_rerank_quantizer,
)
from retriever_server.retriever import Retriever
from retriever_server.synthetic import SyntheticSpec, SyntheticVectors, write_search_r1_pair

ROWS, DIM, NLIST = 20_000, 256, 64
HARD = SyntheticSpec(dim=DIM, kind="hard")
KIND = "ivf_pqfs_sq8"


def _questions(n: int, salt: str) -> list[str]:
    return [f"{salt} question number {i}?" for i in range(n)]


@pytest.fixture(scope="module")
def hard_files(tmp_path_factory):
    vecs = SyntheticVectors(HARD, ROWS)
    return (*write_search_r1_pair(vecs, tmp_path_factory.mktemp("rerank")), vecs)


@pytest.fixture(scope="module")
def imported(hard_files, tmp_path_factory):
    corpus, flat, vecs = hard_files
    out = tmp_path_factory.mktemp("rerank_idx") / "idx"
    qfile = out.parent / "questions.txt"
    qfile.write_text("\n".join(_questions(200, "train")) + "\n")
    res = subprocess.run([sys.executable, "-m", "retriever_server.import_index", "--faiss", str(flat), "--corpus",
                          str(corpus), "--out", str(out), "--model", HARD.model_name, "--profile", "e5",
                          "--index-type", KIND, "--nlist", str(NLIST), "--chunk-rows", "6000", "--coarse-dim", "32",
                          "--calibration-queries", str(qfile)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "calibrated nprobe" in res.stderr
    return out, json.loads((out / "meta.json").read_text()), vecs


def test_sq8_scores_equal_faiss_decode():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3_000, DIM)).astype(np.float32) * rng.uniform(0.1, 2.0, DIM).astype(np.float32)
    sq = train_rerank_quantizer(x)
    codes = encode_rerank(sq, x[:700])
    assert codes.shape == (700, DIM) and codes.dtype == np.uint8
    for q in rng.standard_normal((5, DIM)).astype(np.float32):
        want = sq.sq.decode(codes) @ q  # FAISS's own reconstruction
        np.testing.assert_allclose(SQ8Scorer(sq).scores(codes, q), want, rtol=1e-4, atol=1e-3)


def test_import_calibrates_nprobe_and_depth(imported):
    out, meta, vecs = imported
    cal = meta["calibration"]
    assert meta["index_type"] == KIND and cal["reached"] and cal["k"] == 3 and cal["target"] == 0.95
    assert meta["k_factor"] == cal["k_factor"] in K_FACTORS and meta["nprobe"] == cal["nprobe"]
    assert all("k_factor" in c for c in cal["curve"])
    reached = [c for c in cal["curve"] if c["recall"] >= 0.95]
    chosen = next(c for c in reached if c["nprobe"] == cal["nprobe"] and c["k_factor"] == cal["k_factor"])
    assert chosen["ms_per_query"] == min(c["ms_per_query"] for c in reached)  # the cheapest point reaching it
    shallow = [c for c in cal["curve"] if c["k_factor"] == K_FACTORS[0]]
    assert max(c["recall"] for c in shallow) < 0.95  # the 4-bit shortlist alone is too coarse on this set
    # the files: fast-scan lists in index.faiss, SQ8 codes by row in a plain file, no on-disk lists
    assert (out / RERANK_CODES_FILE).stat().st_size == ROWS * DIM and (out / RERANK_SQ_FILE).is_file()
    assert not (out / IVFDATA_FILE).exists() and not (out / ".import").exists()
    # held-out questions, brute force exact, through the server's own Retriever
    r = Retriever(out)
    assert isinstance(r.index, RerankedIndex) and r.index.k_factor == meta["k_factor"]
    held = _questions(200, "held-out")
    q = r.encoder.encode(held, is_query=True)
    exact = np.argsort(-(q @ vecs.read(0, ROWS).T), axis=1)[:, :3]
    assert recall_at_k(r.searcher.search(q, 3)[1], exact, 3) >= 0.9
    assert r.memory()["index_mapped_mb"] > 0  # the re-rank codes are mapped pages, not private memory


def test_rerank_answers_as_faiss_index_refine(imported):
    """The same shortlist re-ranked by FAISS's own IndexRefine over the same SQ8 codes gives the
    same top 3: the numpy scoring computes what FAISS computes."""
    out, meta, vecs = imported
    ours = open_index(out / INDEX_FILE, nprobe=meta["nprobe"], k_factor=meta["k_factor"])
    refine = faiss.read_index(str(out / RERANK_SQ_FILE))
    faiss.copy_array_to_vector(np.fromfile(out / RERANK_CODES_FILE, np.uint8), refine.codes)
    refine.ntotal = ROWS
    theirs = faiss.IndexRefine(ours.base, refine)
    theirs.k_factor = meta["k_factor"]
    q = np.stack([vecs.query(t) for t in _questions(100, "refine")])
    s1, i1 = ours.search(q, 3)
    s2, i2 = theirs.search(q, 3)
    same = (i1 == i2).all(axis=1)
    assert same.mean() >= 0.98, same.mean()  # exact ties may order differently
    np.testing.assert_allclose(s1, s2, rtol=1e-4, atol=1e-3)


def test_served_over_http_reports_depth_and_a_low_nprobe_warning(imported):
    out, meta, _ = imported
    with ServerProcess("--index", str(out), "--max-batch", "8") as srv:
        h = requests.get(srv.url + "/health", timeout=30).json()
        assert h["index_type"] == KIND and h["k_factor"] == meta["k_factor"] and h["nprobe"] == meta["nprobe"]
        assert h["calibration"]["k_factor"] == meta["k_factor"] and h["calibration"]["warning"] is None
        r = requests.post(srv.url + "/retrieve", json={"queries": _questions(4, "http"), "topk": 3}, timeout=60)
        assert r.status_code == 200 and all(len(hits) == 3 for hits in r.json()["result"])
    with ServerProcess("--index", str(out), "--nprobe", "1") as srv:
        cal = requests.get(srv.url + "/health", timeout=30).json()["calibration"]
        assert "--nprobe 1 is below the calibrated nprobe" in cal["warning"]
        assert cal["recall_at_serving_nprobe"] == next(
            c["recall"] for c in meta["calibration"]["curve"] if c["nprobe"] == 1 and c["k_factor"] == meta["k_factor"])


def test_codes_of_another_build_are_refused_with_a_message(imported, tmp_path):
    out, _, _ = imported
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    with open(bad / RERANK_CODES_FILE, "r+b") as f:
        f.truncate((ROWS - 1) * DIM)
    with pytest.raises(RerankFilesError, match="two different builds"):
        Retriever(bad)
    (bad / RERANK_CODES_FILE).unlink()
    res = subprocess.run([sys.executable, "-m", "retriever_server.serve", "--index", str(bad), "--port", "0"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "refusing to start" in res.stderr and RERANK_CODES_FILE in res.stderr


def test_a_crashed_import_resumes_to_the_same_index(hard_files, tmp_path, monkeypatch):
    corpus, flat, vecs = hard_files
    settings = StreamSettings(KIND, nlist=32, chunk_rows=2_500, coarse_dim=32)
    monkeypatch.setattr(ivf_stream, "CHECKPOINT_ROWS", 5_000)  # a checkpoint every second chunk
    seen: list[int] = []

    def crash_at_fourth_chunk(start: int, x: np.ndarray) -> None:
        seen.append(start)
        if start == 7_500:
            raise KeyboardInterrupt("killed mid-import")
    kw = dict(profile="e5", index_type=KIND, settings=settings, progress=False, calibration_sample=0, nprobe=8)
    with pytest.raises(KeyboardInterrupt):
        imp.import_index(flat, corpus, tmp_path / "resumed", HARD.model_name, on_chunk=crash_at_fourth_chunk, **kw)
    assert not (tmp_path / "resumed" / "meta.json").exists()
    assert (tmp_path / "resumed" / ".import" / ivf_stream.LIVE_FILE).exists()  # 5,000 rows checkpointed
    seen.clear()
    imp.import_index(flat, corpus, tmp_path / "resumed", HARD.model_name, on_chunk=lambda start, x: seen.append(start), **kw)
    assert seen[0] == 5_000  # the resumed run starts after the checkpoint, not at row 0
    imp.import_index(flat, corpus, tmp_path / "whole", HARD.model_name, **kw)
    a, b = (tmp_path / "resumed" / RERANK_CODES_FILE).read_bytes(), (tmp_path / "whole" / RERANK_CODES_FILE).read_bytes()
    assert a == b
    q = np.stack([vecs.query(t) for t in _questions(50, "resume")])
    ra, rb = Retriever(tmp_path / "resumed"), Retriever(tmp_path / "whole")
    np.testing.assert_array_equal(ra.searcher.search(q, 3)[1], rb.searcher.search(q, 3)[1])
    exact = ExactTopK(q, 3)
    exact.add(0, vecs.read(0, ROWS))
    assert recall_at_k(ra.searcher.search(q, 3)[1], exact.ids, 3) > 0.5  # a real index, not empty answers


def test_stray_rerank_files_do_not_turn_an_sq8_index_into_a_reranked_one(imported, hard_files, tmp_path):
    corpus, flat, _ = hard_files
    out, _, _ = imported
    d = tmp_path / "sq8"
    imp.import_index(flat, corpus, d, HARD.model_name, profile="e5", index_type="ivf_sq8", progress=False,
                     settings=StreamSettings("ivf_sq8", nlist=32, chunk_rows=10_000, coarse_dim=32),
                     calibration_sample=0)
    for name in (RERANK_CODES_FILE, RERANK_SQ_FILE):
        shutil.copy(out / name, d / name)
    assert not isinstance(open_index(d / INDEX_FILE), RerankedIndex)


def test_forty_chunks_build_one_index_under_glibcs_heap_checks(hard_files, tmp_path):
    """FAISS's merge_from on fast-scan IVF indexes corrupts the heap (double free with 40 blocks
    of 3,000 rows, "corrupted double-linked list" at 21M rows): the import adds every chunk to one
    index instead. 40 chunks through the CLI with glibc's heap checks on (MALLOC_CHECK_=3 aborts
    on the first corruption)."""
    corpus, flat, vecs = hard_files
    out = tmp_path / "forty"
    res = subprocess.run([sys.executable, "-m", "retriever_server.import_index", "--faiss", str(flat), "--corpus",
                          str(corpus), "--out", str(out), "--model", HARD.model_name, "--profile", "e5",
                          "--index-type", KIND, "--nlist", "32", "--chunk-rows", "500", "--coarse-dim", "32",
                          "--calibration-sample", "0", "--nprobe", "8"],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "MALLOC_CHECK_": "3"})
    assert res.returncode == 0, res.stderr[-2000:]
    index = open_index(out / INDEX_FILE, nprobe=32, k_factor=300)
    assert index.ntotal == ROWS
    q = np.stack([vecs.query(t) for t in _questions(30, "forty")])
    exact = ExactTopK(q, 3)
    exact.add(0, vecs.read(0, ROWS))
    assert recall_at_k(index.search(q, 3)[1], exact.ids, 3) > 0.8  # every list searched: the codes' own limit
