"""Issue #58: both tool services' ``/metrics`` as Prometheus reads them.

Each exposition is parsed with ``prometheus_client``'s own text parser (what a wrong line, a bad
type or a label outside the fixed sets would break), and once end to end: Debian's ``prometheus``
binary, started here on loopback with a scrape config that sends the token from a file, must see
``up == 1`` for both services and one of our series for each through its HTTP API. That test
skips with the reason where the binary is absent (``.ci/run`` installs it).
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
import socket
import subprocess
import time
import urllib.parse

import pytest
import requests
from fake_serper import FakeSerper
from prom_samples import families, samples, value
from prometheus_client.parser import text_string_to_metric_families

from retriever_server.background import RunningServer
from retriever_server.budget import Limits
from retriever_server.config import ServerConfig
from retriever_server.websearch import SerperClient
from sandbox.process import SandboxProcess, SandboxStartError

WAIT_S = 60.0  # liveness bound on a loaded 2-core machine, never a timing claim
TOKEN = secrets.token_hex(32)
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NAME = re.compile(r"(retriever|sandbox|process|python)_[a-z0-9_]+")
LABELS = {"route", "code", "reason", "window", "source", "kind", "outcome", "le",
          "implementation", "major", "minor", "patchlevel", "version", "generation"}  # the last: python_info/gc


@pytest.fixture(scope="module")
def retriever(tmp_path_factory):
    with FakeSerper({}) as fake:
        web = SerperClient("test-key", url=fake.url, cache_path=tmp_path_factory.mktemp("web") / "s.sqlite",
                           budget=Limits(per_minute=100, per_day=1000))
        with RunningServer(ServerConfig(auth_token=TOKEN.encode()), web=web) as srv:
            assert requests.post(srv.url + "/search", json={"queries": ["x"]}, headers=AUTH,
                                 timeout=WAIT_S).status_code == 200
            yield srv


@pytest.fixture(scope="module")
def sandbox():
    try:
        with SandboxProcess(backend="local", max_concurrency=2, max_queue=3, env={"SGRPO_TOOLS_TOKEN": TOKEN}) as sb:
            yield sb
    except SandboxStartError as err:
        if not err.environment_missing:
            raise
        pytest.skip(f"this host lacks what the local sandbox needs: {err}")


def scrape(url: str) -> str:
    r = requests.get(url + "/metrics", headers=AUTH, timeout=WAIT_S)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    return r.text


@pytest.mark.parametrize("name", ["retriever", "sandbox"])
def test_each_exposition_parses_with_conventional_names_and_bounded_labels(request, name):
    text = scrape(request.getfixturevalue(name).url)
    fams = families(text)
    assert {"process_resident_memory_bytes", "process_open_fds", "process_cpu_seconds"} <= set(fams)
    assert f"{name}_http_requests" in fams and fams[f"{name}_http_requests"] == "counter"
    assert f"{name}_auth_failures" in fams
    for (sample, labels), _ in samples(text).items():
        assert NAME.fullmatch(sample), sample
        assert {k for k, _ in labels} <= LABELS, (sample, labels)
    for family in text_string_to_metric_families(text):
        if family.type == "counter":  # the parser strips _total from the family's name
            assert family.samples and all(s.name == family.name + "_total" for s in family.samples), family.name
        if family.type == "histogram":
            assert family.name.endswith(("_seconds", "_queries")), family.name
            assert {s.name for s in family.samples} == {family.name + x for x in ("_bucket", "_sum", "_count")}
    assert not any(s.endswith("_created") for s, _ in samples(text))  # switched off: half the series


def test_the_retriever_reports_web_search_spend_and_its_own_answers(retriever):
    text = scrape(retriever.url)
    assert value(text, "retriever_websearch_enabled") == 1
    assert value(text, "retriever_websearch_queries_total", source="provider") == 1
    assert value(text, "retriever_websearch_budget_limit_queries", window="day") == 1000
    assert value(text, "retriever_websearch_budget_used_queries", window="minute") == 1
    assert value(text, "retriever_http_requests_total", route="/search", code="200") >= 1
    assert value(text, "retriever_http_request_duration_seconds_count", route="/search") >= 1
    assert value(text, "retriever_queries_total", route="/search") == 1
    assert value(text, "retriever_queries_total", route="/retrieve") == 0  # exists before any query
    assert value(text, "retriever_batch_size_queries_count") == 0  # no dense index: no forward
    mem = {dict(labels)["kind"] for s, labels in samples(text) if s == "retriever_memory_bytes"}
    assert "rss_anon" in mem


def test_the_sandbox_reports_admission_pool_and_runs(sandbox):
    before = scrape(sandbox.url)
    r = requests.post(sandbox.url + "/run_code", json={"code": "print(1)"}, headers=AUTH, timeout=WAIT_S)
    assert r.status_code == 200 and r.json()["run_result"]["stdout"] == "1\n"
    text = scrape(sandbox.url)
    assert (value(text, "sandbox_max_concurrency"), value(text, "sandbox_max_queue")) == (2, 3)
    assert (value(text, "sandbox_running"), value(text, "sandbox_queued"), value(text, "sandbox_draining")) == (0, 0, 0)
    assert value(text, "sandbox_local_sandboxes") == 2 and value(text, "sandbox_local_pool_free") == 2
    assert value(text, "sandbox_runs_total", outcome="finished") == value(before, "sandbox_runs_total",
                                                                          outcome="finished") + 1
    assert value(text, "sandbox_execution_seconds_count") == value(before, "sandbox_execution_seconds_count") + 1
    assert value(text, "sandbox_rejected_total") == 0
    assert families(text)["sandbox_local_recycled"] == "counter"


# ------------------------------------------------------------------------- a real Prometheus

PROMETHEUS = shutil.which("prometheus")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _query(api: str, expr: str) -> list[dict]:
    r = requests.get(f"{api}/api/v1/query?query={urllib.parse.quote(expr)}", timeout=10)
    r.raise_for_status()
    return r.json()["data"]["result"]


@pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus binary (apt-get install prometheus; .ci/run does)")
def test_a_real_prometheus_scrapes_both_services_with_the_token(retriever, sandbox, tmp_path):
    token_file = tmp_path / "tools.token"
    token_file.write_text(TOKEN + "\n")
    targets = {"sgrpo-retriever": retriever.url, "sgrpo-sandbox": sandbox.url}
    jobs = [{"job_name": job, "scrape_interval": "1s", "scrape_timeout": "1s",
             "authorization": {"type": "Bearer", "credentials_file": str(token_file)},
             "static_configs": [{"targets": [url.split("//", 1)[1]]}]} for job, url in targets.items()]
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({"global": {"scrape_interval": "1s"}, "scrape_configs": jobs}))  # JSON is YAML
    port = _free_port()
    api = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "prometheus.log", "w")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + WAIT_S
        want = {"up": None, "retriever_http_requests_total": "sgrpo-retriever",
                "sandbox_http_requests_total": "sgrpo-sandbox", "process_resident_memory_bytes": None}
        got: dict[str, list[dict]] = {}
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
            try:
                got = {expr: _query(api, expr) for expr in want}
            except requests.RequestException:
                got = {}
            ups = {r["metric"]["job"]: r["value"][1] for r in got.get("up", [])}
            if ups == {"sgrpo-retriever": "1", "sgrpo-sandbox": "1"} and all(got.get(e) for e in want):
                break
            time.sleep(0.5)
        assert {r["metric"]["job"]: r["value"][1] for r in got.get("up", [])} == \
            {"sgrpo-retriever": "1", "sgrpo-sandbox": "1"}, (got, (tmp_path / "prometheus.log").read_text()[-2000:])
        for expr, job in want.items():
            if job:
                assert {r["metric"]["job"] for r in got[expr]} == {job}, got[expr]
        assert {r["metric"]["job"] for r in got["process_resident_memory_bytes"]} == set(targets)
        # Prometheus' own scrapes, with the token, are what the services counted as /metrics 200s
        metrics_200 = _query(api, 'retriever_http_requests_total{route="/metrics",code="200"}')
        assert metrics_200 and float(metrics_200[0]["value"][1]) >= 1
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_prometheus_without_the_token_sees_the_services_down(retriever):
    """What an unauthenticated scraper gets: a 401 (``up == 0`` in Prometheus), counted."""
    r = requests.get(retriever.url + "/metrics", timeout=WAIT_S)
    assert r.status_code == 401
    assert value(scrape(retriever.url), "retriever_auth_failures_total", reason="missing") >= 1
