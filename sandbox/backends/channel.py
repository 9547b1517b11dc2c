"""Frames to and from a resident runner (resident_runner.py), whatever carries its stdin and stdout.

The runner speaks length-prefixed frames (>I length + bytes). The local backend reaches it through
the pipes of its bwrap process (`PipeChannel`, here); the Docker backend through the container's
attach socket, where the engine multiplexes stdout and stderr (`docker_stream.SocketChannel`).
Both only differ in how bytes move; the job/acknowledgement/reply exchange is this module's.
"""

from __future__ import annotations

import abc
import json
import logging
import os
import select
import struct
import time

log = logging.getLogger(__name__)
FRAME = struct.Struct(">I")
_CHUNK = 1 << 16


class ChannelError(RuntimeError):
    """The resident runner hung up or did not answer in time; its sandbox must be replaced.

    `started` says whether the runner had acknowledged the job: if not, the code never ran and the
    job may safely go to another sandbox. `timed_out` says the deadline passed (the runner is
    alive but silent) rather than that it hung up.
    """

    def __init__(self, message: str, started: bool = False, timed_out: bool = False) -> None:
        super().__init__(message)
        self.started = started
        self.timed_out = timed_out


class ResidentChannel(abc.ABC):
    """One warm sandbox's runner: send a job, wait for its acknowledgement and its reply."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._stdout = b""
        self.stderr_tail = ""  # the end of what the runner (or what started it) wrote on stderr
        self.owed = False  # after a run, the runner owes a frame saying whether its sandbox is clean

    @abc.abstractmethod
    def _send(self, data: bytes, deadline: float) -> None:
        """Write all of `data` to the runner's stdin (ChannelError if it cannot by `deadline`)."""

    @abc.abstractmethod
    def _more(self, deadline: float) -> bytes:
        """More of the runner's stdout, logging its stderr (ChannelError on hang-up or at `deadline`)."""

    def close(self) -> None:
        """Hang up: the runner reads end-of-file and exits, ending its sandbox."""

    def _late(self) -> ChannelError:
        return ChannelError(f"runner in {self.name} did not answer in time", timed_out=True)

    def receive(self, deadline: float) -> dict:
        """The next frame from the runner's stdout, as JSON."""
        return json.loads(self._frame(deadline))

    def _frame(self, deadline: float) -> bytes:
        while len(self._stdout) < 4 or len(self._stdout) < 4 + FRAME.unpack(self._stdout[:4])[0]:
            self._stdout += self._more(deadline)
        size = FRAME.unpack(self._stdout[:4])[0]
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

    def settle(self, deadline: float) -> str:
        """Wait until the runner has wiped its sandbox after the last run: "" if it is clean again,
        else why not (then the sandbox must be replaced)."""
        if not self.owed:
            return ""
        doc = self.receive(deadline)
        self.owed = False
        return "" if doc.get("clean") is True else str(doc.get("unclean") or f"unexpected frame {doc}")

    def call(self, job: dict, payload: bytes, deadline: float, stream_cap: int = 0) -> dict:
        """Send one job (once the sandbox is clean again after the last one); the runner
        acknowledges it before it starts, then sends the reply, and the fetched files' answer as
        a stream (bytes under "fetched") when the reply says so."""
        unclean = self.settle(deadline)
        if unclean:
            raise ChannelError(f"runner in {self.name}: its sandbox is not clean ({unclean})")
        header = json.dumps(job).encode()
        self._send(FRAME.pack(len(header)) + header + FRAME.pack(len(payload)) + payload, deadline)
        ack = self.receive(deadline)
        if ack.get("accepted") is not True:
            raise ChannelError(f"runner in {self.name} refused the job: {ack.get('unclean', 'out of turn')}")
        try:
            reply = self.receive(deadline)
            if reply.get("fetch_stream"):
                reply["fetched"] = self._stream(deadline, stream_cap)
            self.owed = True
            return reply
        except ChannelError as err:
            raise ChannelError(str(err), started=True, timed_out=err.timed_out) from err


class PipeChannel(ResidentChannel):
    """The runner's stdin, stdout and stderr as pipes of a local process (this side owns the fds)."""

    def __init__(self, stdin: int, stdout: int, stderr: int, name: str) -> None:
        super().__init__(name)
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        os.set_blocking(stdin, False)  # a stuck runner must not hold a writer past its deadline
        self._poll = select.poll()
        self._poll.register(stdout, select.POLLIN)
        self._poll.register(stderr, select.POLLIN)

    def _wait(self, deadline: float) -> list[tuple[int, int]]:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise self._late()
        events = self._poll.poll(remaining * 1000)
        if not events:
            raise self._late()
        return events

    def _send(self, data: bytes, deadline: float) -> None:
        view = memoryview(data)
        writer = select.poll()
        writer.register(self.stdin, select.POLLOUT)
        while view:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not writer.poll(remaining * 1000):
                raise ChannelError(f"runner in {self.name} took no job in time")
            try:
                view = view[os.write(self.stdin, view[:_CHUNK]):]
            except BlockingIOError:
                continue
            except OSError as err:  # EPIPE: the runner is gone
                raise ChannelError(f"runner in {self.name}: cannot send the job ({err})") from err

    def _more(self, deadline: float) -> bytes:
        while True:
            for fd, _ in self._wait(deadline):
                chunk = os.read(fd, _CHUNK)
                if fd == self.stdout:
                    if not chunk:
                        last = self.drain_stderr().strip()[-500:]
                        raise ChannelError(f"runner in {self.name} hung up (its sandbox ended)"
                                           + (f"; its last words: {last}" if last else ""))
                    return chunk
                if chunk:
                    self._note(chunk)
                else:
                    self._poll.unregister(self.stderr)

    def _note(self, chunk: bytes) -> None:
        text = chunk.decode(errors="replace")
        self.stderr_tail = (self.stderr_tail + text)[-4096:]
        log.warning("runner in %s: %s", self.name, text.rstrip())

    def drain_stderr(self) -> str:
        """What is left to read on stderr once the process ended (why a sandbox did not start)."""
        os.set_blocking(self.stderr, False)
        try:
            while chunk := os.read(self.stderr, _CHUNK):
                self._note(chunk)
        except OSError:
            pass
        return self.stderr_tail

    def close(self) -> None:
        for fd in (self.stdin, self.stdout, self.stderr):
            try:
                os.close(fd)
            except OSError:
                pass
