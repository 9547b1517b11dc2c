"""The `/run_code` contract (a SandboxFusion subset), kept in one place.

Clients written for SandboxFusion (bytedance/SandboxFusion) send the same body and read the same
fields, so this module is the single source of truth for field names, defaults and limits.
Validation lives here too, so every backend receives a request it can trust.
"""

from __future__ import annotations

import base64
import binascii
import posixpath
from dataclasses import dataclass, field
from typing import Any

SUPPORTED_LANGUAGES = ("python",)
DEFAULT_RUN_TIMEOUT_S = 10.0
MAX_RUN_TIMEOUT_S = 60.0
DEFAULT_MEMORY_MB = 512
MIN_MEMORY_MB = 16
MAX_MEMORY_MB = 8192
MAX_CODE_BYTES = 1 << 20
MAX_FILES = 64
MAX_FILES_TOTAL_BYTES = 16 << 20
MAX_STDIN_BYTES = 8 << 20
DEFAULT_MAX_OUTPUT_BYTES = 64 << 10
TRUNCATION_MARKER = "\n...[output truncated by sandbox: {dropped} more bytes]\n"

# SandboxFusion's top-level and run-level statuses.
STATUS_SUCCESS = "Success"
STATUS_FAILED = "Failed"
STATUS_SANDBOX_ERROR = "SandboxError"
RUN_FINISHED = "Finished"
RUN_ERROR = "Error"
RUN_TIMEOUT = "TimeLimitExceeded"
RUN_MEMORY = "MemoryLimitExceeded"


class RequestError(ValueError):
    """A client mistake: answered with HTTP 400 and this message."""


@dataclass(frozen=True)
class RunRequest:
    """A validated execution request; `files` maps a safe relative path to raw bytes."""

    code: str
    stdin: bytes = b""
    run_timeout: float = DEFAULT_RUN_TIMEOUT_S
    memory_limit_mb: int = DEFAULT_MEMORY_MB
    files: dict[str, bytes] = field(default_factory=dict)


@dataclass
class ExecResult:
    """What a backend observed; `status` is one of the RUN_* constants."""

    status: str
    return_code: int | None
    stdout: str
    stderr: str
    execution_time: float
    sandbox_error: str | None = None  # set when the sandbox itself failed, not the code


def _number(payload: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = payload.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(f"'{key}' must be a number, got {value!r}")
    if not low <= value <= high:
        raise RequestError(f"'{key}'={value!r} is out of range [{low}, {high}]")
    return value


def safe_relative_path(path: str) -> str:
    """Normalise a file path from the request; refuse ones that would leave the work dir."""
    if not isinstance(path, str) or not path or "\x00" in path:
        raise RequestError(f"file path {path!r} is not a non-empty string")
    norm = posixpath.normpath(path)
    if norm.startswith("/") or norm == "." or norm.split("/")[0] == "..":
        raise RequestError(f"file path {path!r} must stay inside the work dir")
    if norm == "main.py":
        raise RequestError("file path 'main.py' is reserved for the submitted code")
    return norm


def _decode_files(raw: Any) -> dict[str, bytes]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise RequestError("'files' must be an object {path: base64 content}")
    if len(raw) > MAX_FILES:
        raise RequestError(f"'files' has {len(raw)} entries, at most {MAX_FILES} allowed")
    files: dict[str, bytes] = {}
    for path, content in raw.items():
        if not isinstance(content, str):
            raise RequestError(f"file {path!r}: content must be a base64 string")
        try:
            files[safe_relative_path(path)] = base64.b64decode(content, validate=True)
        except binascii.Error as err:
            raise RequestError(f"file {path!r}: invalid base64 ({err})") from None
    if sum(len(v) for v in files.values()) > MAX_FILES_TOTAL_BYTES:
        raise RequestError(f"'files' exceed {MAX_FILES_TOTAL_BYTES} bytes in total")
    return files


def parse_run_request(payload: Any) -> RunRequest:
    """Turn a decoded JSON body into a RunRequest or raise RequestError naming the bad field."""
    if not isinstance(payload, dict):
        raise RequestError("body must be a JSON object")
    code = payload.get("code")
    if not isinstance(code, str) or not code.strip():
        raise RequestError("'code' is required and must be a non-empty string")
    if len(code.encode()) > MAX_CODE_BYTES:
        raise RequestError(f"'code' exceeds {MAX_CODE_BYTES} bytes")
    language = payload.get("language", "python")
    if language not in SUPPORTED_LANGUAGES:
        raise RequestError(f"unsupported language {language!r}; supported: {list(SUPPORTED_LANGUAGES)}")
    stdin = payload.get("stdin") or ""
    if not isinstance(stdin, str):
        raise RequestError("'stdin' must be a string")
    stdin_bytes = stdin.encode()
    if len(stdin_bytes) > MAX_STDIN_BYTES:
        raise RequestError(f"'stdin' exceeds {MAX_STDIN_BYTES} bytes")
    timeout = _number(payload, "run_timeout", DEFAULT_RUN_TIMEOUT_S, 0.001, MAX_RUN_TIMEOUT_S)
    memory = payload.get("memory_limit_MB", DEFAULT_MEMORY_MB)
    if memory is None or memory == -1:  # SandboxFusion's "no explicit limit" -> our default
        memory = DEFAULT_MEMORY_MB
    memory = _number({"memory_limit_MB": memory}, "memory_limit_MB", DEFAULT_MEMORY_MB,
                     MIN_MEMORY_MB, MAX_MEMORY_MB)
    return RunRequest(code=code, stdin=stdin_bytes, run_timeout=float(timeout),
                      memory_limit_mb=int(memory), files=_decode_files(payload.get("files")))


def to_response(result: ExecResult) -> dict[str, Any]:
    """Build SandboxFusion's response body from a backend result."""
    if result.sandbox_error is not None:
        return {"status": STATUS_SANDBOX_ERROR, "message": result.sandbox_error,
                "compile_result": None, "run_result": None, "files": {}}
    ok = result.status == RUN_FINISHED and result.return_code == 0
    return {
        "status": STATUS_SUCCESS if ok else STATUS_FAILED,
        "message": "" if ok else f"run ended with {result.status} (return code {result.return_code})",
        "compile_result": None,
        "run_result": {
            "status": result.status,
            "execution_time": round(result.execution_time, 4),
            "return_code": result.return_code,
            "stdout": result.stdout,
            "stderr": result.stderr,
        },
        "files": {},
    }
