"""Start a real server on a free loopback port and stop it: for tests, benchmarks and the demo.

    with RunningServer(ServerConfig(index="idx")) as srv:
        requests.post(srv.url + "/retrieve", json={"queries": ["..."]})

``RunningServer`` runs waitress in a thread of this process (``retriever=`` shares an already
loaded model); ``ServerProcess`` runs ``python -m retriever_server.serve`` in a child process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Any

import requests

from .config import ServerConfig
from .retriever import Retriever
from .serve import LISTEN_PREFIX


class RunningServer:
    """waitress + the Flask app in a background thread, on 127.0.0.1 and a free port."""

    def __init__(self, config: ServerConfig, *, retriever: Retriever | None = None, web: Any = None,
                 host: str = "127.0.0.1", threads: int = 64) -> None:
        self.config, self._retriever, self._web = config, retriever, web
        self.host, self.threads = host, threads
        self.url = ""

    def __enter__(self) -> "RunningServer":
        from waitress import create_server

        from .app import create_app

        self.app = create_app(self.config, retriever=self._retriever, web=self._web)
        self._server = create_server(self.app, host=self.host, port=0, threads=self.threads)
        self.port = int(self._server.effective_port)
        self.url = f"http://{self.host}:{self.port}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="retriever-waitress", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        """waitress's event loop, polled so that stopping needs no cross-thread map surgery."""
        from waitress import wasyncore

        smap = self._server._map
        while not self._stop.is_set():
            wasyncore.loop(timeout=0.05, map=smap, count=1)
        wasyncore.close_all(smap)

    def __exit__(self, *exc: object) -> None:
        from .app import EXTENSION

        self._stop.set()
        self._thread.join(timeout=10)
        self._server.task_dispatcher.shutdown(timeout=5)
        self.app.extensions[EXTENSION].close()


class ServerProcess:
    """``python -m retriever_server.serve ... --port 0`` as a child; reads the bound port."""

    def __init__(self, *args: str, startup_timeout_s: float = 300.0, env: dict[str, str] | None = None) -> None:
        self.args, self.timeout, self.env = list(args), startup_timeout_s, env
        self.url = ""

    def __enter__(self) -> "ServerProcess":
        cmd = [sys.executable, "-m", "retriever_server.serve", "--port", "0", *self.args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(self.env or {})})
        line = self._read_listen_line()
        self.url = line[len(LISTEN_PREFIX):].strip()
        self.port = int(self.url.rsplit(":", 1)[1])
        threading.Thread(target=self._drain, daemon=True).start()
        return self

    def _read_listen_line(self) -> str:
        deadline = time.monotonic() + self.timeout
        assert self.proc.stdout is not None
        result: list[str] = []
        reader = threading.Thread(target=lambda: result.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(max(0.0, deadline - time.monotonic()))
        if not result or not result[0].startswith(LISTEN_PREFIX):
            self.proc.kill()
            err = self.proc.communicate(timeout=10)[1] if self.proc.stderr else ""
            raise RuntimeError(f"retriever server did not start (exit {self.proc.poll()}): {err[-2000:]}")
        return result[0]

    def _drain(self) -> None:  # keep pipes from filling up and blocking the child
        for stream in (self.proc.stdout, self.proc.stderr):
            threading.Thread(target=lambda s=stream: [None for _ in s], daemon=True).start()

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def wait_healthy(url: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """Poll ``/health`` until it answers 200."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            r = requests.get(url + "/health", timeout=5)
            if r.status_code == 200:
                return r.json()
        except requests.RequestException as e:
            last = e
        time.sleep(0.1)
    raise TimeoutError(f"{url}/health did not answer within {timeout_s}s ({last})")
