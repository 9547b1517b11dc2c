"""Start the service as a subprocess on a free port, for tests, demos and benchmarks.

    with RunningSandbox(backend="local", max_concurrency=4) as sb:
        requests.post(f"{sb.url}/run_code", json={"code": "print(1)", "language": "python"})

A subprocess (not a thread) so that the service's cleanup on SIGTERM is exercised exactly as in
production and a crash in it cannot take the caller down.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Any

from .serve import LISTENING_PREFIX

START_TIMEOUT_S = 120.0


class SandboxStartError(RuntimeError):
    """The service exited or did not print its address in time."""


class RunningSandbox:
    """Context manager: `python -m sandbox.serve --port 0 ...`; `.url` once entered."""

    def __init__(self, backend: str = "local", max_concurrency: int = 4, max_queue: int = 64,
                 extra_args: list[str] | None = None, env: dict[str, str] | None = None,
                 start_timeout: float = START_TIMEOUT_S) -> None:
        self.args = [sys.executable, "-m", "sandbox.serve", "--backend", backend, "--host", "127.0.0.1",
                     "--port", "0", "--max-concurrency", str(max_concurrency), "--max-queue", str(max_queue),
                     *(extra_args or [])]
        self.env = {**os.environ, **(env or {})}
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    def __enter__(self) -> "RunningSandbox":
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, text=True, env=self.env)
        try:
            self.url = self._read_url()
        except BaseException:
            self.stop()
            raise
        return self

    def _read_url(self) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + self.start_timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                    break
                line = self.proc.stdout.readline()
                if not line:
                    raise SandboxStartError(f"sandbox exited with code {self.proc.wait()} before listening "
                                            f"(see its stderr above)")
                if line.startswith(LISTENING_PREFIX):
                    return line[len(LISTENING_PREFIX):].strip()
        raise SandboxStartError(f"sandbox did not listen within {self.start_timeout}s")

    def health(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/health", timeout=10) as resp:
            return json.loads(resp.read())

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (the service then removes its cgroups/containers), SIGKILL if it hangs."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        return self.proc.returncode

    def __exit__(self, *exc: object) -> None:
        self.stop()
