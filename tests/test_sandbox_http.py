"""The sandbox's HTTP server layer (sandbox/http_server.py) under hostile and heavy traffic, against
the real service: waitress's own parser errors as JSON 4xx, slow and idle clients, head-of-line
blocking, the connection and body limits, and the drain on SIGTERM under load (runs that finish
within the drain deadline are answered as usual; runs still going at it are ended and answered).

Time bounds here are liveness bounds far above what the machine needs (a request answered while
a stall that would last far longer is still going on), never performance assertions.
"""

from __future__ import annotations

import glob
import json
import signal
import socket
import threading
import time

import pytest
import requests
from prom_samples import value
from raw_http import read_response

from sandbox.process import SandboxProcess

IDLE_S = 2.0  # the --idle-timeout-s of the short-timeout service


def gauges(sb: SandboxProcess, *names: str) -> tuple[float | None, ...]:
    """The service's `/metrics` values of `names`, read with prometheus_client's parser."""
    text = requests.get(f"{sb.url}/metrics", timeout=10).text
    return tuple(value(text, name) for name in names)


def connect(url: str) -> socket.socket:
    host, port = url.rsplit("/", 1)[1].rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=30)


def closed_by_server(sock: socket.socket, within_s: float) -> bool:
    """True once the server closes (EOF or reset) within `within_s`."""
    sock.settimeout(within_s)
    try:
        while sock.recv(65536):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


@pytest.fixture(scope="module")
def service():
    with SandboxProcess(backend="local", max_concurrency=1, max_queue=0,
                        extra_args=["--idle-timeout-s", str(IDLE_S), "--max-body-bytes", str(1 << 20),
                                    "--connection-limit", "64"]) as sb:
        yield sb


def test_expect_continue_without_a_body_is_answered_at_once(service):
    """waitress sends `100 Continue` and then waits for a body that never comes; we answer."""
    with connect(service.url) as s:
        s.sendall(b"POST /run_code HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n\r\n")
        code, headers, body = read_response(s)
    assert code == 400 and "not valid JSON" in json.loads(body)["error"]


def test_expect_continue_with_a_body_continues(service):
    payload = json.dumps({"code": "print(6 * 7)"}).encode()
    with connect(service.url) as s:
        s.sendall(b"POST /run_code HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(payload))
        assert s.recv(64).startswith(b"HTTP/1.1 100 Continue")
        s.sendall(payload)
        code, _, body = read_response(s)
    assert code == 200 and json.loads(body)["run_result"]["stdout"] == "42\n"


@pytest.mark.parametrize("request_bytes, status, needle", [
    (b"POST /run_code HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 400, "unsupported Transfer-Encoding"),
    (b"POST /run_code HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\n", 413, "exceeds 1048576 bytes"),
    (b"POST /run_code HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n200000\r\n" + b"x" * 0x200000,
     413, "exceeds 1048576 bytes"),
    (b"POST /run_code HTTP/1.1\r\nHost: x\r\nX-Big: " + b"y" * (70 << 10) + b"\r\n\r\n", 431, "Header"),
    (b"POST /run_code HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400, "Content-Length is invalid"),
    (b"GARBAGE\r\n\r\n", 400, "Bad Request"),
])
def test_server_layer_errors_are_json_4xx(service, request_bytes, status, needle):
    with connect(service.url) as s:
        try:
            s.sendall(request_bytes)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer and close before the whole oversized request is sent
        code, headers, body = read_response(s)
    assert code == status and headers["content-type"] == "application/json"
    assert needle in json.loads(body)["error"]


def test_slow_and_idle_clients_are_cut_off(service):
    """An idle connection, and one that trickles its headers a byte at a time (never idle), are both
    closed after the idle timeout; a good request meanwhile is served at once."""
    idle, slow = connect(service.url), connect(service.url)
    stop = threading.Event()

    def trickle() -> None:
        try:
            for byte in b"POST /run_code HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 10_000:
                if stop.is_set():
                    return
                slow.send(bytes([byte]))
                time.sleep(0.2)
        except OSError:
            return  # closed by the server, as it should be

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    try:
        resp = requests.post(f"{service.url}/run_code", json={"code": "print('fine')"}, timeout=30)
        assert resp.json()["run_result"]["stdout"] == "fine\n"
        assert closed_by_server(idle, within_s=IDLE_S + 20)
        assert closed_by_server(slow, within_s=IDLE_S + 20)
    finally:
        stop.set()
        idle.close()
        slow.close()


def test_idle_and_half_open_connections_do_not_block_a_good_request():
    """150 idle plus 150 half-open connections (more than waitress's default limit of 100) with a
    long idle timeout: a good request is still answered while all of them are held open."""
    with SandboxProcess(backend="local", max_concurrency=1, extra_args=["--idle-timeout-s", "120"]) as sb:
        held = [connect(sb.url) for _ in range(300)]
        try:
            for s in held[150:]:
                s.sendall(b"POST /run_code HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            start = time.monotonic()
            resp = requests.post(f"{sb.url}/run_code", json={"code": "print('served')"}, timeout=60)
            assert resp.json()["run_result"]["stdout"] == "served\n"
            assert time.monotonic() - start < 60  # far below the 120 s the held connections could stall it
            assert all(not closed_by_server(s, within_s=0.01) for s in held[:5])  # still held open
        finally:
            for s in held:
                s.close()


def test_a_slow_upload_does_not_hold_up_other_requests(service):
    """Head of line: an upload crawling in at 1 KB per 0.2 s takes no worker thread (the service
    has only 1 + 0 + 4), so requests behind it on other connections are answered meanwhile."""
    body = json.dumps({"code": "print(1)", "stdin": "z" * 50_000}).encode()
    uploads = [connect(service.url) for _ in range(8)]
    try:
        for s in uploads:
            s.sendall(b"POST /run_code HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body[:1024])
        answered = []
        for i in range(6):
            for s in uploads:
                s.sendall(body[1024 + i * 1024:2048 + i * 1024])
            resp = requests.post(f"{service.url}/run_code", json={"code": f"print({i})"}, timeout=30)
            answered.append(resp.json()["run_result"]["stdout"])
            time.sleep(0.2)
        assert answered == [f"{i}\n" for i in range(6)]
    finally:
        for s in uploads:
            s.close()


def sigterm_under_load(sb: SandboxProcess, body: dict, exit_within_s: float = 60) -> list[tuple[int, dict, dict]]:
    """8 clients posting `body` to a service that runs 2 at a time: SIGTERM once 2 run and 6 wait;
    the service must exit 0 within `exit_within_s` (a liveness bound); then (HTTP code, JSON
    answer, headers) per client, 0 for a client left without an answer."""
    results: list[tuple[int, dict, dict]] = []
    lock = threading.Lock()

    def client() -> None:
        try:
            r = requests.post(f"{sb.url}/run_code", json=body, timeout=120)
            entry = (r.status_code, r.json(), dict(r.headers))
        except requests.RequestException as err:
            entry = (0, {"exception": repr(err)}, {})
        with lock:
            results.append(entry)

    threads = [threading.Thread(target=client) for _ in range(8)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while gauges(sb, "sandbox_queued", "sandbox_running") != (6, 2):
        assert time.monotonic() < deadline, "the load never built up"
        time.sleep(0.05)
    time.sleep(0.5)  # the two runs are in their sandboxes
    sb.proc.send_signal(signal.SIGTERM)
    refused_by = time.monotonic() + 10
    while True:  # the listener closes at once: new connections are refused while the runs drain
        try:
            requests.get(f"{sb.url}/health", timeout=10)
        except requests.ConnectionError:
            break
        assert time.monotonic() < refused_by, "still accepting connections after SIGTERM"
        time.sleep(0.05)
    assert sb.proc.wait(timeout=exit_within_s) == 0
    for t in threads:
        t.join(60)
    return results


def test_sigterm_drains_under_load(tmp_path):
    """8 clients on a service running 2 at a time: SIGTERM while 2 run and 6 wait. The running ones
    finish (well within the drain deadline) and are answered 200; the waiting ones get 503 with
    Retry-After; no connection dies unanswered, new connections are refused, and the service exits
    0 leaving no cgroup behind."""
    sb = SandboxProcess(backend="local", max_concurrency=2, max_queue=16).__enter__()
    results = sigterm_under_load(sb, {"code": "import time\ntime.sleep(3)\nprint(7)"})
    assert len(results) == 8
    codes = sorted(code for code, _, _ in results)
    assert codes == [200, 200] + [503] * 6, results
    for code, body, headers in results:
        if code == 200:
            assert body["status"] == "Success" and body["run_result"]["stdout"] == "7\n"
        else:
            assert headers["Retry-After"] == "1" and "shutting down" in body["error"]
    sb.stop()
    assert glob.glob(f"/sys/fs/cgroup/**/sgrpo-sandbox-{sb.proc.pid}*", recursive=True) == []


def test_sigterm_ends_runs_still_going_at_the_drain_deadline_with_a_clear_answer():
    """SIGTERM while 2 runs that would take 60 s are in progress and 6 wait, with a 1 s drain
    deadline (the default, 6 s, fits the 10 s Docker grants before SIGKILL): the waiting ones get
    503 with Retry-After; the running ones are ended at the deadline and answered 200 with a
    SandboxError saying the service is shutting down (SandboxFusion's model reads it); nothing is
    left unanswered, the service exits 0 long before the runs' own time limit, and no cgroup is left.
    Before the deadline existed, the service waited for every run's own time limit (here 60 s)."""
    from sandbox_fusion import RunCodeResponse

    sb = SandboxProcess(backend="local", max_concurrency=2, max_queue=16,
                        extra_args=["--drain-timeout-s", "1"]).__enter__()
    # a liveness bound: the runs alone would take 60 s
    results = sigterm_under_load(sb, {"code": "import time\ntime.sleep(60)", "run_timeout": 60}, exit_within_s=45)
    assert len(results) == 8
    codes = sorted(code for code, _, _ in results)
    assert codes == [200, 200] + [503] * 6, results
    for code, body, headers in results:
        if code == 200:
            answer = RunCodeResponse(**body)
            assert (answer.status, answer.run_result.status) == ("SandboxError", "Error"), body
            assert "shutting down" in answer.message and "--drain-timeout-s" in answer.message, body
        else:
            assert headers["Retry-After"] == "1" and "shutting down" in body["error"]
    sb.stop()
    assert glob.glob(f"/sys/fs/cgroup/**/sgrpo-sandbox-{sb.proc.pid}*", recursive=True) == []


def test_drain_deadline_is_a_checked_flag():
    with pytest.raises(Exception) as err:
        with SandboxProcess(extra_args=["--drain-timeout-s", "-1"], start_timeout=60):
            pass
    assert getattr(err.value, "exit_code", None) == 2


def test_sigterm_with_idle_keepalive_connections_exits_promptly():
    """Idle keep-alive connections are owed nothing: they do not hold the drain."""
    sb = SandboxProcess(backend="local", max_concurrency=1, extra_args=["--idle-timeout-s", "120"]).__enter__()
    held = [connect(sb.url) for _ in range(20)]
    try:
        with requests.Session() as s:
            assert s.post(f"{sb.url}/run_code", json={"code": "print(1)"}, timeout=30).status_code == 200
            sb.proc.send_signal(signal.SIGTERM)
            assert sb.proc.wait(timeout=60) == 0  # not the 120 s the idle connections could last
    finally:
        for s in held:
            s.close()
        sb.stop()
