"""Talking to a container's resident runner over the hijacked attach socket.

Docker multiplexes a non-TTY process's stdout and stderr on one socket as frames (an 8-byte
header: stream id, 3 pad bytes, big-endian length). `SocketChannel` splits them: stdout carries
the runner's frames (channel.py), stderr goes to the log.
"""

from __future__ import annotations

import logging
import socket
import struct
import time

from .channel import ChannelError, ResidentChannel

log = logging.getLogger(__name__)


class StreamDemux:
    """Splits Docker's multiplexed byte stream into (stream id, payload) pieces."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, chunk: bytes) -> list[tuple[int, bytes]]:
        self._pending += chunk
        out = []
        while len(self._pending) >= 8:
            stream, size = struct.unpack(">BxxxL", self._pending[:8])
            if len(self._pending) < 8 + size:
                break
            out.append((stream, self._pending[8:8 + size]))
            self._pending = self._pending[8 + size:]
        return out


class SocketChannel(ResidentChannel):
    """One warm container's resident runner, on the container's attach socket."""

    def __init__(self, sock: socket.socket, name: str) -> None:
        super().__init__(name)
        self.sock = sock
        self._demux = StreamDemux()

    def _send(self, data: bytes, deadline: float) -> None:
        try:
            self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
            self.sock.sendall(data)
        except OSError as err:
            raise ChannelError(f"runner in {self.name}: cannot send the job ({err})") from err

    def _more(self, deadline: float) -> bytes:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._late()
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                raise self._late() from None
            except OSError as err:
                raise ChannelError(f"runner in {self.name}: {err}") from err
            if not chunk:
                raise ChannelError(f"runner in {self.name} hung up (container died?)")
            out = b""
            for stream, data in self._demux.feed(chunk):
                if stream == 1:
                    out += data
                else:
                    log.warning("runner in %s: %s", self.name, data.decode(errors="replace").rstrip())
            if out:
                return out

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
