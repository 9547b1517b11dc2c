"""Two sandbox behaviours seen from outside, on the real service (local backend, loopback):

- base64 in `files` is decoded as SandboxFusion's `restore_files` does (`base64.b64decode`,
  lenient): characters outside the alphabet are skipped; only alphabet characters that do not make
  whole padded groups answer 400 naming the entry (docs/sandbox.md says exactly this);
- SIGTERM with runs in progress past the drain deadline ends them without starting replacement
  sandboxes: the log says once per ended run that its sandbox is not replaced, never "replacing".
"""

from __future__ import annotations

import base64
import signal
import threading
import time

import pytest
import requests
from prom_samples import value

from sandbox.process import SandboxProcess, SandboxStartError

pytestmark = pytest.mark.slow


def _start(**kwargs) -> SandboxProcess:
    sb = SandboxProcess(backend="local", **kwargs)
    try:
        sb.start()
    except SandboxStartError as err:
        if not err.environment_missing:
            raise
        pytest.skip(f"this host lacks what the local sandbox needs: {err}")
    return sb


def test_files_base64_is_decoded_leniently_like_sandboxfusion():
    payload = base64.b64encode(b"hello, sandbox").decode()
    noisy = "!" + payload[:4] + "\n" + payload[4:8] + " \t*" + payload[8:] + "#"  # outside the alphabet
    assert base64.b64decode(noisy) == b"hello, sandbox"  # what SandboxFusion's restore_files writes
    sb = _start(max_concurrency=1)
    try:
        ok = requests.post(f"{sb.url}/run_code", timeout=60, json={
            "code": "print(open('in.txt').read())", "language": "python", "files": {"in.txt": noisy}})
        assert ok.status_code == 200 and ok.json()["run_result"]["stdout"] == "hello, sandbox\n", ok.text
        bad = requests.post(f"{sb.url}/run_code", timeout=60, json={
            "code": "print(1)", "language": "python", "files": {"in.txt": payload[:-1] + "!"}})  # a group cut short
        assert bad.status_code == 400 and "'/work/in.txt' is not valid base64" in bad.json()["error"], bad.text
    finally:
        sb.stop()


def test_sigterm_ends_runs_without_starting_replacements(tmp_path):
    log_path = tmp_path / "sandbox.log"
    with open(log_path, "w") as log:
        sb = _start(max_concurrency=2, extra_args=["--drain-timeout-s", "0.5"], stderr=log)
        answers: list[dict] = []

        def client() -> None:
            r = requests.post(f"{sb.url}/run_code", timeout=60,
                              json={"code": "import time\ntime.sleep(60)", "run_timeout": 60})
            answers.append(r.json())

        threads = [threading.Thread(target=client) for _ in range(2)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while value(requests.get(f"{sb.url}/metrics", timeout=10).text, "sandbox_running") != 2:
            assert time.monotonic() < deadline, "the two runs never started"
            time.sleep(0.05)
        sb.proc.send_signal(signal.SIGTERM)
        # liveness bound: the drain deadline plus the service's own slack, far below the runs' 60 s
        assert sb.proc.wait(timeout=20) == 0
        for t in threads:
            t.join(20)
        sb.stop()
    text = log_path.read_text()
    assert len(answers) == 2 and all(a["status"] == "SandboxError" and "shutting down" in a["message"]
                                      for a in answers), answers
    assert "replacing sandbox" not in text, text
    assert text.count("ends with the service (shutting down; not replaced)") == 2, text

