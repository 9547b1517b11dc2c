"""Raw-socket HTTP for the tests of the two waitress layers (retriever and sandbox): what a
hostile or broken client sends is written byte for byte, and the answer read back the same way."""

from __future__ import annotations

import socket


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 response (Content-Length framed) from a raw socket: (status, headers, body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a complete response: {data[:200]!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    while len(body) < int(headers.get("content-length", 0)):
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed inside the body ({len(body)} of {headers['content-length']} bytes)")
        body += chunk
    return int(lines[0].split()[1]), headers, body
