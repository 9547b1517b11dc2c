"""The retriever's HTTP layer (retriever_server.http_server) against hostile clients, over real
sockets: parser errors as JSON 4xx, deep JSON, Expect: 100-continue, idle / half-open / slow
clients, the connection limit, bounded metrics labels, and SIGTERM with open connections.

No model is needed: without --index, /retrieve validates the body (400) before answering 503.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from contextlib import ExitStack

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prom_samples import samples, value
from raw_http import read_response

from retriever_server.background import RunningServer, ServerProcess
from retriever_server.config import ServerConfig
from retriever_server.http_server import HttpSettings
from retriever_server.prom import LATENCY_BUCKETS_S

WAIT_S = 30.0  # generous bound for "answered" on a loaded 2-core machine; never a timing claim


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    return s


def exchange(port: int, raw: bytes) -> tuple[int, dict, bytes]:
    with connect(port) as s:
        s.sendall(raw)
        return read_response(s)


def closed_by_server(s: socket.socket) -> bool:
    try:
        return s.recv(1) == b""
    except (TimeoutError, ConnectionResetError):
        return False


@pytest.fixture(scope="module")
def server():
    cfg = ServerConfig(http=HttpSettings(threads=4, max_body_bytes=4096, idle_timeout_s=1.0))
    with RunningServer(cfg) as srv:
        yield srv


PARSER_ERRORS = {
    "gzip transfer-encoding": (b"POST /retrieve HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 400,
                               "Transfer-Encoding"),
    "body over the limit": (b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n" + b"x" * 5000,
                            413, "--max-body-bytes"),
    "chunked body over the limit": (b"POST /retrieve HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                                    + b"1388\r\n" + b"x" * 5000 + b"\r\n0\r\n\r\n", 413, "--max-body-bytes"),
    "headers over the limit": (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n", 431,
                               "headers"),
    "bad content-length": (b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: ten\r\n\r\n", 400,
                           "Content-Length"),
    "garbage start line": (b"HELLO\r\n\r\n", 400, "bad request"),
}


@pytest.mark.parametrize("name", PARSER_ERRORS)
def test_waitress_parser_errors_are_json_4xx(server, name):
    raw, status, needle = PARSER_ERRORS[name]
    got, headers, body = exchange(server.port, raw)
    assert got == status and headers["content-type"] == "application/json"
    assert needle in json.loads(body)["error"]


def nest(depth: int, inner: str = "1") -> str:
    return "[" * depth + inner + "]" * depth


@pytest.mark.parametrize("body", [
    nest(1000),  # the whole body
    '{"queries": ["a"], "extra": ' + nest(1000) + "}",  # a field the schema ignores
    '{"queries": ' + nest(1000, '"a"') + "}",
    '{"queries": ["a"], "topk": ' + nest(1000) + "}",
    '{"queries": ["a"], "topk": ' + nest(900) + "}",  # parses, but must not be echoed back
    '{"queries": ["a"], "return_scores": {"a": ' * 500 + "1" + "}" * 1000,
])
def test_deeply_nested_json_is_400(body):
    with RunningServer(ServerConfig()) as srv:  # the default body limit, so the depth is what fails
        r = requests.post(srv.url + "/retrieve", data=body.encode(), timeout=WAIT_S)
    assert r.status_code == 400 and len(r.json()["error"]) < 300, r.text[:300]


json_leaf = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(json_leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c,
                                                                                          max_size=3), max_leaves=10)


@st.composite
def hostile_bodies(draw) -> bytes:
    """Request-shaped JSON with any field replaced by junk, wrapped up to 1,200 levels deep."""
    body = draw(st.fixed_dictionaries({}, optional={"queries": st.lists(st.text(max_size=30), max_size=4) | json_values,
                                                    "topk": st.integers(-5, 200) | json_values,
                                                    "return_scores": st.booleans() | json_values}))
    text = json.dumps(body, allow_nan=True)
    depth = draw(st.integers(0, 1200))
    where = draw(st.sampled_from(["body", "queries", "topk", "extra"]))
    if where == "body":
        text = "[" * depth + text + "]" * depth
    else:
        text = text[:-1] + (", " if len(text) > 2 else "") + f'"{where}": ' + nest(depth, '"x"') + "}"
    return text.encode()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=hostile_bodies())
def test_fuzzed_request_schemas_never_5xx_but_503_without_index(server, body):
    for path in ("/retrieve", "/search"):
        r = requests.post(server.url + path, data=body, timeout=WAIT_S)
        assert r.status_code in (400, 413, 503), (path, body[:200], r.status_code, r.text[:200])
        assert isinstance(r.json()["error"], str)


TOKEN = b"0123456789abcdef" * 4  # what --auth-token-file would hold
right = st.just(b"Bearer " + TOKEN)
wrong = st.sampled_from([b"", b"Bearer", b"Bearer " + TOKEN[:-1], b"Bearer " + TOKEN + b"0", b"bearer  " + TOKEN[::-1],
                         b"Basic " + TOKEN, b"Bearer " + b"a" * 9000, "Bearer jeton-été".encode(), b"Bearer \xff\xfe"])
auth_lines = st.lists(right | wrong | st.binary(max_size=200).filter(lambda b: b"\r" not in b and b"\n" not in b),
                      max_size=3)


@pytest.fixture(scope="module")
def guarded():
    """The same server with a token (issue #58): every route but /health requires it."""
    cfg = ServerConfig(auth_token=TOKEN, http=HttpSettings(threads=4, max_body_bytes=4096, idle_timeout_s=1.0))
    with RunningServer(cfg) as srv:
        yield srv


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=auth_lines, body=hostile_bodies(), path=st.sampled_from(["/retrieve", "/search", "/metrics", "/x"]))
def test_fuzzed_authorization_headers_and_bodies_never_5xx(guarded, lines, body, path):
    """Any Authorization lines (none, wrong, very long, non-ASCII bytes, repeated) with any body:
    exactly one right line gets past the token (then the body's own 400/413/503), anything else is
    401, or waitress' own 4xx for a header it cannot parse; never a 5xx or a hang."""
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode()
    head += b"".join(b"Authorization: " + v + b"\r\n" for v in lines)
    status, headers, answer = exchange(guarded.port, head + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    assert headers["content-type"] == "application/json" and isinstance(json.loads(answer)["error"], str)
    if len(body) > 4096:
        assert status == 413  # waitress refuses the size before any route is reached
    elif lines == [b"Bearer " + TOKEN]:
        assert status in {"/metrics": (405,), "/x": (404,)}.get(path, (400, 503)), (status, answer[:200])
    else:
        assert status in (400, 401, 431), (lines, status, answer[:200])


def test_expect_100_continue(server):
    # without a body: answered at once (waitress 3.0.2 alone sends 100 Continue and then waits forever)
    status, _, body = exchange(server.port, b"POST /retrieve HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                                            b"Content-Length: 0\r\n\r\n")
    assert status == 400 and "JSON" in json.loads(body)["error"]
    # with a body: 100 Continue first, then the answer to the body sent after it
    payload = b'{"queries": ["x"]}'
    with connect(server.port) as s:
        s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: "
                  + str(len(payload)).encode() + b"\r\n\r\n")
        assert s.recv(64).startswith(b"HTTP/1.1 100 Continue")
        s.sendall(payload)
        status, _, body = read_response(s)
    assert status == 503 and "--index" in json.loads(body)["error"]  # valid request, no index loaded


def test_idle_half_open_and_partial_clients_hold_no_worker(server):
    """300 idle connections, 50 with half a request and 50 with half a body, against 4 worker
    threads: a good request is still answered (waitress's I/O thread buffers requests; only
    complete ones reach a worker), and the idle-timeout then closes the idle ones."""
    with ExitStack() as stack:
        idle = [stack.enter_context(connect(server.port)) for _ in range(300)]
        for s in idle[:50]:
            s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\n")
        for s in idle[50:100]:
            s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"queries\"")
        assert requests.get(server.url + "/health", timeout=WAIT_S).json()["status"] == "ok"
        with connect(server.port) as good:  # and a keep-alive connection serves request after request
            for _ in range(3):
                good.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                assert read_response(good)[0] == 200
        assert all(closed_by_server(s) for s in idle[100:110])  # after --idle-timeout-s (1 s)


def test_trickling_client_gets_408(server):
    with connect(server.port) as s:
        start = time.monotonic()
        try:
            for b in b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{}":
                s.sendall(bytes([b]))
                time.sleep(0.1)
        except OSError:  # the server may already have answered and closed
            pass
        status, _, body = read_response(s)
    assert status == 408 and "did not arrive within 1" in json.loads(body)["error"]
    assert time.monotonic() - start < WAIT_S


def test_connection_limit_recovers_by_reaping_idle_connections():
    cfg = ServerConfig(http=HttpSettings(connection_limit=20, idle_timeout_s=1.0))
    with RunningServer(cfg) as srv, ExitStack() as stack:
        for _ in range(40):  # half of them wait in the kernel's backlog
            stack.enter_context(connect(srv.port))
        assert requests.get(srv.url + "/health", timeout=WAIT_S).status_code == 200


def test_metrics_labels_stay_bounded_under_random_paths(server):
    """1,500 distinct unknown paths: one ``<unmatched>`` label in the JSON and in Prometheus' text
    (parsed by prometheus_client's own parser), never one per path."""
    before_json = len(requests.get(server.url + "/metrics.json", timeout=WAIT_S).content)
    before = set(samples(requests.get(server.url + "/metrics", timeout=WAIT_S).text))
    with requests.Session() as s:
        for i in range(1500):
            assert s.get(f"{server.url}/no/such/{os.urandom(8).hex()}", timeout=WAIT_S).status_code == 404
    m = requests.get(server.url + "/metrics.json", timeout=WAIT_S)
    assert m.json()["errors"]["<unmatched> 404"] >= 1500
    assert len(m.content) < before_json + 200  # one label for every unknown path
    text = requests.get(server.url + "/metrics", timeout=WAIT_S).text
    new = {key for key in set(samples(text)) - before if ("route", "/metrics") not in key[1]}
    assert new and all(("route", "<unmatched>") in labels for _, labels in new), sorted(new)[:5]
    assert len(new) <= len(LATENCY_BUCKETS_S) + 4  # the 404 counter and one latency histogram
    assert value(text, "retriever_http_requests_total", route="<unmatched>", code="404") >= 1500


def test_sigterm_with_open_keepalive_connections_exits_0():
    """The serve CLI (no index: it starts in a second) with four idle keep-alive connections and
    one half-sent request: SIGTERM stops it with exit 0, no traceback, and no new connections."""
    with ServerProcess("--drain-s", "3") as proc, ExitStack() as stack:
        sessions = [stack.enter_context(requests.Session()) for _ in range(4)]
        for s in sessions:
            assert s.get(proc.url + "/health", timeout=WAIT_S).status_code == 200
        raw = stack.enter_context(connect(proc.port))
        raw.sendall(b"GET /health HTTP/1.1\r\n")
        os.kill(proc.proc.pid, signal.SIGTERM)
        assert proc.proc.wait(timeout=WAIT_S) == 0
        with pytest.raises(requests.ConnectionError):
            requests.get(proc.url + "/health", timeout=5)
    assert "Traceback" not in proc.stderr_text(), proc.stderr_text()
