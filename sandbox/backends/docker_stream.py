"""Talking to processes in Docker containers over hijacked attach/exec sockets.

Docker multiplexes a non-TTY process's stdout and stderr on one socket as frames (an 8-byte
header: stream id, 3 pad bytes, big-endian length). `ResidentChannel` holds the socket of a
container's resident runner (`resident_runner.py`) and swaps length-prefixed job/reply frames
with it.
"""

from __future__ import annotations

import json
import logging
import socket
import struct
import time

log = logging.getLogger(__name__)
RUNNER_FRAME = struct.Struct(">I")


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


class ChannelError(RuntimeError):
    """The resident runner hung up or did not answer in time; its container must be replaced.

    `started` says whether the runner had acknowledged the job: if not, the code never ran and
    the job may safely go to another container.
    """

    def __init__(self, message: str, started: bool = False) -> None:
        super().__init__(message)
        self.started = started


class ResidentChannel:
    """One warm container's resident runner: send a job, wait for its reply frame."""

    def __init__(self, sock: socket.socket, name: str) -> None:
        self.sock, self.name = sock, name
        self._demux = StreamDemux()
        self._stdout = b""

    def receive(self, deadline: float) -> dict:
        """The next frame from the runner's stdout, as JSON."""
        return json.loads(self._frame(deadline))

    def _frame(self, deadline: float) -> bytes:
        """The next frame from the runner's stdout; its stderr goes to the log."""
        while len(self._stdout) < 4 or len(self._stdout) < 4 + RUNNER_FRAME.unpack(self._stdout[:4])[0]:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ChannelError(f"runner in {self.name} did not answer in time")
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                raise ChannelError(f"runner in {self.name} did not answer in time") from None
            except OSError as err:
                raise ChannelError(f"runner in {self.name}: {err}") from err
            if not chunk:
                raise ChannelError(f"runner in {self.name} hung up (container died?)")
            for stream, data in self._demux.feed(chunk):
                if stream == 1:
                    self._stdout += data
                else:
                    log.warning("runner in %s: %s", self.name, data.decode(errors="replace").rstrip())
        size = RUNNER_FRAME.unpack(self._stdout[:4])[0]
        frame, self._stdout = self._stdout[4:4 + size], self._stdout[4 + size:]
        return frame

    def _stream(self, deadline: float, cap: int) -> bytes:
        """Frames up to the empty one that ends a stream, joined."""
        chunks, size = [], 0
        while chunk := self._frame(deadline):
            size += len(chunk)
            if size > cap:
                raise ChannelError(f"runner in {self.name} streamed more than {cap} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    def call(self, job: dict, payload: bytes, deadline: float, stream_cap: int = 0) -> dict:
        """Send one job; the runner acknowledges it before it starts, then sends the reply, and the
        fetched files' answer as a stream (bytes under "fetched") when the reply says so."""
        header = json.dumps(job).encode()
        try:
            self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
            self.sock.sendall(RUNNER_FRAME.pack(len(header)) + header + RUNNER_FRAME.pack(len(payload)) + payload)
        except OSError as err:
            raise ChannelError(f"runner in {self.name}: cannot send the job ({err})") from err
        ack = self.receive(deadline)
        if ack.get("accepted") is not True:
            raise ChannelError(f"runner in {self.name} refused the job: {ack.get('unclean', 'out of turn')}")
        try:
            reply = self.receive(deadline)
            if reply.get("fetch_stream"):
                reply["fetched"] = self._stream(deadline, stream_cap)
            return reply
        except ChannelError as err:
            raise ChannelError(str(err), started=True) from err
