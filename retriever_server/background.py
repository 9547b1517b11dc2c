"""Run the retriever in the background and stop it cleanly: what the serve CLI, the single-machine
runner (demo, eval) and the benchmarks start.

    with RunningServer(ServerConfig(index="idx")) as srv:          # waitress in a thread of this process
        requests.post(srv.url + "/retrieve", json={"queries": ["..."]})
    with ServerProcess("--index", "idx") as srv:                   # python -m retriever_server.serve
        print(srv.url)

``RunningServer(retriever=...)`` shares an already loaded model. Leaving either context stops
accepting, lets in-flight requests finish (``--drain-s``) and closes every connection.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import deque
from typing import Any

from .config import ServerConfig
from .retriever import Retriever

LISTEN_PREFIX = "retriever_server listening on "
STOP_MARGIN_S = 10.0  # beyond --drain-s, for closing the app and the sockets
STDERR_LINES = 200


class RunningServer:
    """The app on waitress (:mod:`retriever_server.http_server`) in a background thread."""

    def __init__(self, config: ServerConfig, *, retriever: Retriever | None = None, web: Any = None,
                 host: str = "127.0.0.1", port: int = 0) -> None:
        self.config, self._retriever, self._web = config, retriever, web
        self.host, self.port = host, port
        self.url = ""

    def start(self) -> RunningServer:
        from .app import create_app
        from .auth import check_bind
        from .http_server import HttpServer

        check_bind(self.host, self.config.auth_token, self.config.no_auth)  # before loading anything
        self.app = create_app(self.config, retriever=self._retriever, web=self._web)
        try:
            self._http = HttpServer(self.app, self.host, self.port, self.config.http)
        except Exception:
            self._close_app()
            raise
        self.port = self._http.port
        self.url = f"http://{self.host}:{self.port}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="retriever-http", daemon=True)
        self._thread.start()
        return self

    def _close_app(self) -> None:
        from .app import EXTENSION

        self.app.extensions[EXTENSION].close()

    def _run(self) -> None:
        try:
            self._http.serve(self._stop)
        finally:
            self._close_app()  # requests still waiting on the batcher fail with 503 ...
            self._http.close()  # ... which is sent before the sockets close

    def stop(self) -> None:
        """Stop accepting, let in-flight requests finish (``--drain-s``), close everything."""
        self._stop.set()
        self._thread.join(timeout=self.config.http.drain_s + STOP_MARGIN_S)

    def __enter__(self) -> RunningServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ServerProcess:
    """``python -m retriever_server.serve ... --port 0`` as a child; reads the bound port."""

    def __init__(self, *args: str, startup_timeout_s: float = 300.0,
                 env: dict[str, str] | None = None) -> None:
        self.args, self.timeout, self.env = list(args), startup_timeout_s, env
        self.url = ""

    def __enter__(self) -> ServerProcess:
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

    def _drain(self) -> None:
        """Read the pipes so they never fill up and block the child; keep stderr's last lines."""
        self._stderr: deque[str] = deque(maxlen=STDERR_LINES)
        self._readers = [threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True),
                         threading.Thread(target=lambda: self._stderr.extend(self.proc.stderr), daemon=True)]
        for t in self._readers:
            t.start()

    def stderr_text(self) -> str:
        """The child's last stderr lines (all of them once it has exited)."""
        if self.proc.poll() is not None:
            self._readers[1].join(timeout=5)
        return "".join(self._stderr)

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM (the server drains), then SIGKILL if it has not exited in ``timeout_s``."""
        self.proc.terminate()
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=10)

    def __exit__(self, *exc: object) -> None:
        self.stop()
