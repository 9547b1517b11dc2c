"""Fuzzing the `/run_code` request schema with hypothesis: whatever a client sends, the answer is
a 200 that SandboxFusion's client parses or a 4xx JSON error, never a 5xx, a crash or a hang.

Two levels: the validator alone (many examples: only RequestError may escape it), and the real
service over HTTP (fewer examples: each valid body runs code, so the service caps run_timeout).
The service runs with a token (`--auth-token-file`, issue #58): the body fuzz sends it, and the
`Authorization` header itself is fuzzed over a raw socket (empty, wrong, very long, non-ASCII
bytes, repeated): a 401 (or waitress' 400/431 for what it cannot parse), never a 5xx or a hang.
"""

from __future__ import annotations

import json
import secrets
import socket

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from raw_http import read_response

from sandbox.api import RequestError, RunRequest, parse_run_request
from sandbox.process import SandboxProcess

sandbox_fusion = pytest.importorskip("sandbox_fusion", reason="pip install sandbox-fusion (a test dependency)")

FIELDS = ("code", "language", "stdin", "run_timeout", "compile_timeout", "memory_limit_MB", "files", "fetch_files")
# integers past a float's range (10**309 and beyond, either sign): a float check on them overflows
huge = st.integers(10**309, 10**400) | st.integers(-10**400, -10**309)
scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | huge | st.floats(allow_nan=False)
           | st.text(max_size=20) | st.sampled_from(["\ud800", "a\udfffb", "é", "../../etc/passwd", "aGk="]))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)
paths = (st.text(max_size=12) | st.sampled_from(["a", "a/b", "/tmp/x", "/etc/x", "main.py", "x" * 300, "\ud800",
                                                "d/" * 40 + "f", "../tmp/y", ".", "/work"]))
file_maps = st.dictionaries(paths, st.none() | st.sampled_from(["aGk=", "aGk=\n", "héllo", "%%%", ""]) | json_values,
                            max_size=4)
field_values = {
    "code": st.sampled_from(["print(1)", "", "import sys; sys.exit(3)", "\ud800"]) | json_values,
    "language": st.sampled_from(["python", "cpp", "python3"]) | json_values,
    "stdin": st.text(max_size=20) | json_values,
    "run_timeout": st.floats(-1, 2) | huge | json_values,
    "compile_timeout": st.floats(-1, 2) | huge | json_values,
    "memory_limit_MB": st.integers(-2, 10_000) | huge | json_values,
    "files": file_maps | json_values,
    "fetch_files": st.lists(paths, max_size=3) | json_values,
}
bodies = st.fixed_dictionaries({}, optional=field_values) | json_values


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies)
def test_the_validator_only_ever_raises_request_error(body):
    try:
        req = parse_run_request(body)
    except RequestError as err:
        assert len(str(err)) < 2000
        json.dumps({"error": str(err)})  # it can always be sent back
        return
    assert isinstance(req, RunRequest)
    req.code.encode()
    for path in req.files:
        assert path.startswith(("/work/", "/tmp/")) and len(path.encode()) <= 4095


TOKEN = secrets.token_hex(32)
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def service():
    with SandboxProcess(backend="local", max_concurrency=2, extra_args=["--max-run-timeout-s", "2"],
                        env={"SGRPO_TOOLS_TOKEN": TOKEN}) as sb:
        yield sb


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(bodies)
def test_the_service_answers_every_body_with_200_or_a_json_4xx(service, body):
    resp = requests.post(f"{service.url}/run_code", data=json.dumps(body), headers=AUTH, timeout=60)
    assert resp.status_code in (200, 400), resp.text[:500]
    if resp.status_code == 400:
        assert set(resp.json()) == {"error"}
    else:
        sandbox_fusion.RunCodeResponse(**resp.json())  # SandboxFusion's own model accepts it


NUMERIC = ("run_timeout", "compile_timeout", "memory_limit_MB")


@pytest.mark.parametrize("field", NUMERIC)
@pytest.mark.parametrize("value", [10**309, -10**309, 10**1000, -(10**1000), 1e308, -1e308, 1.7976931348623157e308],
                         ids=["int 1e309", "int -1e309", "int 1e1000", "int -1e1000", "1e308", "-1e308", "max float"])
def test_every_numeric_field_takes_any_json_number_without_a_5xx(service, field, value):
    """A JSON integer too big for a float (json.loads keeps it an int) made the memory check raise
    OverflowError: a 500. Every numeric field now gets the documented clamp (or, for a non-integral
    memory_limit_MB, a 400), and a memory or time too large is cut to the operator's ceiling."""
    resp = requests.post(f"{service.url}/run_code", data=json.dumps({"code": "print(1)", field: value}),
                         headers=AUTH, timeout=60)
    assert resp.status_code == 200, resp.text[:500]
    body = sandbox_fusion.RunCodeResponse(**resp.json())
    if field == "run_timeout" and value < 0:  # <= 0 times out at once, as SandboxFusion's wait_for does
        assert body.run_result.status == "TimeLimitExceeded"
    else:
        assert body.run_result.stdout == "1\n", resp.text[:500]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_arbitrary_bytes_are_a_json_400(service, raw):
    resp = requests.post(f"{service.url}/run_code", data=raw, headers=AUTH, timeout=60)
    assert resp.status_code in (200, 400) and resp.headers["Content-Type"] == "application/json"


# ------------------------------------------------------------------ the Authorization header

token_like = st.sampled_from(["", TOKEN[:-1], TOKEN + "x", TOKEN.upper(), TOKEN[::-1], "a" * 9000, "é" * 10])
header_values = (st.binary(max_size=300).filter(lambda b: b"\r" not in b and b"\n" not in b)
                 | st.builds(lambda scheme, t: f"{scheme} {t}".encode("utf-8"),
                             st.sampled_from(["Bearer", "bearer", "Basic", "Token", ""]), token_like)
                 | st.text(max_size=100).map(lambda t: t.encode("utf-8", "surrogatepass")
                                             .replace(b"\r", b"").replace(b"\n", b"")))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(st.lists(header_values, min_size=0, max_size=3), st.sampled_from(["/run_code", "/metrics", "/x"]))
def test_fuzzed_authorization_headers_are_refused_never_5xx_or_a_hang(service, values, path):
    """Any number of Authorization lines with any bytes: the request never runs code. A value
    waitress cannot parse (a control byte) is its 400; everything else is our 401."""
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode()
    head += b"".join(b"Authorization: " + v + b"\r\n" for v in values)
    body = b'{"code": "print(1)"}'
    with socket.create_connection(("127.0.0.1", int(service.url.rsplit(":", 1)[1])), timeout=60) as s:
        s.sendall(head + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        status, headers, answer = read_response(s)
    assert status in (400, 401, 431), (values, status, answer[:200])
    assert headers["content-type"].startswith("application/json") and "error" in json.loads(answer)
