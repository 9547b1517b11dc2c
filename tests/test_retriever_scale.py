"""The wiki-18-scale path at small N: Search-R1's flat file read by offset, the streamed IVF-SQ8
conversion (resume, atomic output, clear errors), its merge against FAISS's own (same bytes, same
answers, bounded peak RSS), and bench/retriever_scale.py end to end through the real server. docs/retriever.md holds the same code's figures at 2M and 21M rows."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import requests

faiss = pytest.importorskip("faiss")

from retriever_server import import_index as imp
from retriever_server import ivf_stream
from retriever_server.background import ServerProcess
from retriever_server.build_index import build_index
from retriever_server.flat_file import DATA_OFFSET, FlatFileError, FlatIPWriter, open_flat_ip
from retriever_server.faiss_index import read_index
from retriever_server.ivf_stream import IVFDATA_FILE, WORK_DIR, ConversionError, StreamingIVFBuilder, StreamSettings
from retriever_server.retriever import IndexMismatch, Retriever
from retriever_server.synthetic import SyntheticSpec, SyntheticVectors, corpus_lines

ROOT = Path(__file__).resolve().parents[1]
ROWS = 12_000


def _bench(name: str = "retriever_scale"):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def search_r1_files(tmp_path_factory):
    """A Search-R1-style corpus + e5_Flat.index of ROWS synthetic rows, and their exact top-10."""
    bench = _bench()
    work = tmp_path_factory.mktemp("scale")
    vecs = SyntheticVectors(SyntheticSpec(), ROWS)
    exact = bench.ExactTopK(np.stack([vecs.query(q) for q in bench.query_texts(100)]))
    corpus, flat = bench.write_search_r1_files(vecs, work, exact)
    return corpus, flat, vecs, exact.ids


def test_flat_writer_matches_faiss_bytes_and_reads_by_offset(tmp_path):
    x = SyntheticVectors(SyntheticSpec(dim=16), 50).read(0, 50)
    ref = faiss.IndexFlatIP(16)
    ref.add(x)
    faiss.write_index(ref, str(tmp_path / "ref.index"))
    w = FlatIPWriter(tmp_path / "ours.index", 16, 50)
    w.write(x[:20])
    w.write(x[20:])
    w.close()
    assert (tmp_path / "ours.index").read_bytes() == (tmp_path / "ref.index").read_bytes()
    f = open_flat_ip(tmp_path / "ref.index")
    assert (f.dim, f.ntotal, f.data_offset) == (16, 50, DATA_OFFSET)
    np.testing.assert_array_equal(f.read(7, 31), x[7:31])


def test_flat_reader_names_what_a_wrong_file_is(tmp_path):
    x = np.random.default_rng(0).standard_normal((40, 8)).astype(np.float32)
    l2 = faiss.IndexFlatL2(8)
    l2.add(x)
    faiss.write_index(l2, str(tmp_path / "l2.index"))
    ivf = faiss.index_factory(8, "IVF2,Flat", faiss.METRIC_INNER_PRODUCT)
    ivf.train(x)
    faiss.write_index(ivf, str(tmp_path / "ivf.index"))
    (tmp_path / "text.index").write_text("hello world, not an index")
    ip = faiss.IndexFlatIP(8)
    ip.add(x)
    faiss.write_index(ip, str(tmp_path / "ip.index"))
    data = (tmp_path / "ip.index").read_bytes()
    (tmp_path / "cut.index").write_bytes(data[:-4])
    for name, words in [("l2.index", "IndexFlatL2"), ("ivf.index", "IndexIVFFlat"), ("text.index", "not a FAISS"),
                        ("cut.index", "truncated"), ("missing.index", "not found")]:
        with pytest.raises(FlatFileError, match=words):
            open_flat_ip(tmp_path / name)


def test_import_cli_refuses_bad_input_with_a_message(search_r1_files, tmp_path, monkeypatch, capsys):
    corpus, flat, _, _ = search_r1_files
    base = ["--faiss", str(flat), "--corpus", str(corpus), "--out", str(tmp_path / "o"), "--index-type", "ivf_sq8"]
    assert imp.main([*base[:-1], "hnsw32"]) == 2
    assert "cannot be built by streaming" in capsys.readouterr().err
    (tmp_path / "l2.index").write_bytes(b"IxF2" + flat.read_bytes()[4:])
    assert imp.main(["--faiss", str(tmp_path / "l2.index"), *base[2:]]) == 2
    assert "IndexFlatL2" in capsys.readouterr().err
    real = imp.shutil.disk_usage
    monkeypatch.setattr(imp.shutil, "disk_usage", lambda p: real(p)._replace(free=10 << 20))
    assert imp.main(base) == 2
    err = capsys.readouterr().err
    assert "not enough disk" in err and "GB free" in err
    assert not (tmp_path / "o" / "meta.json").exists()


def test_conversion_resumes_after_a_crash_and_is_never_served_half_done(search_r1_files, tmp_path):
    corpus, flat, vecs, exact_ids = search_r1_files
    out, settings = tmp_path / "idx", StreamSettings("ivf_sq8", nlist=64, chunk_rows=2_000)
    seen: list[int] = []

    def crash_at_third(start: int, x: np.ndarray) -> None:
        seen.append(start)
        if len(seen) == 3:
            raise KeyboardInterrupt("simulated crash")

    with pytest.raises(KeyboardInterrupt):
        imp.import_index(flat, corpus, out, vecs.model, profile="e5", index_type="ivf_sq8", settings=settings, nprobe=16,
                         on_chunk=crash_at_third, progress=False)
    blocks = sorted(p.name for p in (out / WORK_DIR).glob("block_*.index"))
    assert blocks == ["block_00000.index", "block_00001.index"]
    (out / WORK_DIR / "block_00002.index.part").write_bytes(b"half a block from a killed process")
    with pytest.raises(IndexMismatch, match="not a finished index"):
        Retriever(out)
    with pytest.raises(ConversionError, match="different settings"):  # never mixed with other blocks
        imp.import_index(flat, corpus, out, vecs.model, profile="e5", index_type="ivf_sq8", progress=False,
                         settings=StreamSettings("ivf_sq8", nlist=32, chunk_rows=2_000))
    seen.clear()
    meta = imp.import_index(flat, corpus, out, vecs.model, profile="e5", index_type="ivf_sq8", settings=settings, nprobe=16,
                            on_chunk=lambda s, x: seen.append(s), progress=False)
    assert seen == list(range(4_000, ROWS, 2_000))  # only the chunks without a block
    assert not (out / WORK_DIR).exists() and meta["count"] == ROWS and meta["nprobe"] == 16
    r = Retriever(out)
    texts = _bench().query_texts(100)
    hits = r.search(texts, 3)
    recall = np.mean([len({h.row for h in hs} & set(e[:3].tolist())) / 3 for hs, e in zip(hits, exact_ids)])
    assert recall >= 0.95
    mem = r.memory()
    assert mem["index_mapped_mb"] > 0 and mem["rss_anon_mb"] > 0


def test_merge_writes_faiss_layout_with_bounded_memory(tmp_path, capfd):
    """The pwrite merge gives the file FAISS's merge_from_multiple gives (same bytes, same search
    answers through the server's reader), and its peak RSS does not grow with the file: FAISS's
    merge maps its output and the blocks, so its peak rises by about the bytes merged."""
    merge_bench = _bench("ivf_merge")  # FAISS's merge as the reference, the random rows, the RSS probe
    rows, dim = 300_000, 192  # coarse lists in a PCA space, as the defaults at 768-d
    src = merge_bench.RandomRows(rows, dim)
    settings = StreamSettings("ivf_sq8", nlist=64, chunk_rows=40_000, coarse_dim=32, kmeans_iters=4)
    ours, ref = tmp_path / "ours", tmp_path / "ref"
    ref.mkdir()
    b = StreamingIVFBuilder(src, ours, settings, progress=False)
    ours.mkdir()
    b._check_state()
    trained = b.train()
    b.add(trained)
    merged_mb = rows * (dim + 8) / 2**20  # 57 MB of lists
    ref_rise = merge_bench.rss_rise_mb(lambda: merge_bench.faiss_merge(b, trained, ref))
    our_rise = merge_bench.rss_rise_mb(lambda: b.merge(trained))
    print(f"merge peak RSS rise: FAISS {ref_rise:.1f} MB, ours {our_rise:.1f} MB, lists {merged_mb:.1f} MB")
    assert ref_rise > 0.8 * merged_mb, (ref_rise, merged_mb)  # the measure sees mapped pages
    assert our_rise < 0.3 * merged_mb, (our_rise, merged_mb)  # one 7.6 MB block buffer + headers
    assert (ours / IVFDATA_FILE).read_bytes() == (ref / IVFDATA_FILE).read_bytes()
    q = src.read(10**9, 10**9 + 200)
    # read as Retriever reads an ivf folder (on-disk lists mapped by FAISS itself)
    a, r = read_index(ours / "index.faiss", nprobe=8), read_index(ref / "index.faiss", nprobe=8)
    assert a.ntotal == r.ntotal == rows
    da, ia = a.search(q, 5)
    dr, ir = r.search(q, 5)
    np.testing.assert_array_equal(ia, ir)
    np.testing.assert_array_equal(da, dr)
    assert (ia >= 0).all()


def test_crash_during_the_merge_leaves_nothing_servable_and_resumes_from_the_blocks(search_r1_files, tmp_path,
                                                                                    monkeypatch):
    corpus, flat, vecs, _ = search_r1_files
    out, settings = tmp_path / "idx", StreamSettings("ivf_sq8", nlist=64, chunk_rows=2_000)
    real = ivf_stream.write_merged_lists

    def killed_at_third_block(blocks, path, on_block=None):
        def on(i: int) -> None:
            if i == 2:
                raise KeyboardInterrupt("simulated crash in the merge")
        return real(blocks, path, on_block=on)

    monkeypatch.setattr(ivf_stream, "write_merged_lists", killed_at_third_block)
    with pytest.raises(KeyboardInterrupt):
        imp.import_index(flat, corpus, out, vecs.model, profile="e5", index_type="ivf_sq8", settings=settings,
                         progress=False)
    assert (out / WORK_DIR / IVFDATA_FILE).exists()  # half written, under .import only
    assert not (out / IVFDATA_FILE).exists() and not (out / "index.faiss").exists()
    with pytest.raises(IndexMismatch, match="not a finished index"):
        Retriever(out)
    monkeypatch.setattr(ivf_stream, "write_merged_lists", real)
    seen: list[int] = []
    meta = imp.import_index(flat, corpus, out, vecs.model, profile="e5", index_type="ivf_sq8", settings=settings,
                            on_chunk=lambda s, x: seen.append(s), progress=False)
    assert seen == [] and meta["count"] == ROWS  # every block was kept: only the merge ran again
    assert Retriever(out).search(["synthetic passage 5."], 1)


def test_native_build_index_reaches_the_streamed_type(tmp_path):
    data, _ = corpus_lines(0, 3_000)
    (tmp_path / "c.jsonl").write_bytes(data)
    model = SyntheticSpec().model_name
    res = build_index(tmp_path / "c.jsonl", tmp_path / "idx", model=model, profile="e5",
                      index_type="ivf_sq8", chunk_size=1_000, progress=False)
    assert res.meta["index_type"] == "ivf_sq8" and (tmp_path / "idx" / "index.ivfdata").exists()
    r = Retriever(tmp_path / "idx", nprobe=res.meta["nlist"])  # every list: exact up to SQ8 rounding
    rows = [17, 1234, 2999]
    vecs = r.encoder.encode([f"synthetic passage {i}." for i in rows], is_query=False)
    assert r.searcher.search(vecs, 1)[1][:, 0].tolist() == rows  # row i of the index is passage i


@pytest.mark.parametrize("distribution", ["easy", "hard"])
def test_scale_bench_end_to_end_through_the_server(tmp_path, capsys, distribution):
    kinds = ["ivf_sq8"] if distribution == "easy" else ["ivf_sq8", "ivf_pqfs_sq8"]
    res = _bench().main(["--rows", str(ROWS), "--work", str(tmp_path), "--no-encoder", "--requests", "128",
                         "--queries", "100", "--clients", "16", "--distribution", distribution,
                         "--index-types", *kinds])
    iv, ex, cal = res["ivf"], res["exact"], res["calibration"]
    # served at the calibrated nprobe; recall on held-out queries (not the calibration ones)
    assert cal["reached"] and iv["health"]["nprobe"] == cal["nprobe"] == iv["health"]["calibration"]["nprobe"]
    assert iv["recall@3"] >= (0.95 if distribution == "easy" else 0.92) and ex["recall@3"] == 1.0
    assert iv["health"]["index_type"] == "ivf_sq8" and iv["health"]["memory"]["index_mapped_mb"] > 0
    assert iv["search_rss_anon_after_mb"] > 0 and iv["search_qps"] > 0
    assert res["convert_peak_rss_mb"] > 0 and res["convert_phases"]["vmhwm_after_merge_mb"] > 0
    out = capsys.readouterr().out
    assert "QPS ratio" in out
    if distribution == "hard":  # the re-ranked kind from the same data, its ratio against ivf_sq8's QPS
        fs = res["kinds"]["ivf_pqfs_sq8"]
        assert fs["ivf"]["health"]["index_type"] == "ivf_pqfs_sq8" and fs["calibration"]["reached"]
        assert fs["ivf"]["health"]["k_factor"] == fs["calibration"]["k_factor"]
        assert fs["ivf"]["recall@3"] >= 0.9 and fs["qps_ratio_over_ivf_sq8"] > 0
        assert "search-only QPS ratio ivf_pqfs_sq8 / ivf_sq8 (same run)" in out
    assert not (tmp_path / f"rows{ROWS}-{distribution}").exists()  # the bench removes its data
    suffix = "" if distribution == "easy" else "_hard"
    assert json.loads((tmp_path / f"results_{ROWS}{suffix}.json").read_text())["distribution"] == distribution


def test_serve_cli_nprobe_flag_and_health_memory(search_r1_files, tmp_path):
    corpus, flat, vecs, _ = search_r1_files
    out = tmp_path / "idx"
    imp.import_index(flat, corpus, out, vecs.model, profile="e5", index_type="ivf_sq8", settings=StreamSettings(nlist=64), progress=False)
    with ServerProcess("--index", str(out), "--nprobe", "5") as srv:
        h = requests.get(srv.url + "/health", timeout=30).json()
        assert h["nprobe"] == 5 and h["nlist"] == 64
        assert {"rss_anon_mb", "index_mapped_mb", "rss_file_mb"} <= set(h["memory"])
        m = requests.get(srv.url + "/metrics.json", timeout=30).json()["memory"]
        assert m["index_mapped_mb"] > 0
    bad = subprocess.run([sys.executable, "-m", "retriever_server.serve", "--index", str(out), "--nprobe", "0",
                          "--port", "0"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--nprobe must be >= 1" in bad.stderr
