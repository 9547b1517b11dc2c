"""``python -m openrlhf_sgrpo.ask``: one question through the agent and the real retriever, every turn
printed (the README's "ask the trained model"). The policy is the fitted tiny Qwen2 of
tests/fitted_policy.py, whose first action on "which city is the capital of france" is
``<search> france </search>`` under the deep-research prompt: so the printed trajectory must show
that search and the passages the retriever (MiniLM over real Wikipedia extracts, served on
loopback by the command itself) answered. The same weights as a runner checkpoint of the
``tiny-qwen2`` spec (``--checkpoint``, what ``make demo`` leaves) must give the same trajectory: a
randomly initialised tiny Qwen2 would not search. That second call asks a search engine that is not
ours (the README's "your own search engine"): a plain stdlib HTTP server that speaks Search-R1's
``/retrieve`` and nothing else; the passage it returns must reach the trajectory."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fitted_policy import QUESTIONS, TEMPLATE, fitted_policy_dir
from openrlhf_sgrpo.ask import format_trajectory, parse_args
from openrlhf_sgrpo.testing import kill_left_over

REPO = Path(__file__).resolve().parents[1]
QUESTION = QUESTIONS[0][0]  # the fitted policy searches "france" for it


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    from retriever_server.corpora import wiki_extracts_path, wiki_extracts_to_jsonl

    try:
        data = json.loads(wiki_extracts_path().read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        pytest.skip(str(err))
    keys = dict.fromkeys([*list(data)[::700], "France", "Paris"])
    d = tmp_path_factory.mktemp("ask")
    (d / "subset.json").write_text(json.dumps({k: data[k] for k in keys if k in data}))
    wiki_extracts_to_jsonl(d / "subset.json", d / "corpus.jsonl")
    return d / "corpus.jsonl"


OWN_PASSAGE = '"France (own engine)"\nFrance is a country whose capital is Paris, said a search engine of its own.'


class SearchR1Handler(BaseHTTPRequestHandler):
    """Search-R1's /retrieve: {"queries", "topk", "return_scores"} -> {"result": [[{"document", "score"}]]}."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        hits = [[{"document": {"id": "0", "contents": OWN_PASSAGE}, "score": 1.0}] * body.get("topk", 3)
                for _ in body["queries"]]
        data = json.dumps({"result": hits}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def own_engine():
    server = ThreadingHTTPServer(("127.0.0.1", 0), SearchR1Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/retrieve"
    finally:
        server.shutdown()
        server.server_close()


def ask(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "openrlhf_sgrpo.ask", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=900, check=False)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the fitted policy is fitted once per machine (minutes on 2 busy cores)
def test_ask_prints_the_search_and_what_the_retriever_answered(corpus, own_engine, tmp_path):
    import torch

    from openrlhf_sgrpo.local.checkpoint import save_checkpoint
    from openrlhf_sgrpo.local.models import load_policy

    common = ["--engine", "hf", "--template", TEMPLATE, "--max-turns", "2", "--max-tokens-per-turn", "24",
              "--max-len", "2048", "--gold", "Paris"]
    proc = ask(*common, "--corpus", str(corpus), "--model", str(fitted_policy_dir()), "--json", QUESTION)
    assert proc.returncode == 0, proc.stderr[-4000:]
    t = json.loads(proc.stdout)
    first = t["turns"][0]
    assert first["kind"] == "search" and first["query"] == "france", t
    assert "<information>" in first["output"] and "France" in first["output"], first["output"][:500]
    assert t["search_calls"] >= 1 and t["golds"] == ["Paris"] and "em" in t
    printed = format_trajectory(t)
    assert f"question: {QUESTION}" in printed and "[turn 1: search 'france']" in printed

    # the same weights as make demo leaves them (a runner checkpoint of an embedded spec), asking a
    # search engine of its own
    model, _ = load_policy(str(fitted_policy_dir()))
    root = tmp_path / "checkpoints"
    save_checkpoint(root, 3, model, torch.optim.SGD(model.parameters(), lr=0.1), {})
    again = ask(*common, "--retriever-url", own_engine, "--model", "tiny-qwen2", "--checkpoint", str(root),
                "--json", QUESTION)
    assert again.returncode == 0, again.stderr[-4000:]
    turn = json.loads(again.stdout)["turns"][0]
    assert (turn["kind"], turn["query"], turn["text"]) == (first["kind"], first["query"], first["text"])
    assert "a search engine of its own" in turn["output"], turn["output"][:500]
    assert f"weights: {root / 'step_3' / 'model.pt'}" in again.stderr


def test_bad_input_is_named(tmp_path):
    with pytest.raises(SystemExit):
        parse_args(["  ", "--retriever-url", "http://127.0.0.1:1/retrieve"])
    with pytest.raises(SystemExit):
        parse_args(["q"])  # no retriever named
    with pytest.raises(SystemExit):
        parse_args(["q", "--index", "x", "--max-turns", "0"])
    proc = ask("q", "--index", "x", "--checkpoint", str(tmp_path / "nowhere"))
    assert proc.returncode == 2 and "--checkpoint" in proc.stderr and "is not a folder" in proc.stderr
    proc = ask("q", "--index", "x", "--model", str(tmp_path / "no_model"), "--engine", "hf")
    assert proc.returncode == 2 and "no_model" in proc.stderr and "neither one of" in proc.stderr


class HoldingHandler(SearchR1Handler):
    """Search-R1's /retrieve that holds each request until the test lets it go: the agent is then
    waiting on its tool, with the engine up, when the test signals it."""

    arrived: threading.Event
    release: threading.Event

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        type(self).arrived.set()
        type(self).release.wait(120)
        super().do_POST()


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the fitted policy is fitted once per machine
def test_sigterm_shuts_the_engine_and_leaves_no_process():
    """A scheduler's ``kill`` (SIGTERM) ends ``ask`` as Ctrl-C does: exit 130, and vLLM's engine core,
    a child process, gone with it (Python's default for SIGTERM runs no ``finally``, and the engine
    core was left running under init). Signalled while its search is held by the retriever."""
    import os
    import signal

    import psutil

    handler = type("Held", (HoldingHandler,), {"arrived": threading.Event(), "release": threading.Event()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cmd = [sys.executable, "-m", "openrlhf_sgrpo.ask", "--engine", "vllm", "--template", TEMPLATE,
           "--max-turns", "2", "--max-tokens-per-turn", "24", "--max-len", "2048", "--model",
           str(fitted_policy_dir()), "--retriever-url", f"http://127.0.0.1:{server.server_port}/retrieve",
           QUESTION]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"), start_new_session=True)
    started: list[psutil.Process] = []
    try:
        assert handler.arrived.wait(600), "ask never searched"
        started = psutil.Process(proc.pid).children(recursive=True)
        assert started, "vLLM runs its engine core in a process of its own"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 130 and "interrupted" in out, out[-3000:]
        _, alive = psutil.wait_procs(started, timeout=15)
        assert not alive, [(p.pid, p.name()) for p in alive]
    finally:  # nothing of this test outlives it, whatever failed
        handler.release.set()
        kill_left_over(proc, started)
        server.shutdown()
        server.server_close()
