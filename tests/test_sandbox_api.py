"""HTTP contract of the sandbox service: validation (400), queueing (429), health and metrics.

Runs the real service (`python -m sandbox.serve --backend local --port 0`) in a subprocess.
"""

from __future__ import annotations

import threading

import pytest
import requests

from sandbox.admission import Admission, QueueFull
from sandbox.api import RequestError, parse_run_request
from sandbox.output import CappedBuffer
from sandbox.testing import RunningSandbox


@pytest.fixture(scope="module")
def service():
    with RunningSandbox(backend="local", max_concurrency=1, max_queue=1) as sb:
        yield sb


@pytest.mark.parametrize("body, needle", [
    ({"language": "python"}, "'code' is required"),
    ({"code": "print(1)", "language": "cobol"}, "unsupported language"),
    ({"code": "print(1)", "run_timeout": -1}, "'run_timeout'=-1"),
    ({"code": "print(1)", "run_timeout": 10_000}, "'run_timeout'=10000"),
    ({"code": "print(1)", "run_timeout": "5"}, "must be a number"),
    ({"code": "print(1)", "memory_limit_MB": 1}, "'memory_limit_MB'=1"),
    ({"code": "print(1)", "files": {"/etc/x": "aGk="}}, "inside the work dir"),
    ({"code": "print(1)", "files": {"a.txt": "@@not base64"}}, "invalid base64"),
    ([1, 2], "JSON object"),
])
def test_bad_requests_get_400_json(service, body, needle):
    resp = requests.post(f"{service.url}/run_code", json=body, timeout=30)
    assert resp.status_code == 400
    assert needle in resp.json()["message"]


def test_non_json_body_is_400(service):
    resp = requests.post(f"{service.url}/run_code", data="not json", timeout=30)
    assert resp.status_code == 400 and "JSON" in resp.json()["message"]


def test_run_code_sandboxfusion_shape(service):
    resp = requests.post(f"{service.url}/run_code", json={"code": "print(input())", "language": "python",
                                                          "stdin": "ok"}, timeout=30)
    body = resp.json()
    assert resp.status_code == 200 and body["status"] == "Success"
    assert body["run_result"]["status"] == "Finished" and body["run_result"]["stdout"] == "ok\n"
    assert set(body["run_result"]) == {"status", "execution_time", "return_code", "stdout", "stderr"}
    failed = requests.post(f"{service.url}/run_code", json={"code": "1/0"}, timeout=30).json()
    assert failed["status"] == "Failed" and "ZeroDivisionError" in failed["run_result"]["stderr"]


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
    assert all(r.headers["Retry-After"] == "1" and "busy" in r.json()["message"] for r in refused)
    metrics = requests.get(f"{service.url}/metrics", timeout=10).text
    assert f'sandbox_requests_total{{code="429"}} {len(refused)}' in metrics
    assert "sandbox_rejected_total" in metrics


def test_health_reports_probed_guarantees(service):
    health = service.health()
    assert health["backend"] == "local" and health["status"] == "ok"
    assert health["guarantees"]["missing"] == []
    assert health["guarantees"]["held"]["no_network"] is True


def test_refuses_to_start_without_guarantees(tmp_path):
    """With no bwrap on PATH the service must refuse, unless --allow-weaker-isolation."""
    env = {"PATH": str(tmp_path)}  # no bwrap, no setpriv

    with pytest.raises(Exception, match="exited with code 2"):
        with RunningSandbox(env=env, start_timeout=60):
            pass
    with RunningSandbox(env=env, extra_args=["--allow-weaker-isolation"], start_timeout=60) as sb:
        health = sb.health()
        assert health["status"] == "degraded" and "no_network" in health["guarantees"]["missing"]
        body = requests.post(f"{sb.url}/run_code", json={"code": "print(1)"}, timeout=30).json()
        assert body["status"] == "SandboxError"


def test_parse_defaults_and_units():
    req = parse_run_request({"code": "x", "memory_limit_MB": -1})
    assert (req.run_timeout, req.memory_limit_mb, req.stdin, req.files) == (10.0, 512, b"", {})
    with pytest.raises(RequestError):
        parse_run_request({"code": "   "})


def test_capped_buffer_marks_truncation():
    buf = CappedBuffer(5)
    buf.write(b"abc")
    buf.write(b"defgh")
    assert buf.text().startswith("abcde") and "3 more bytes" in buf.text()


def test_admission_bounds():
    adm = Admission(1, 0)
    with adm.slot():
        with pytest.raises(QueueFull):
            with adm.slot():
                pass
    assert adm.rejected == 1 and adm.running == 0


def test_local_launcher_flag():
    from sandbox.serve import parse_args

    assert parse_args([]).local_launcher == "auto"
    assert parse_args(["--local-launcher", "shell"]).local_launcher == "shell"
    with pytest.raises(SystemExit):
        parse_args(["--local-launcher", "bash"])
