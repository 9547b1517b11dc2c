"""The sandbox through SandboxFusion's own PyPI client (`sandbox-fusion`): `run_code` and
`run_code_async` against the real service, for the local backend and the Docker pool.

The client parses every answer with its pydantic models (its `CommandRunStatus` has only
Finished / Error / TimeLimitExceeded) and raises on any non-200 or on a `SandboxError`, so a
status or field SandboxFusion would not send fails here. Expected values are SandboxFusion's
own, read from bytedance/SandboxFusion:
- sandbox/runners/base.py `run_command_bare`: a process that ends within the timeout is
  `Finished` with its return code, whatever the code; on `asyncio.TimeoutError` the result is
  `TimeLimitExceeded` with no return code; only an exception in the runner is `Error`.
- sandbox/server/sandbox_api.py `parse_run_status`: `Success` iff every return code is 0 and
  nothing timed out, else `Failed`; `message` is '' unless a command ended `Error`.
- sandbox/runners/base.py `restore_files`: `files` entries whose value is not a string are
  skipped; `run_commands`: `fetch_files` are read after the run whatever its status (a time-out
  too) and come back base64 under the name asked for, missing ones left out
  (docs/docs/docs/how-to/run-code/upload-download-files.mdx shows both).
- its default configuration (sandbox/configs/local.yaml, isolation `none`) runs `python main.py`
  through `asyncio.create_subprocess_shell(..., executable='/bin/bash')` and reports
  `p.returncode`: -N for a death by signal N. That call, made here on the same snippets, is the
  oracle for every return code (`sandbox_fusion_returncode`).
- with isolation `lite` the run is under a cgroup: a memory kill is its SIGKILL, which asyncio
  reports as return code -9.
"""

from __future__ import annotations

import asyncio
import base64
import signal
import sys

import pytest

sandbox_fusion = pytest.importorskip("sandbox_fusion", reason="pip install sandbox-fusion (a test dependency)")
from sandbox_fusion import RunCodeRequest, RunCodeResponse, run_code, run_code_async

from sandbox.process import SandboxProcess, SandboxStartError

SERVICE_ARGS = ["--max-memory-mb", "64", "--max-run-timeout-s", "5"]


def _service(backend: str, extra: list[str]):
    try:
        return SandboxProcess(backend=backend, max_concurrency=2, extra_args=[*SERVICE_ARGS, *extra]).__enter__()
    except SandboxStartError as err:
        if err.environment_missing:
            pytest.skip(f"{backend} backend unavailable here: {err}")
        raise


@pytest.fixture(scope="module", params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def endpoint(request):
    sb = _service(request.param, [])
    yield sb.url
    sb.stop()


@pytest.fixture(params=["sync", "async"])
def call(request, endpoint):
    """The client's `run_code` or `run_code_async`, without retries (a failure must show at once)."""
    def sync(req: RunCodeRequest) -> RunCodeResponse:
        return run_code(req, endpoint=endpoint, max_attempts=1)

    def async_(req: RunCodeRequest) -> RunCodeResponse:
        return asyncio.run(run_code_async(req, endpoint=endpoint, max_attempts=1))

    return sync if request.param == "sync" else async_


def py(code: str, **kw) -> RunCodeRequest:
    return RunCodeRequest(code=code, language="python", **kw)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_success_shape(call):
    resp = call(py("print('hello')"))
    assert (resp.status, resp.message, resp.compile_result, resp.files) == ("Success", "", None, {})
    run = resp.run_result
    assert (run.status, run.return_code, run.stdout, run.stderr) == ("Finished", 0, "hello\n", "")
    assert run.execution_time > 0


def test_an_exception_is_failed_with_its_return_code(call):
    resp = call(py("1 / 0"))
    assert (resp.status, resp.message, resp.run_result.status, resp.run_result.return_code) == ("Failed", "", "Finished", 1)
    assert "ZeroDivisionError" in resp.run_result.stderr


def test_timeout_has_no_return_code(call):
    resp = call(py("import time\nprint('started', flush=True)\ntime.sleep(30)", run_timeout=1))
    assert (resp.status, resp.message) == ("Failed", "")
    assert (resp.run_result.status, resp.run_result.return_code) == ("TimeLimitExceeded", None)


def test_run_timeout_zero_times_out_at_once(call):
    """asyncio.wait_for with a timeout <= 0 raises TimeoutError at once: TimeLimitExceeded."""
    resp = call(py("print(1)", run_timeout=0))
    assert (resp.status, resp.run_result.status) == ("Failed", "TimeLimitExceeded")


def test_run_timeout_above_the_ceiling_is_cut_not_refused(call):
    resp = call(py("print('ok')", run_timeout=10_000))
    assert (resp.status, resp.run_result.stdout) == ("Success", "ok\n")


def test_memory_kill_is_finished_minus_9(call):
    """The service's memory ceiling is 64 MB here, so its default limit is 64 MB too."""
    resp = call(py("x = bytearray(512 * 1024 * 1024)\nprint('allocated')"))
    assert (resp.status, resp.message) == ("Failed", "")
    assert (resp.run_result.status, resp.run_result.return_code, resp.run_result.stdout) == ("Finished", -9, "")


def sandbox_fusion_returncode(code: str, workdir) -> int:
    """What SandboxFusion's runner reports for `code` (default config): asyncio's returncode of
    `python main.py` started by `create_subprocess_shell` with bash. Only harmless snippets."""
    (workdir / "main.py").write_text(code)

    async def run() -> int:
        proc = await asyncio.create_subprocess_shell(f"{sys.executable} main.py", cwd=workdir, executable="/bin/bash",
                                                     stdout=asyncio.subprocess.DEVNULL,
                                                     stderr=asyncio.subprocess.DEVNULL)
        return await proc.wait()

    # SandboxFusion's server (uvicorn) handles SIGINT, so its children start with the default
    # action; a test process started in the background of a non-interactive shell inherits SIGINT
    # ignored, and an exec keeps it ignored: give the reference its server's disposition.
    previous = signal.getsignal(signal.SIGINT)
    if previous == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return asyncio.run(run())
    finally:
        signal.signal(signal.SIGINT, previous)


ENDINGS = {
    "exit 0": "print('x')",
    "exit 3": "import sys\nsys.exit(3)",
    "exit 137 (looks like SIGKILL)": "import sys\nsys.exit(137)",
    "exit 139 (looks like SIGSEGV)": "import sys\nsys.exit(139)",
    "exit 152 (looks like SIGXCPU)": "import sys\nsys.exit(152)",
    "exit 200": "import sys\nsys.exit(200)",
    "uncaught exception": "1 / 0",
    "SIGKILL from itself": "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
    "SIGTERM from itself": "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)",
    "segfault": "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)",
    "abort": "import os\nos.abort()",
    "KeyboardInterrupt": "import os, signal\nos.kill(os.getpid(), signal.SIGINT)",
}


@pytest.mark.parametrize("code", ENDINGS.values(), ids=ENDINGS.keys())
def test_every_ending_reports_sandbox_fusions_return_code(call, code, tmp_path):
    """Finished with SandboxFusion's return code, exit status and signal alike (-N for signal N,
    never folded into 128 + N); never Error or TimeLimitExceeded."""
    expected = sandbox_fusion_returncode(code, tmp_path)
    resp = call(py(code))
    assert (resp.run_result.status, resp.run_result.return_code) == ("Finished", expected)
    assert resp.status == ("Success" if expected == 0 else "Failed")


def test_output_cannot_forge_a_sandbox_error(call):
    resp = call(py("import sys\nprint('bwrap: Creating new namespace failed', file=sys.stderr)\nprint('mine')"))
    assert (resp.status, resp.run_result.status, resp.run_result.stdout) == ("Success", "Finished", "mine\n")
    assert resp.run_result.stderr == "bwrap: Creating new namespace failed\n"


def test_empty_code_runs(call):
    resp = call(py(""))
    assert (resp.status, resp.run_result.status, resp.run_result.return_code) == ("Success", "Finished", 0)


def test_stdin(call):
    resp = call(py("print(input()[::-1])", stdin="olleh"))
    assert resp.run_result.stdout == "hello\n"


def test_files_with_null_entries_are_skipped(call):
    resp = call(py("import os\nprint(open('in/data.txt').read(), os.path.exists('gone.txt'))",
                   files={"in/data.txt": b64(b"secret flag"), "gone.txt": None}))
    assert (resp.status, resp.run_result.stdout) == ("Success", "secret flag False\n")


def test_fetch_files_come_back_base64(call):
    resp = call(py("open('flag.txt', 'w').write('this is a secret')", fetch_files=["flag.txt", "missing.txt"]))
    assert resp.status == "Success"
    assert resp.files == {"flag.txt": b64(b"this is a secret")}


def test_fetch_files_come_back_after_a_time_out(call):
    """run_commands reads `fetch_files` after the run whatever its status, a time-out included."""
    resp = call(py("open('flag.txt', 'w').write('partial')\nwhile True: pass", run_timeout=1,
                   fetch_files=["flag.txt"]))
    assert (resp.status, resp.message, resp.run_result.status) == ("Failed", "", "TimeLimitExceeded")
    assert resp.files == {"flag.txt": b64(b"partial")}


def test_a_malformed_request_is_reported_by_the_client_with_the_field(call):
    with pytest.raises(Exception, match=r"code 400: .*'files' key '/etc/x'.*outside the writable dirs"):
        call(py("print(1)", files={"/etc/x": b64(b"x")}))
