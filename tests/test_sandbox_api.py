"""HTTP contract of the sandbox service: client mistakes (400 naming the field), queueing (429),
health and metrics, refusal to start.

Runs the real service (`python -m sandbox.serve --backend local --port 0`) in a subprocess.
"""

from __future__ import annotations

import json
import threading
import uuid

import pytest
import requests
from prom_samples import samples, value

from sandbox.admission import Admission, Closed, QueueFull
from sandbox.api import RequestError, RequestLimits, parse_run_request
from sandbox.output import CappedBuffer
from sandbox.process import SandboxProcess, SandboxStartError

DEEP = "[" * 1000 + "]" * 1000


@pytest.fixture(scope="module")
def service():
    with SandboxProcess(backend="local", max_concurrency=1, max_queue=1) as sb:
        yield sb


def post(service, body=None, data: str | bytes | None = None) -> requests.Response:
    return requests.post(f"{service.url}/run_code", json=body, data=data, timeout=60)


@pytest.mark.parametrize("body, needle", [
    ({"language": "python"}, "'code' is required"),
    ({"code": 5}, "'code' must be a string, got a number"),
    ({"code": "\ud800"}, "'code' is not valid Unicode"),
    ({"code": "print(1)", "language": "cobol"}, "'language' 'cobol' is not supported"),
    ({"code": "print(1)", "run_timeout": "5"}, "'run_timeout' must be a number, got a string"),
    ({"code": "print(1)", "run_timeout": True}, "'run_timeout' must be a number, got a boolean"),
    ({"code": "print(1)", "compile_timeout": []}, "'compile_timeout' must be a number"),
    ({"code": "print(1)", "memory_limit_MB": 1.5}, "'memory_limit_MB' must be an integer"),
    ({"code": "print(1)", "stdin": False}, "'stdin' must be a string, got a boolean"),
    ({"code": "print(1)", "stdin": 0}, "'stdin' must be a string, got a number"),
    ({"code": "print(1)", "stdin": []}, "'stdin' must be a string, got an array"),
    ({"code": "print(1)", "stdin": {}}, "'stdin' must be a string, got an object"),
    ({"code": "print(1)", "stdin": "\ud800"}, "'stdin' is not valid Unicode"),
    ({"code": "print(1)", "files": []}, "'files' must be an object"),
    ({"code": "print(1)", "files": {"/etc/x": "aGk="}}, "'files' key '/etc/x' resolves to '/etc/x', outside the writable"),
    ({"code": "print(1)", "files": {"main.py": "aGk="}}, "which holds the submitted code"),
    ({"code": "print(1)", "files": {"a.txt": "not base64"}}, "'files' entry '/work/a.txt' is not valid base64"),
    ({"code": "print(1)", "files": {"a.txt": "aGk\u00e9="}}, "is not base64: non-ASCII character at index 3"),
    ({"code": "print(1)", "files": {"a.txt": 5}}, "must be a base64 string or null, got a number"),
    ({"code": "print(1)", "files": {"a": "aGk=", "a/b": "aGk="}}, "has both '/work/a' and '/work/a/b'"),
    ({"code": "print(1)", "files": {"x" * 256: "aGk="}}, "a path component is 256 bytes long, at most 255"),
    ({"code": "print(1)", "files": {"\ud800.txt": "aGk="}}, "is not valid Unicode"),
    ({"code": "print(1)", "files": {"a/" * 2100 + "f": "aGk="}}, "bytes long, at most 4095 allowed"),
    ({"code": "print(1)", "fetch_files": "out.txt"}, "'fetch_files' must be an array"),
    ({"code": "print(1)", "fetch_files": [1]}, "'fetch_files'[0] must be a string"),
    ([1, 2], "the body must be a JSON object, got an array"),
])
def test_client_mistakes_get_400_naming_the_field(service, body, needle):
    resp = post(service, body)
    assert resp.status_code == 400 and resp.headers["Content-Type"] == "application/json"
    assert needle in resp.json()["error"], resp.json()


@pytest.mark.parametrize("data, needle", [
    ("not json", "not valid JSON"),
    (b"\xff\xfe\x00garbage", "not valid JSON"),
    ('{"code": "x", "run_timeout": NaN}', "'run_timeout' must be a number, got NaN"),
    ('{"code": "x", "run_timeout": 1' + "0" * 5000 + "}", "not valid JSON"),
    (DEEP, "nested too deeply"),
    ('{"code": "print(1)", "stdin": ' + DEEP + "}", "nested too deeply"),
    ('{"code": "print(1)", "files": {"a": ' + DEEP + "}}", "nested too deeply"),
])
def test_malformed_bodies_get_400(service, data, needle):
    resp = post(service, data=data)
    assert resp.status_code == 400 and needle in resp.json()["error"], resp.text[:300]


def test_a_file_2000_directories_deep_is_written(service):
    """Within PATH_MAX, as SandboxFusion's os.makedirs allows."""
    path = "d/" * 2000 + "f.txt"
    resp = post(service, {"code": f"print(open({path!r}).read())", "files": {path: "aGk="}})
    assert resp.status_code == 200 and resp.json()["run_result"]["stdout"] == "hi\n", resp.text[:500]


def test_full_queue_answers_429_with_retry_after(service):
    """1 running + 1 queued fill the service; the overflow is refused with Retry-After, none is lost.

    All requests are released together by a barrier, so which ones win a slot is a race but the
    split is not: while the first two sleep, every other arrival finds the service full.
    """
    slow = {"code": "import time; time.sleep(3); print('done')", "run_timeout": 20}
    n_clients = 6
    barrier = threading.Barrier(n_clients)
    responses: list[requests.Response] = []
    lock = threading.Lock()

    def call() -> None:
        barrier.wait()
        resp = requests.post(f"{service.url}/run_code", json=slow, timeout=60)
        with lock:
            responses.append(resp)

    threads = [threading.Thread(target=call) for _ in range(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(responses) == n_clients  # every caller got an answer, none hung or vanished
    served = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code == 429]
    assert len(served) + len(refused) == n_clients, [r.status_code for r in responses]
    assert len(served) >= 2 and refused, [r.status_code for r in responses]
    assert all(r.json()["run_result"]["stdout"] == "done\n" for r in served)
    assert all(r.headers["Retry-After"] == "1" and "busy" in r.json()["error"] for r in refused)
    metrics = requests.get(f"{service.url}/metrics", timeout=10).text
    assert value(metrics, "sandbox_http_requests_total", code="429") == len(refused)
    assert value(metrics, "sandbox_rejected_total") == len(refused)


def test_health_reports_probed_guarantees(service):
    health = service.health()
    assert health["backend"] == "local" and health["status"] == "ok" and health["draining"] is False
    assert health["guarantees"]["missing"] == []
    assert health["guarantees"]["held"]["no_network"] is True


def test_metrics_stay_bounded_under_random_paths(service):
    """1,500 requests to distinct unknown paths add no label: they count as one 404 sample."""
    before = set(samples(requests.get(f"{service.url}/metrics", timeout=10).text))
    with requests.Session() as s:
        for _ in range(1500):
            assert s.get(f"{service.url}/{uuid.uuid4().hex}", timeout=10).status_code == 404
    after = requests.get(f"{service.url}/metrics", timeout=10).text
    assert set(samples(after)) - before <= {("sandbox_http_requests_total", frozenset({("code", "404")}))}
    assert value(after, "sandbox_http_requests_total", code="404") >= 1500


def test_refuses_to_start_without_guarantees(tmp_path):
    """With no bwrap on PATH the service refuses (exit 3: the environment lacks a piece), unless
    --allow-weaker-isolation; then each run is a SandboxError, which SandboxFusion's client raises."""
    from sandbox_fusion import RunCodeRequest, run_code

    env = {"PATH": str(tmp_path)}  # no bwrap, no setpriv
    with pytest.raises(SandboxStartError, match="exited with code 3") as err:
        with SandboxProcess(env=env, start_timeout=60):
            pass
    assert err.value.environment_missing
    with SandboxProcess(env=env, extra_args=["--allow-weaker-isolation"], start_timeout=60) as sb:
        health = sb.health()
        assert health["status"] == "degraded" and "no_network" in health["guarantees"]["missing"]
        body = requests.post(f"{sb.url}/run_code", json={"code": "print(1)"}, timeout=30).json()
        assert body["status"] == "SandboxError" and body["run_result"]["status"] == "Error"
        with pytest.raises(Exception, match="Sandbox responded with error: bubblewrap"):
            run_code(RunCodeRequest(code="print(1)", language="python"), endpoint=sb.url, max_attempts=1)


def test_a_bad_flag_is_not_an_environment_problem():
    with pytest.raises(SandboxStartError) as err:
        with SandboxProcess(extra_args=["--max-body-bytes", "0"], start_timeout=60):
            pass
    assert err.value.exit_code == 2 and not err.value.environment_missing


def test_parse_defaults_and_ceilings():
    req = parse_run_request({"code": "x", "memory_limit_MB": -1})
    assert (req.run_timeout, req.memory_limit_mb, req.stdin, req.files, req.fetch_files) == (10.0, 512, b"", {}, ())
    limits = RequestLimits(max_run_timeout_s=5, max_memory_mb=1024)
    req = parse_run_request({"code": "", "run_timeout": 1e9, "memory_limit_MB": 10**6, "stdin": None}, limits)
    assert (req.code, req.run_timeout, req.memory_limit_mb) == ("", 5, 1024)
    assert parse_run_request({"code": "x", "run_timeout": -3, "memory_limit_MB": 0}).run_timeout == 0.001
    with pytest.raises(RequestError):
        parse_run_request({"code": "x", "memory_limit_MB": float("inf")})


def test_capped_buffer_marks_truncation():
    buf = CappedBuffer(5)
    buf.write(b"abc")
    buf.write(b"defgh")
    assert buf.text().startswith("abcde") and "3 more bytes" in buf.text()


def test_admission_bounds_and_close():
    adm = Admission(1, 1)
    entered = threading.Event()
    outcome: list[str] = []

    def waiter() -> None:
        try:
            with adm.slot():
                outcome.append("ran")
        except Closed:
            outcome.append("closed")

    with adm.slot():
        t = threading.Thread(target=waiter)
        t.start()
        while adm.waiting == 0:
            entered.wait(0.01)
        with pytest.raises(QueueFull), adm.slot():
            pass
        adm.close()  # the waiter is turned away; the running slot is kept
        t.join(10)
        assert outcome == ["closed"] and adm.running == 1
    assert adm.rejected == 1 and adm.running == 0
    with pytest.raises(Closed), adm.slot():
        pass


def test_responses_are_json_even_for_unknown_routes(service):
    resp = requests.put(f"{service.url}/run_code", timeout=10)
    assert resp.status_code == 405 and "error" in resp.json()
    assert json.loads(requests.get(f"{service.url}/nope", timeout=10).text)["error"].startswith("404")


def test_the_agent_tool_client_notes_a_kill(service):
    """agent_env's SandboxClient shows the policy that its program was killed (a memory kill is -9)."""
    import asyncio

    from agent_env.tools import HttpPolicy, JsonHttp, SandboxClient

    async def go() -> str:
        http = JsonHttp(HttpPolicy(timeout_s=60, retries=0))
        try:
            return await SandboxClient(f"{service.url}/run_code", http).run("x = bytearray(2 * 1024**3)")
        finally:
            await http.close()

    assert asyncio.run(go()) == "\n[killed by signal 9]"
