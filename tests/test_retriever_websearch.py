"""/search against a real local fake Serper (loopback HTTP server): shape, cache, retries, no key."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from retriever_server.config import ServerConfig
from retriever_server.testing import RunningServer
from retriever_server.websearch import SerperClient


class FakeSerper:
    """Serper-shaped answers; ``fail_with`` is a list of statuses returned before succeeding."""

    def __init__(self) -> None:
        self.fail_with: list[int] = []
        self.calls: list[dict] = []
        self.keys: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server API)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.calls.append(body)
                outer.keys.append(self.headers.get("X-API-KEY", ""))
                if outer.fail_with:
                    code = outer.fail_with.pop(0)
                    self.send_response(code)
                    self.send_header("Retry-After", "0")
                    self.end_headers()
                    return
                organic = [{"title": f"{body['q']} result {i}", "link": f"https://example.org/{i}",
                            "snippet": f"snippet {i} about {body['q']}", "position": i} for i in range(1, 11)]
                data = json.dumps({"searchParameters": {"q": body["q"]}, "organic": organic}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/search"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def fake():
    with FakeSerper() as f:
        yield f


def client(fake: FakeSerper, tmp_path, **kw) -> SerperClient:
    return SerperClient("test-key", url=fake.url, cache_path=tmp_path / "serper.sqlite", backoff_s=0.01, **kw)


def test_search_shape_matches_retrieve_and_is_cached(fake, tmp_path):
    with RunningServer(ServerConfig(), web=client(fake, tmp_path)) as srv:
        body = {"queries": ["nobel prize", "moon landing"], "topk": 3, "return_scores": True}
        first = requests.post(srv.url + "/search", json=body, timeout=30).json()
        again = requests.post(srv.url + "/search", json=body, timeout=30).json()
        plain = requests.post(srv.url + "/search", json={"queries": ["nobel prize"], "topk": 3}, timeout=30)
    assert first == again and len(fake.calls) == 2  # the second request came from sqlite
    assert fake.keys == ["test-key", "test-key"] and sorted(c["q"] for c in fake.calls) == ["moon landing", "nobel prize"]
    assert fake.calls[0]["num"] == 3
    hits = first["result"][0]
    assert len(hits) == 3 and hits[0]["score"] > hits[1]["score"]
    assert hits[0]["document"] == {"id": "https://example.org/1",
                                   "contents": '"nobel prize result 1"\nsnippet 1 about nobel prize'}
    assert plain.json()["result"][0] == [h["document"] for h in hits]


def test_retries_429_and_5xx_then_succeeds(fake, tmp_path):
    fake.fail_with = [429, 500, 503]
    c = client(fake, tmp_path, retries=3)
    hits = c.search("retry me", 2)
    assert len(hits) == 2 and len(fake.calls) == 4


def test_gives_up_with_502_after_retries(fake, tmp_path):
    fake.fail_with = [500] * 10
    with RunningServer(ServerConfig(), web=client(fake, tmp_path, retries=2)) as srv:
        r = requests.post(srv.url + "/search", json={"queries": ["down"]}, timeout=30)
        ok = requests.get(srv.url + "/health", timeout=10)
    assert r.status_code == 502 and "after 3 attempts" in r.json()["error"]
    assert len(fake.calls) == 3 and ok.status_code == 200


def test_auth_error_is_not_retried(fake, tmp_path):
    fake.fail_with = [403]
    with RunningServer(ServerConfig(), web=client(fake, tmp_path)) as srv:
        r = requests.post(srv.url + "/search", json={"queries": ["x"]}, timeout=30)
    assert r.status_code == 502 and "403" in r.json()["error"] and len(fake.calls) == 1


def test_without_key_is_503_with_message(monkeypatch, tmp_path):
    monkeypatch.delenv("SERPER_API_KEY", raising=False)
    with RunningServer(ServerConfig(web_cache=str(tmp_path / "c.sqlite"))) as srv:
        r = requests.post(srv.url + "/search", json={"queries": ["x"]}, timeout=10)
        bad = requests.post(srv.url + "/search", json={"queries": "x"}, timeout=10)
        dense = requests.post(srv.url + "/retrieve", json={"queries": ["x"]}, timeout=10)
    assert r.status_code == 503 and "SERPER_API_KEY" in r.json()["error"]
    assert bad.status_code == 400
    assert dense.status_code == 503 and "--index" in dense.json()["error"]


def test_env_configures_key_and_url(monkeypatch, fake, tmp_path):
    monkeypatch.setenv("SERPER_API_KEY", "env-key")
    monkeypatch.setenv("SERPER_URL", fake.url)
    c = SerperClient.from_env(cache_path=tmp_path / "c.sqlite")
    assert c.enabled and len(c.search("env", 1)) == 1 and fake.keys == ["env-key"]
