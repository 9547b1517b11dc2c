"""A fake Serper for the web-search tests.

``FakeSerper`` is a real HTTP server on loopback that answers like Serper's ``POST /search``:
it replays given Serper responses by query, checks ``X-API-KEY`` and can be told to fail, so
``/search`` and the agent's web backend are tested over real sockets without the internet.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeSerper:
    """``with FakeSerper(responses) as f: SerperClient(key, url=f.url)``.

    ``responses`` maps a query to Serper's answer for it (``organic`` is cut to the ``num``
    asked for, as Serper does); other queries get an answer with no results. ``fail_with`` is a
    list of statuses answered, in order, before answering normally; ``calls`` and ``keys``
    record what arrived.
    """

    def __init__(self, responses: dict[str, dict[str, Any]] | None = None, api_key: str = "test-key") -> None:
        self.responses, self.api_key = dict(responses or {}), api_key
        self.fail_with: list[int] = []
        self.calls: list[dict[str, Any]] = []
        self.keys: list[str] = []
        self._lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/search"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def answer(self, body: dict[str, Any], key: str) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.calls.append(body)
            self.keys.append(key)
            if self.fail_with:
                return self.fail_with.pop(0), {"message": "forced failure"}
        if key != self.api_key:
            return 403, {"message": "Unauthorized.", "statusCode": 403}
        q, num = str(body.get("q", "")), int(body.get("num", 10))
        data = json.loads(json.dumps(self.responses.get(q) or {"searchParameters": {"q": q}, "organic": []}))
        data["organic"] = data.get("organic", [])[:num]
        return 200, data

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                status, payload = fake.answer(body, self.headers.get("X-API-KEY", ""))
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Retry-After", "0")
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        return Handler

    def __enter__(self) -> FakeSerper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
