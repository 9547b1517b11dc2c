"""Run the sandbox service as a child process on a free port, and stop it: what a single-machine
run (the demo, eval, the local trainer) and the benchmark use.

    with SandboxProcess(backend="local", max_concurrency=4) as sb:
        requests.post(f"{sb.url}/run_code", json={"code": "print(1)", "language": "python"})

A child process, not a thread: the service drains and removes its cgroups on SIGTERM exactly as
in production, and a crash in it cannot take the caller down.
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

from .serve import DRAIN_SLACK_S, EXIT_ENVIRONMENT, LISTENING_PREFIX

START_TIMEOUT_S = 120.0


class SandboxStartError(RuntimeError):
    """The service exited or did not print its address in time.

    `environment_missing` is true when it refused to start because the host lacks what the backend
    needs (exit status 3: no bubblewrap, cgroups, Docker engine or image); any other failure is a
    fault of the service itself.
    """

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.environment_missing = exit_code == EXIT_ENVIRONMENT


class SandboxProcess:
    """Context manager: `python -m sandbox.serve --port 0 ...`; `.url` once entered."""

    def __init__(self, backend: str = "local", max_concurrency: int = 4, max_queue: int = 64,
                 extra_args: list[str] | None = None, env: dict[str, str] | None = None,
                 start_timeout: float = START_TIMEOUT_S, stderr: Any = None) -> None:
        """``stderr``: where the service's log goes (a file or ``subprocess.PIPE``; None: ours)."""
        self.args = [sys.executable, "-m", "sandbox.serve", "--backend", backend, "--host", "127.0.0.1",
                     "--port", "0", "--max-concurrency", str(max_concurrency), "--max-queue", str(max_queue),
                     *(extra_args or [])]
        self.env = {**os.environ, **(env or {})}
        self.start_timeout = start_timeout
        self.stderr = stderr
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self) -> str:
        """Start the service and wait until it listens; returns its base URL."""
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=self.stderr, text=True,
                                     env=self.env)
        try:
            self.url = self._read_url()
        except BaseException:
            self.stop()
            raise
        return self.url

    def __enter__(self) -> SandboxProcess:
        self.start()
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
                    code = self.proc.wait()
                    raise SandboxStartError(f"sandbox exited with code {code} before listening "
                                            f"(see its stderr above)", code)
                if line.startswith(LISTENING_PREFIX):
                    return line[len(LISTENING_PREFIX):].strip()
        raise SandboxStartError(f"sandbox did not listen within {self.start_timeout}s")

    def health(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/health", timeout=10) as resp:
            return json.loads(resp.read())

    def stop(self, timeout: float = 60.0 + DRAIN_SLACK_S) -> int | None:
        """SIGTERM (the service drains, then removes its cgroups/containers), SIGKILL if it hangs."""
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
