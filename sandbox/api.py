"""The `/run_code` contract: SandboxFusion's request and response schema, kept in one place.

Clients written for SandboxFusion (bytedance/SandboxFusion, its PyPI client `sandbox-fusion`)
send the same body and read the same fields. The schema restated here is SandboxFusion's
`RunCodeRequest`/`RunCodeResponse` (sandbox/server/sandbox_api.py) and its `CommandRunStatus`
(sandbox/runners/types.py): run statuses are only `Finished`, `Error` and `TimeLimitExceeded`,
top-level ones only `Success`, `Failed` and `SandboxError`. Validation lives here too, so every
backend receives a request it can trust, and a client mistake becomes a 400 naming the field.
"""

from __future__ import annotations

import base64
import binascii
import enum
import math
import posixpath
import signal
from dataclasses import dataclass, field
from typing import Any

SUPPORTED_LANGUAGES = ("python",)
WORKDIR = "/work"  # the program's cwd; it runs as /work/main.py
SCRIPT = f"{WORKDIR}/main.py"
WRITABLE_DIRS = (WORKDIR, "/tmp")  # where `files` may be written (size-capped tmpfs in every backend)
DEFAULT_RUN_TIMEOUT_S = 10.0  # SandboxFusion's default
DEFAULT_MAX_RUN_TIMEOUT_S = 60.0  # operator ceiling (--max-run-timeout-s); longer requests are cut to it
MIN_RUN_TIMEOUT_S = 0.001  # SandboxFusion answers run_timeout <= 0 with TimeLimitExceeded: so do we
DEFAULT_MEMORY_MB = 512  # used when memory_limit_MB is absent or <= 0 (SandboxFusion: -1 = "no limit")
DEFAULT_MAX_MEMORY_MB = 8192  # operator ceiling (--max-memory-mb)
MIN_MEMORY_MB = 32  # room for the interpreter and, in Docker, the container's pid 1; smaller requests get this
MAX_FILES = 64  # files per request, written into the sandbox by its runner
MAX_FETCH_FILES = 64
MAX_FETCH_BYTES = 16 << 20  # total fetched bytes per run; files past it are omitted and named in `message`
NAME_MAX = 255  # bytes per path component (Linux)
PATH_MAX = 4095  # bytes per absolute path (Linux, without the NUL)
DEFAULT_MAX_OUTPUT_BYTES = 64 << 10
TRUNCATION_MARKER = "\n...[output truncated by sandbox: {dropped} more bytes]\n"

# SandboxFusion's RunStatus and CommandRunStatus values: the only ones its client accepts.
STATUS_SUCCESS = "Success"
STATUS_FAILED = "Failed"
STATUS_SANDBOX_ERROR = "SandboxError"
RUN_FINISHED = "Finished"
RUN_ERROR = "Error"
RUN_TIMEOUT = "TimeLimitExceeded"


class Outcome(str, enum.Enum):
    """How a run ended, decided only from what the service itself saw (never from the program's output)."""

    FINISHED = "finished"  # it ended on its own; return_code is its exit status
    TIMEOUT = "timeout"  # the service killed it at its run_timeout
    MEMORY = "memory"  # the kernel killed it at the memory limit (the cgroup's oom_kill counter grew)
    SANDBOX_ERROR = "sandbox_error"  # the sandbox failed before the program ran (or lost it)


class RequestError(ValueError):
    """A client mistake: answered with HTTP 400 and this message."""


@dataclass(frozen=True)
class RequestLimits:
    """The operator's ceilings (serve flags); requests beyond them are cut down, never refused."""

    max_run_timeout_s: float = DEFAULT_MAX_RUN_TIMEOUT_S
    default_memory_mb: int = DEFAULT_MEMORY_MB
    max_memory_mb: int = DEFAULT_MAX_MEMORY_MB


@dataclass(frozen=True)
class RunRequest:
    """A validated execution request; `files` maps an absolute path under WRITABLE_DIRS to raw bytes."""

    code: str
    stdin: bytes = b""
    run_timeout: float = DEFAULT_RUN_TIMEOUT_S
    memory_limit_mb: int = DEFAULT_MEMORY_MB
    files: dict[str, bytes] = field(default_factory=dict)
    fetch_files: tuple[str, ...] = ()  # as the client wrote them (the keys of the answer's `files`)


@dataclass
class ExecResult:
    """What a backend observed."""

    outcome: Outcome
    return_code: int | None  # the exit status; -N for a death by signal N, as asyncio (SandboxFusion) reports it
    stdout: str
    stderr: str
    execution_time: float
    sandbox_error: str | None = None  # set with Outcome.SANDBOX_ERROR: what failed
    files: dict[str, str] = field(default_factory=dict)  # fetched files, base64
    notes: list[str] = field(default_factory=list)  # e.g. fetched files omitted over the cap


def _kind(value: Any) -> str:
    """A value's JSON type for messages (never its repr: it may be deeply nested or huge)."""
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "an array",
             dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _text(value: Any, label: str) -> str:
    """A str that encodes to UTF-8 (JSON may carry lone surrogates such as "\\ud800")."""
    if not isinstance(value, str):
        raise RequestError(f"{label} must be a string, got {_kind(value)}")
    try:
        value.encode()
    except UnicodeEncodeError as err:
        raise RequestError(f"{label} is not valid Unicode (lone surrogate at index {err.start})") from None
    return value


def _number(payload: dict[str, Any], key: str, default: float) -> float:
    value = payload.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(f"'{key}' must be a number, got {_kind(value)}")
    if isinstance(value, float) and math.isnan(value):
        raise RequestError(f"'{key}' must be a number, got NaN")
    return value


def _integer(payload: dict[str, Any], key: str, default: int) -> int:
    """An integral number. A JSON integer of any size stays a Python int (never converted to float:
    10**309 would overflow it); a float must be finite and integral (SandboxFusion's pydantic
    `int` takes 512.0 too)."""
    value = _number(payload, key, default)
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise RequestError(f"'{key}' must be an integer, got {value}")
        return int(value)
    return value


def sandbox_path(path: Any, label: str) -> str:
    """Absolute, normalised path of a request file name (relative ones are under WORKDIR), as
    SandboxFusion resolves them against its temporary dir."""
    path = _text(path, label)
    if not path or "\x00" in path:
        raise RequestError(f"{label}: a file name must be non-empty and contain no NUL byte")
    norm = posixpath.normpath(posixpath.join(WORKDIR, path))
    if norm.startswith("//"):
        norm = norm[1:]
    if len(norm.encode()) > PATH_MAX:
        raise RequestError(f"{label}: the path is {len(norm.encode())} bytes long, at most {PATH_MAX} allowed")
    longest = max(norm.split("/"), key=lambda part: len(part.encode()))
    if len(longest.encode()) > NAME_MAX:
        raise RequestError(f"{label}: a path component is {len(longest.encode())} bytes long, at most {NAME_MAX}")
    return norm


def _show(path: str) -> str:
    """A path for a message, cut short (a request may send one 4 KB long)."""
    return repr(path if len(path) <= 80 else path[:77] + "...")


def _upload_path(path: str) -> str:
    norm = sandbox_path(path, f"'files' key {_show(path)}")
    if not any(norm.startswith(d + "/") for d in WRITABLE_DIRS):
        raise RequestError(f"'files' key {_show(path)} resolves to {_show(norm)}, outside the writable dirs "
                           f"{' and '.join(WRITABLE_DIRS)}")
    if norm == SCRIPT:
        raise RequestError(f"'files' key {_show(path)} is {SCRIPT}, which holds the submitted code")
    return norm


def _decode_files(raw: Any) -> dict[str, bytes]:
    """SandboxFusion's `files`: {path: base64 or null}; null entries are skipped, as its runner does."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise RequestError(f"'files' must be an object {{path: base64 content}}, got {_kind(raw)}")
    entries = {path: content for path, content in raw.items() if content is not None}
    if len(entries) > MAX_FILES:
        raise RequestError(f"'files' has {len(entries)} entries, at most {MAX_FILES} allowed")
    files: dict[str, bytes] = {}
    for path, content in entries.items():
        norm = _upload_path(path)
        if not isinstance(content, str):
            raise RequestError(f"'files' entry {_show(norm)} must be a base64 string or null, got {_kind(content)}")
        try:
            # validate=False skips non-alphabet bytes (MIME line breaks), as SandboxFusion's b64decode does
            files[norm] = base64.b64decode(content.encode("ascii"))
        except UnicodeEncodeError as err:
            raise RequestError(f"'files' entry {_show(norm)} is not base64: non-ASCII character at index "
                               f"{err.start}") from None
        except binascii.Error as err:
            raise RequestError(f"'files' entry {_show(norm)} is not valid base64 ({err})") from None
    paths = set(files)
    for path in files:
        parent = posixpath.dirname(path)
        while parent not in ("/", ""):
            if parent in paths:
                raise RequestError(f"'files' has both {_show(parent)} and {_show(path)}: one cannot be a file "
                                   "and a directory")
            parent = posixpath.dirname(parent)
    return files


def _fetch_list(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise RequestError(f"'fetch_files' must be an array of file paths, got {_kind(raw)}")
    if len(raw) > MAX_FETCH_FILES:
        raise RequestError(f"'fetch_files' has {len(raw)} entries, at most {MAX_FETCH_FILES} allowed")
    for i, name in enumerate(raw):
        sandbox_path(name, f"'fetch_files'[{i}]")
    return tuple(dict.fromkeys(raw))


def parse_run_request(payload: Any, limits: RequestLimits = RequestLimits()) -> RunRequest:
    """Turn a decoded JSON body into a RunRequest or raise RequestError naming the bad field.

    Accepts SandboxFusion's RunCodeRequest: `code` (may be empty), `language`, `stdin` (string or
    null), `run_timeout` and `compile_timeout` (numbers; a run_timeout <= 0 times out at once, as
    there), `memory_limit_MB` (<= 0: the service's default), `files` (null values skipped) and
    `fetch_files`. Unknown fields are ignored, as pydantic does. Timeouts and memory beyond the
    operator's ceilings are cut to them.
    """
    if not isinstance(payload, dict):
        raise RequestError(f"the body must be a JSON object, got {_kind(payload)}")
    if "code" not in payload:
        raise RequestError("'code' is required")
    code = _text(payload["code"], "'code'")
    language = payload.get("language", "python")
    if language not in SUPPORTED_LANGUAGES:
        shown = repr(language) if isinstance(language, str) and len(language) < 40 else _kind(language)
        raise RequestError(f"'language' {shown} is not supported here; supported: {list(SUPPORTED_LANGUAGES)}")
    stdin = payload.get("stdin")
    stdin_bytes = b"" if stdin is None else _text(stdin, "'stdin'").encode()
    _number(payload, "compile_timeout", 10.0)  # Python has no compile step; checked, then unused
    timeout = _number(payload, "run_timeout", DEFAULT_RUN_TIMEOUT_S)
    timeout = min(max(timeout, MIN_RUN_TIMEOUT_S), limits.max_run_timeout_s)
    memory = _integer(payload, "memory_limit_MB", -1)
    memory = limits.default_memory_mb if memory <= 0 else min(max(memory, MIN_MEMORY_MB), limits.max_memory_mb)
    return RunRequest(code=code, stdin=stdin_bytes, run_timeout=float(timeout), memory_limit_mb=int(memory),
                      files=_decode_files(payload.get("files")), fetch_files=_fetch_list(payload.get("fetch_files")))


def _command_result(status: str, result: ExecResult, return_code: int | None) -> dict[str, Any]:
    return {"status": status, "execution_time": round(result.execution_time, 4), "return_code": return_code,
            "stdout": result.stdout, "stderr": result.stderr}


def to_response(result: ExecResult) -> dict[str, Any]:
    """SandboxFusion's RunCodeResponse for a backend result, with the values SandboxFusion reports.

    Its runner (sandbox/runners/base.py, run_command_bare) answers a process that ended within the
    timeout `Finished` with its return code, whatever the code; a time-out `TimeLimitExceeded` with
    no return code; a failure of the sandbox itself `Error`, which sandbox_api.parse_run_status
    turns into a top-level `SandboxError` whose message is that error. A memory kill there is the
    cgroup's SIGKILL, seen as `Finished` with return code -9 (asyncio's sign for a signal).
    """
    base = {"compile_result": None, "executor_pod_name": None}
    if result.outcome is Outcome.SANDBOX_ERROR:
        message = result.sandbox_error or "sandbox failure"
        return {**base, "status": STATUS_SANDBOX_ERROR, "message": message, "files": {},
                "run_result": {"status": RUN_ERROR, "execution_time": None, "return_code": None,
                               "stdout": None, "stderr": message}}
    if result.outcome is Outcome.TIMEOUT:
        run = _command_result(RUN_TIMEOUT, result, None)
    elif result.outcome is Outcome.MEMORY:
        run = _command_result(RUN_FINISHED, result, -signal.SIGKILL)
    else:
        run = _command_result(RUN_FINISHED, result, result.return_code)
    ok = run["status"] == RUN_FINISHED and run["return_code"] == 0
    return {**base, "status": STATUS_SUCCESS if ok else STATUS_FAILED, "message": "; ".join(result.notes),
            "run_result": run, "files": dict(result.files)}
